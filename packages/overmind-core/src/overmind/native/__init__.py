"""Zero-copy storages and the tensor rebuild, compiled and in Python: the extension ``overmind.native._C``
(``csrc/``) and its pure-Python twins."""
