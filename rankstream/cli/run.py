"""``rankstream run -- <launcher and script>`` and ``rankstream env``: capture a job nobody edited."""

from __future__ import annotations

import shlex
from typing import Optional

import typer

from rankstream.cli.app import app, config, console, ranks_option, server_module
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
    kill_after: float = typer.Option(30.0, "--kill-after", min=0.0,
                                     help="With --on-hang kill: end the job once a hang has lasted this many "
                                          "seconds (a shorter pause, such as one rank saving a checkpoint, is "
                                          "only reported)."),
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
                                  on_hang=on_hang, status_every_s=status_every, kill_after_s=kill_after)
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


@app.command("profile", epilog="Example: rankstream profile --run train-20261126-101500-ab12 --ranks 0,3 --active 3")
def profile_command(
    run: str = typer.Option(..., "--run", help="The running job's run id (`rankstream status` lists them)."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Only these ranks, e.g. '0,3' (default: all)."),
    active: int = typer.Option(3, "--active", min=1, max=1000, help="Steps the window records."),
    wait: float = typer.Option(120.0, "--wait", min=1, help="Seconds to wait for the windows."),
) -> None:
    """Open a profiler window on a running job's ranks at their next step, with no daemon: works for
    jobs started by `rankstream run` and for scripts that call rankstream.init()."""
    selected = ranks_option(ranks)
    summaries = server_module("remote_profile").request_profile(config(), run, ranks=sorted(selected) if selected
                                                                else None, active=active, wait_s=wait)
    for summary in summaries:
        if summary.error:
            console.print(f"rank {summary.rank}: no window: {summary.error}", markup=False, soft_wrap=True)
            continue
        top = ", ".join(f"{name} {ms:,.1f} ms" for name, ms in summary.top_ops)
        console.print(f"rank {summary.rank}: {summary.events:,} events in {active} steps; top ops: {top or '-'}",
                      markup=False, soft_wrap=True)
    console.print(f"the windows are in the tables: rankstream timeline --run {run} -o {run}.json.gz")
