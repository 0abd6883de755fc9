"""The release of this package, readable without importing anything else of it."""

__version__ = "0.1.0"
