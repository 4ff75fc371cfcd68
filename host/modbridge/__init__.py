"""modbridge: host bridge between GPU servers and their cooling modules."""

__version__ = "0.1.0"
