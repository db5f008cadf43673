"""``rankstream run -- <launcher and script>`` and ``rankstream env``: capture a job nobody edited."""

from __future__ import annotations

import shlex
from typing import Optional

import typer

from rankstream.cli.app import app, config, console, server_module
from rankstream.schemas.settings import advertised_endpoint, config_env, requested_run_id


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             epilog="Example: rankstream run -- torchrun --nproc-per-node 4 train.py --lr 0.1")
def run_command(
    command: list[str] = typer.Argument(..., help="The launcher and script, after --, exactly as you run them."),
    run: Optional[str] = typer.Option(None, "--run", help="The run id (default: RANKSTREAM_RUN_ID, else a new "
                                                          "one per launch)."),
    profile_every: int = typer.Option(200, "--profile-every", min=0,
                                      help="Open a profiler window every N steps (after the first 10)."),
    active: int = typer.Option(2, "--active", min=1, help="Steps each profiler window records."),
    no_profile: bool = typer.Option(False, "--no-profile", help="No profiler windows: Flight Recorder and steps only."),
    on_hang: str = typer.Option("wait", "--on-hang", help="When a hang is found: wait (report, keep waiting), "
                                                          "dump (also FR dumps and Python stacks), kill (end the job)."),
    status_every: float = typer.Option(5.0, "--status-every", min=0.5, help="Seconds between status lines."),
) -> None:
    """Run a training job unmodified, with every rank captured, live status and hang diagnosis."""
    launcher = server_module("launcher")
    if on_hang not in launcher.ON_HANG:
        raise typer.BadParameter(f"--on-hang takes one of {', '.join(launcher.ON_HANG)}; got {on_hang!r}")
    every = 0 if no_profile else profile_every
    if every and every < active + 2:
        raise typer.BadParameter(f"--profile-every {every} leaves no room for a window of --active {active} "
                                 "steps and its warm-up step; use at least active + 2")
    options = launcher.JobOptions(command=list(command), run_id=run or requested_run_id(), profile_every=every, profile_active=active,
                                  on_hang=on_hang, status_every_s=status_every)
    code = launcher.run_job(config(), options, say=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
    raise typer.Exit(code)


@app.command("env", epilog="Example: eval $(rankstream env)")
def env_command() -> None:
    """Print the exports that point another shell (or another node's ranks) at this state dir's
    broker and database."""
    cfg = config()
    values = config_env(cfg)
    advertised = advertised_endpoint(cfg)
    if advertised and cfg.uses_embedded_broker:
        values["RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS"] = advertised
    for name, value in sorted(values.items()):
        if name.startswith("RANKSTREAM_PRODUCER_"):
            continue  # tuning, not where things are
        console.print(f"export {name}={shlex.quote(value)}", markup=False, highlight=False, soft_wrap=True)
