"""The `modbridge` command line."""
