"""The collective diagnosis as a run analysis: diagnose a stored run, keep its findings.

What ``rankstream analyze collectives``, ``analyze run`` and the Prefect flows call. The findings
replace the run's rows of ``findings`` in one transaction (through the materializer while it
runs); the live hang watch's episodes (``live_findings``) are read beside them, never replaced.
"""

from __future__ import annotations

from pathlib import Path

from rankstream.consumers.query import connect
from rankstream.flows.diagnosis.render import rank_ranges
from rankstream.flows.diagnosis.report import Report, diagnose_stored, findings_statements
from rankstream.flows.run_tables import analysis_done, ensure_schema

__all__ = ["diagnose_run", "live_episodes", "episode_line"]

EPISODES_SQL = """
SELECT kind, culprit_ranks, pg_name, pg_desc, seq, first_seen_ns, last_seen_ns, cleared_ns, waiting_ranks,
       detail, evidence, stack
FROM live_findings WHERE run_id = $run ORDER BY first_seen_ns
"""


def diagnose_run(db_path: Path, run_id: str, *, mismatch_cap: int | None = None,
                 job_over: bool = False, ended_here_ns: int | None = None,
                 fatal: dict[int, str] | None = None) -> tuple[Report, list[dict]]:
    """The run's diagnosis (stored in ``findings``) and its live episodes (``job_over``,
    ``ended_here_ns`` and ``fatal``: see ``diagnose_stored``)."""
    ensure_schema(db_path)
    database = connect(db_path, read_only=False, wait_s=120)
    report = diagnose_stored(database, run_id, mismatch_cap=mismatch_cap, job_over=job_over,
                             ended_here_ns=ended_here_ns, fatal=fatal)
    database.script(findings_statements(report) + [analysis_done(run_id, "collectives", report.verdict)])
    return report, live_episodes(database, run_id)


def live_episodes(database, run_id: str) -> list[dict]:
    return database.arrow(EPISODES_SQL, {"run": run_id}).to_pylist()


def episode_line(episode: dict) -> str:
    """One line: what, from when to when (or still going), who."""
    lasted = ((episode["cleared_ns"] or episode["last_seen_ns"]) - episode["first_seen_ns"]) / 1e9
    state = "cleared" if episode["cleared_ns"] else "still found at the last pass"
    culprits = rank_ranges(episode["culprit_ranks"] or [])
    return (f"[{episode['kind']}] {episode['detail'] or ''} ({state} after {lasted:.1f} s"
            + (f"; culprits {culprits}" if culprits else "") + ")")
