"""``python -m modbridge`` runs the CLI."""

from modbridge.cli.main import main

main()
