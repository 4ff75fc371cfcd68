"""CLI: `modbridge doctor` (see issue 12). Thin over modbridge.ops."""


def register(group):
    """Add this module's commands to the CLI group (none yet)."""
