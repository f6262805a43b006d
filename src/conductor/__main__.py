"""``python -m conductor`` runs the command line."""

from .cli import main

main()
