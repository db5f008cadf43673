"""``python -m rankstream`` runs the CLI (used by ``rankstream up`` to start the materializer)."""

from rankstream.cli import main

main()
