"""The run analyses in their order: clock alignment first (every other analysis reads the aligned clock),
then steps, communication and breakdowns, then collective diagnosis when the run has FR data.

Plain functions: the Prefect flows (``flows.prefect_flows``), ``rankstream analyze`` and
``rankstream report`` all call these.
"""

from __future__ import annotations

import time
from pathlib import Path

from rankstream.consumers.query import connect
from rankstream.schemas.errors import BadInput
from rankstream.schemas.tables import SILENT_AFTER_S
from rankstream.flows.breakdown import analyze_breakdown
from rankstream.flows.comms import analyze_communication
from rankstream.flows.gpu_breakdown import analyze_gpu_breakdown
from rankstream.flows.clocks import align_clocks
from rankstream.flows.collective_analysis import diagnose_run, episode_line
from rankstream.flows.run_tables import require_run
from rankstream.flows.steps import analyze_steps

__all__ = ["ANALYSES", "analyze_everything", "finished_runs_to_analyze", "diagnose_run", "episode_line"]

#: name -> function(db_path, run_id); the order is the dependency order.
ANALYSES = {
    "clocks": align_clocks,
    "gpu_breakdown": analyze_gpu_breakdown,
    "steps": analyze_steps,
    "communication": analyze_communication,
    "breakdown": analyze_breakdown,
}


def analyze_everything(db_path: Path, run_id: str, collectives: bool = True,
                       *, only: list[str] | None = None) -> dict[str, float]:
    """Run every analysis for ``run_id`` (or ``only`` those named, still in dependency order, and
    then no collective diagnosis); returns seconds per analysis.

    Without a materializer serving the file, the analyses share one connection to it: each opening
    the file for itself started on DuckDB's cold cache, and steps plus breakdown on 10M events took
    1.20-1.73 s that way against 0.94-1.09 s sharing."""
    unknown = sorted(set(only or ()) - set(ANALYSES))
    if unknown:
        raise BadInput(f"unknown analyses {unknown}; choose from {', '.join(ANALYSES)}")
    require_run(db_path, run_id)
    seconds = {}
    with connect(db_path, read_only=False, wait_s=120).held() as database:
        for name, analysis in ANALYSES.items():
            if only is None or name in only:
                started = time.perf_counter()
                analysis(database, run_id)
                seconds[name] = time.perf_counter() - started
    has_entries = "SELECT count(*) > 0 FROM fr_entries WHERE run_id = $1"
    if collectives and only is None and connect(db_path).fetchall(has_entries, [run_id])[0][0]:
        started = time.perf_counter()
        diagnose_run(db_path, run_id)
        seconds["collectives"] = time.perf_counter() - started
    return seconds


def finished_runs_to_analyze(db_path: Path) -> list[tuple[str, str]]:
    """(run, how it is over) for the end-of-run trigger: ``end_of_run`` when its ranks have all
    sent their final heartbeat, ``went_silent`` when nothing was heard from it for
    ``SILENT_AFTER_S`` (killed, crashed), each not analyzed as such yet. A run analyzed when it
    went silent that then resumes and ends is analyzed again at its end."""
    return connect(db_path).fetchall("""
        SELECT run_id, how FROM (
            SELECT r.run_id, r.started_at,
                   CASE WHEN r.ended_at IS NOT NULL THEN 'end_of_run'
                        WHEN r.last_heard_ns < epoch_ns(now()) - $silent::BIGINT * 1_000_000_000 THEN 'went_silent' END AS how
            FROM runs r WHERE r.removed_at IS NULL) r
        WHERE how IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM analyses_done a WHERE a.run_id = r.run_id
                          AND a.analysis IN (how, 'end_of_run'))
        ORDER BY started_at""", {"silent": SILENT_AFTER_S})
