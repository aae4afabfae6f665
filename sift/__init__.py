"""sift: the storage core of a URL-fetching service."""

__version__ = "0.1.0"
