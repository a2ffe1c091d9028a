"""The client of the cache server: connect to it (or start it), send requests, every wait bounded.
"""
