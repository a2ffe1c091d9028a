"""The version of overmind-core, in a module of its own so that any module can read it without importing the
package facade (``overmind/__init__.py`` imports the load path on first use)."""
__version__ = "0.1.0"
