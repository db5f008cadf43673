"""Prefect flows over the plain analysis functions, for scheduled and triggered use.

The logic lives in plain functions (``flows.clocks``, ``flows.steps``, ``flows.comms``,
``flows.breakdown``, ``flows.timeline``, ``flows.collective_analysis``); these flows only wrap them as tasks.
Tasks pass the database path, run ids and file names, never rows: every analysis reads its inputs
from DuckDB and writes its result tables there (through the materializer's query server while it
runs). Prefect is imported only here and in ``rankstream.schedules``, so nothing else needs it.

Schedules live in ``deploy/prefect.yaml``; ``rankstream serve`` serves them.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rankstream.consumers.query import connect
from rankstream.flows.collective_analysis import diagnose_run as diagnose_stored_run
from rankstream.flows.pipeline import ANALYSES, finished_runs_to_analyze
from rankstream.flows.retention import collect_garbage
from rankstream.flows.run_tables import replace_run_rows
from rankstream.flows.timeline import write_timeline
from rankstream.schemas.config import path_safe
from rankstream.schemas.settings import load_config
from rankstream.schemas.errors import is_transient

__all__ = ["collective_diagnosis", "clock_alignment", "step_analysis", "communication_analysis", "breakdown_analysis",
           "timeline", "run_analyses", "end_of_run", "recent_runs"]


def only_transient_failures(task, task_run, state) -> bool:
    """Prefect's retry condition: retry a task only when its error says a retry can succeed (the
    database busy, the broker down); a bad run id or a bug fails at once instead of three times."""
    error = state.data if isinstance(state.data, BaseException) else state.result(raise_on_failure=False)
    return isinstance(error, BaseException) and is_transient(error)


@task(cache_policy=NO_CACHE)
def recent_runs(db_path: str, within_minutes: float = 60.0) -> list[str]:
    """Runs that sent anything in the last ``within_minutes`` (all runs when 0): live runs and
    runs that just ended."""
    return [run for (run,) in connect(Path(db_path)).fetchall("""
        SELECT run_id FROM (
            SELECT run_id, max(sent_ns) AS last_ns FROM heartbeats GROUP BY run_id
            UNION ALL SELECT run_id, max(sent_ns) FROM rank_metadata GROUP BY run_id)
        GROUP BY run_id
        HAVING $1 <= 0 OR max(last_ns) >= epoch_ns(now()) - ($1 * 60e9)::BIGINT
        ORDER BY run_id""", [within_minutes])]


@task(cache_policy=NO_CACHE)
def runs_with_flight_recorder_data(db_path: str) -> list[str]:
    return [run for (run,) in connect(Path(db_path)).fetchall(
        "SELECT DISTINCT run_id FROM fr_entries ORDER BY run_id")]


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=only_transient_failures)
def analysis_task(db_path: str, run_id: str, analysis: str) -> str:
    """One analysis of one run; returns the run id so later tasks can wait on it."""
    ANALYSES[analysis](Path(db_path), run_id)
    return run_id


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=only_transient_failures)
def diagnose_run(db_path: str, run_id: str) -> dict:
    """One run's collective report (see ``rankstream analyze collectives --json``)."""
    report, episodes = diagnose_stored_run(Path(db_path), run_id)
    return {**report.as_json(), "episodes": episodes}


@task(cache_policy=NO_CACHE)
def timeline_task(db_path: str, run_id: str, output_dir: str, *, max_events: int) -> list[str]:
    result = write_timeline(Path(db_path), run_id, Path(output_dir) / f"{path_safe(run_id)}.json.gz", max_events=max_events)
    return [str(path) for path in result.files]


def _runs(db_path: str, run_ids: list[str] | None, within_minutes: float) -> list[str]:
    return run_ids or recent_runs(db_path, within_minutes)


def _aligned_then(db_path: str, run_ids: list[str] | None, within_minutes: float, analysis: str) -> list[str]:
    """Per run: align the clocks, then ``analysis`` (which waits on the alignment's task)."""
    return [analysis_task(db_path, analysis_task(db_path, run, "clocks"), analysis)
            for run in _runs(db_path, run_ids, within_minutes)]


@flow(name="rankstream-clock-alignment")
def clock_alignment(db_path: str = "rankstream.duckdb", run_ids: list[str] | None = None, within_minutes: float = 60.0) -> list[str]:
    """Per-rank clock offsets (barrier, FR, profiler) for the given or recently active runs."""
    return [analysis_task(db_path, run, "clocks") for run in _runs(db_path, run_ids, within_minutes)]


