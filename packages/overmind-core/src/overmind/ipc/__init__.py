"""What the processes of one user share to talk: the runtime directory, the frame codec (length, JSON, file
descriptors) and the credentials of the process at the other end.
"""
