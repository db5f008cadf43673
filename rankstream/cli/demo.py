"""``rankstream demo``: the main job on the embedded defaults, start to finish."""

from __future__ import annotations

import typer

from rankstream.cli.app import app, config, console, server_module

_FAULTS = ("none", "hang", "stall", "desync", "wrong_op", "extra", "straggler", "crash")


@app.command(epilog="Example: rankstream demo --fault hang --fault-rank 2")
def demo(
    ranks: int = typer.Option(4, "--ranks", min=2, help="Ranks (processes) of the gloo job."),
    steps: int = typer.Option(20, "--steps", min=2, help="Training steps."),
    fault: str = typer.Option("none", "--fault", help="Inject a fault: " + ", ".join(_FAULTS) + "."),
    fault_rank: int = typer.Option(1, "--fault-rank", help="The rank that misbehaves."),
    synthetic: bool = typer.Option(False, "--synthetic", help="Stream a synthetic job instead (no torch)."),
) -> None:
    """Start what is needed, run a real gloo training job streamed by rankstream, show its progress
    and what rankstream found, stop."""
    if fault not in _FAULTS:
        raise typer.BadParameter(f"--fault must be one of {', '.join(_FAULTS)}")
    if not 0 <= fault_rank < ranks:
        raise typer.BadParameter(f"--fault-rank must be between 0 and {ranks - 1}")
    server_module("demo.runner").run_demo(config(), ranks=ranks, steps=steps, fault=fault, fault_rank=fault_rank,
                                          synthetic=synthetic, console=console)
