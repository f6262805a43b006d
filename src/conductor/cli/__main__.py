"""``python -m conductor.cli`` runs the command line (as ``accelerate launch -m
conductor.cli train ...`` does)."""

from .app import main

main()
