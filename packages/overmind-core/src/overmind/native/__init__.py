"""Zero-copy storages and the tensor rebuild: the compiled extension ``overmind.native._C`` (``csrc/``) and its pure-
Python twins.
"""
