"""The machinery that runs adapters: the hook contract and its calls, discovery, patching with its registry of
originals, import watching, the libraries each adapter instruments.
"""
