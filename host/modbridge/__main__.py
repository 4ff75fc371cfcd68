"""``python -m modbridge`` runs the CLI."""

from modbridge.cli import main

main()
