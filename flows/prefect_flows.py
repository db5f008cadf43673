"""Prefect flows over the plain analysis functions, for scheduled and triggered use.

The logic lives in plain functions (``flows.diagnose``, ``flows.collectives``); these flows only
wrap them as tasks, pass database paths and run ids (never rows) between tasks, and return the
JSON reports. Prefect is imported only here, so nothing else in rankstream needs it.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rankstream.flows.diagnose import analyze_stored

__all__ = ["collective_diagnosis", "runs_with_flight_recorder_data"]


@task(cache_policy=NO_CACHE)
def runs_with_flight_recorder_data(db_path: str) -> list[str]:
    from rankstream.consumers.query import connect

    return [run for (run,) in connect(Path(db_path)).fetchall(
        "SELECT DISTINCT run_id FROM fr_entries ORDER BY run_id")]


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def diagnose_run(db_path: str, run_id: str) -> dict:
    """One run's report (see ``rankstream analyze collectives --json``)."""
    return analyze_stored(Path(db_path), run_id).as_json()


@flow(name="rankstream-collective-diagnosis")
def collective_diagnosis(db_path: str = "rankstream.duckdb", run_ids: list[str] | None = None) -> dict[str, dict]:
    """Match collectives across ranks and report desyncs, hangs and stragglers, run by run."""
    runs = run_ids or runs_with_flight_recorder_data(db_path)
    return {run: diagnose_run(db_path, run) for run in runs}