@flow(name="rankstream-step-analysis")
def step_analysis(db_path: str = "rankstream.duckdb", run_ids: list[str] | None = None,
                  within_minutes: float = 60.0) -> list[str]:
    """Clock alignment, then step_trace and rank_slowness, per run."""
    return _aligned_then(db_path, run_ids, within_minutes, "steps")


@flow(name="rankstream-communication-analysis")
def communication_analysis(db_path: str = "rankstream.duckdb", run_ids: list[str] | None = None,
                           within_minutes: float = 60.0) -> list[str]:
    """Merge, then comm_summary and comm_matrix, per run."""
    return _aligned_then(db_path, run_ids, within_minutes, "communication")


@flow(name="rankstream-breakdown-analysis")
def breakdown_analysis(db_path: str = "rankstream.duckdb", run_ids: list[str] | None = None,
                       within_minutes: float = 60.0) -> list[str]:
    """Merge, then cpu_temporal_breakdown and op_stats, per run."""
    return _aligned_then(db_path, run_ids, within_minutes, "breakdown")


@flow(name="rankstream-timeline")
def timeline(db_path: str = "rankstream.duckdb", output_dir: str = "timelines", run_ids: list[str] | None = None,
             *, within_minutes: float = 60.0, max_events: int = 2_000_000) -> dict[str, list[str]]:
    """Merge, then a Chrome trace per run in ``output_dir`` (split by step range past ``max_events``)."""
    runs = _runs(db_path, run_ids, within_minutes)
    return {run: timeline_task(db_path, analysis_task(db_path, run, "clocks"), output_dir, max_events=max_events) for run in runs}


@flow(name="rankstream-collective-diagnosis")
def collective_diagnosis(db_path: str = "rankstream.duckdb", run_ids: list[str] | None = None) -> dict[str, dict]:
    """Match collectives across ranks and report desyncs, hangs and stragglers, run by run."""
    runs = run_ids or runs_with_flight_recorder_data(db_path)
    return {run: diagnose_run(db_path, run) for run in runs}


@flow(name="rankstream-run-analyses")
def run_analyses(db_path: str = "rankstream.duckdb", run_id: str = "", timeline_dir: str | None = None) -> dict:
    """Everything for one run: clock alignment, steps, communication, breakdown, collective diagnosis and,
    with ``timeline_dir``, the timeline."""
    for analysis in ANALYSES:
        analysis_task(db_path, run_id, analysis)
    out: dict = {"run_id": run_id}
    if run_id in runs_with_flight_recorder_data(db_path):
        out["collectives"] = diagnose_run(db_path, run_id)
    if timeline_dir:
        out["timeline"] = timeline_task(db_path, run_id, timeline_dir, max_events=2_000_000)
    return out


@flow(name="rankstream-end-of-run")
def end_of_run(db_path: str = "rankstream.duckdb", timeline_dir: str | None = None) -> list[str]:
    """The end-of-run trigger: every run whose ranks have all sent their final heartbeat, or that
    went silent (killed, crashed: the runs most in need of a diagnosis), gets its analyses once
    (marked ``end_of_run`` or ``went_silent`` in ``analyses_done``). Scheduled every few seconds."""
    done = []
    for run, how in finished_runs_to_analyze(Path(db_path)):
        run_analyses(db_path, run, timeline_dir)
        replace_run_rows(Path(db_path), run, how, tables=[], statements=[])  # no rows: just record it in analyses_done
        done.append(run)
    return done


@flow(name="rankstream-retention")
def retention(db_path: str = "rankstream.duckdb", keep_runs: int | None = None, older_than_days: float | None = 30.0, *,
              timeline_dir: str | None = None) -> list[str]:
    """``rankstream gc`` on a schedule: remove the runs past the limits (rows, spool, run files and,
    with ``timeline_dir``, timeline files), keeping a tombstone of each. Returns one line per run."""
    config = load_config({"db_path": Path(db_path)})
    removals = collect_garbage(config, keep_runs=keep_runs, older_than_days=older_than_days,
                               timeline_dirs=[Path(timeline_dir)] if timeline_dir else None)
    return [removal.line(dry_run=False) for removal in removals]
