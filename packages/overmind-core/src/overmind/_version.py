"""``__version__`` of overmind-core, in a leaf module so that any module can read it without importing the package
facade (``overmind/__init__.py`` imports the load path on first use)."""
__version__ = "0.1.0"
