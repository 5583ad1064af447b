"""The alpa_pass version (one place; ``alpa_pass.__version__`` re-exports it)."""
__version__ = "0.1.0"
