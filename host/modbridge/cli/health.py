"""CLI: ``modbridge healthcheck`` (docs/schedulers.md). Placeholder: filled in by the
scheduler work (issue 13)."""

from __future__ import annotations


def register(group):
    """Add ``healthcheck`` to the CLI group."""
