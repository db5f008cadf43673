"""``rankstream profile --run R [--ranks 0,3] [--active K]``: a profiler window on a running job.

The request goes on the requests topic (``producers.requests``); each named rank opens a window at
its next step boundary (``producers.on_demand``), and its events reach the tables like any
other. This waits until every named rank has closed its window, then summarizes each window from
the stored events (between the ``on_demand_window`` marks that carry the request id).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from rankstream.consumers.query import connect
from rankstream.producers.kafka_client import client_options, ensure_topics
from rankstream.producers.on_demand import WINDOW_MARK
from rankstream.producers.requests import profile_request
from rankstream.schemas.config import Config
from rankstream.schemas.errors import BadInput, RankstreamError
from rankstream.schemas.topics import requests_topic

__all__ = ["WindowSummary", "request_profile"]

MARKS_SQL = f"""
SELECT rank, args->>'edge' AS edge, ts_ns, args->>'error' AS error FROM trace_events
WHERE run_id = $run AND name = '{WINDOW_MARK}' AND args->>'request' = $request
"""
WINDOW_SQL = """
WITH recorded AS (
    SELECT name, cat, ph, dur_ns FROM trace_events
    WHERE run_id = $run AND rank = $rank AND ts_ns BETWEEN $start AND $end AND cat NOT IN ('step', 'rankstream')
), ops AS (
    SELECT name, sum(dur_ns)::BIGINT AS total FROM recorded WHERE ph = 'X' AND cat = 'cpu_op' GROUP BY name
)
SELECT (SELECT count(*) FROM recorded) AS events, list(name ORDER BY total DESC)[:5] AS top_ops,
       list(total ORDER BY total DESC)[:5] AS top_ns
FROM ops
"""


@dataclass
class WindowSummary:
    rank: int
    events: int = 0
    top_ops: list[tuple[str, float]] = field(default_factory=list)
    error: str | None = None


def request_profile(config: Config, run_id: str, *, ranks: list[int] | None, active: int,
                    wait_s: float = 120.0) -> list[WindowSummary]:
    """Ask ``ranks`` of ``run_id`` (all its ranks when None) for a window of ``active`` steps and
    wait for it; the windows' summaries by rank."""
    database = connect(config.db_path)
    known = [rank for (rank,) in database.fetchall("SELECT DISTINCT rank FROM ranks WHERE run_id = $1 ORDER BY rank",
                                                   [run_id])]
    if not known:
        raise BadInput(f"no run {run_id!r} in {config.db_path}; `rankstream status` lists the runs")
    wanted = sorted(set(ranks) if ranks else set(known))
    if unknown := sorted(set(wanted) - set(known)):
        raise BadInput(f"run {run_id} has no rank(s) {unknown}; its ranks are {known}")
    request = profile_request(run_id, ranks, active)
    _publish(config, request)
    marks: dict[int, dict[str, tuple[int, str | None]]] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        marks = {}
        for rank, edge, ts_ns, error in database.fetchall(MARKS_SQL, {"run": run_id, "request": request["id"]}):
            marks.setdefault(rank, {})[edge] = (ts_ns, error)
        if all("end" in marks.get(r, {}) or "failed" in marks.get(r, {}) for r in wanted):
            break
        time.sleep(0.5)
    else:
        missing = [r for r in wanted if "end" not in marks.get(r, {})]
        raise RankstreamError(f"no window from rank(s) {missing} within {wait_s:.0f} s: the job may have ended, "
                              "be stuck, or not be stepping (a window opens at a step boundary)")
    time.sleep(2.0)  # the window's own events follow its end mark through the converter thread
    return [_summary(database, run_id, rank, marks[rank]) for rank in wanted]


def _publish(config: Config, request: dict) -> None:
    from kafka import KafkaProducer

    ensure_topics(config)
    producer = KafkaProducer(**client_options(config))
    try:
        producer.send(requests_topic(config.topic_prefix), json.dumps(request).encode()).get(timeout=10)
    finally:
        producer.close()


def _summary(database, run_id: str, rank: int, edges: dict) -> WindowSummary:
    if "failed" in edges:
        return WindowSummary(rank, error=edges["failed"][1] or "the rank could not open a window")
    start, end = edges["start"][0], edges["end"][0]
    row = database.arrow(WINDOW_SQL, {"run": run_id, "rank": rank, "start": start, "end": end}).to_pylist()[0]
    return WindowSummary(rank, events=row["events"],
                         top_ops=list(zip(row["top_ops"] or [], [ns / 1e6 for ns in row["top_ns"] or []])))
