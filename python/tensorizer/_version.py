"""The tensorizer API version this package mirrors."""

__version__ = "2.12.1"
