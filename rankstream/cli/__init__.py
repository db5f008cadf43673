"""The ``rankstream`` command line (see ``app`` for what every command shares)."""

from __future__ import annotations

import sys

import typer

from rankstream.cli import analysis, data, demo, diagnosis, run, services  # noqa: F401  (they register the commands)
from rankstream.cli.app import app, errors, hoist_global_options
from rankstream.schemas.errors import RankstreamError

__all__ = ["main", "app"]


def main(argv: list[str] | None = None) -> None:
    args = hoist_global_options(sys.argv[1:] if argv is None else argv)
    try:
        code = app(args=args, prog_name="rankstream", standalone_mode=False)
    except RankstreamError as exc:
        errors.print(f"rankstream: error: {exc}", markup=False, highlight=False, soft_wrap=True)  # one line
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        errors.print("rankstream: interrupted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # usage errors (typer vendors click: these are not click's own classes)
        if not hasattr(exc, "show"):
            raise
        exc.show()
        sys.exit(exc.exit_code)
    if isinstance(code, int) and code:
        sys.exit(code)
