"""``rankstream status``: what is running, what was captured, what was lost, and live hangs.

Loss is reported two ways: the producers' own counters from their latest heartbeats (dropped,
spooled, and after a broker restart the events their resend window no longer held), and sequence
gaps seen by the materializer (messages that never arrived).
"""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from rankstream.consumers.materializer import status_path
from rankstream.consumers.query import connect
from rankstream.deploy.broker import broker_status
from rankstream.schemas.config import Config
from rankstream.schemas.tables import SILENT_AFTER_S
from rankstream.services import materializer_pid

__all__ = ["collect_status", "render_status"]

RUNS_SQL = """
WITH latest_heartbeat AS (
    SELECT * FROM heartbeats
    QUALIFY row_number() OVER (PARTITION BY run_id, rank, session_id ORDER BY sent_ns DESC) = 1
), batches AS (
    SELECT run_id, sum(events)::BIGINT AS events,
           count(*) FILTER (WHERE kind = 'fr_batch') AS fr_batches
    FROM ingested_batches GROUP BY run_id
), gaps AS (
    SELECT run_id, sum(max_seq + 1 - n)::BIGINT AS missing_messages
    FROM (SELECT run_id, rank, stream, session_id, max(seq) AS max_seq, count(*) AS n
          FROM ingested_batches GROUP BY ALL)
    GROUP BY run_id
), processes AS (
    SELECT run_id, count(*) FILTER (WHERE sessions > 1) AS ranks_with_several_processes
    FROM (SELECT run_id, rank, count(DISTINCT session_id) AS sessions FROM rank_metadata GROUP BY ALL)
    GROUP BY run_id
), fr AS (
    SELECT run_id, count(*) AS fr_entries FROM fr_entries GROUP BY run_id
), producers AS (
    SELECT run_id, sum(events_dropped)::BIGINT AS dropped, sum(events_spooled)::BIGINT AS spooled,
           max(broker_resets)::BIGINT AS broker_resets, sum(events_resent)::BIGINT AS resent,
           sum(events_not_resent)::BIGINT AS not_resent, sum(send_failures)::BIGINT AS send_failures,
           sum(windows_lost)::BIGINT AS windows_lost,
           max(sent_ns) AS last_heartbeat_ns, count(DISTINCT rank) AS ranks_heartbeating
    FROM latest_heartbeat GROUP BY run_id
)
SELECT r.run_id, r.world_size, (SELECT count(*) FROM ranks k WHERE k.run_id = r.run_id) AS ranks_seen,
       r.started_at, r.ended_at, r.removed_at, coalesce(b.events, 0) AS events, coalesce(fr.fr_entries, 0) AS fr_entries,
       coalesce(p.dropped, 0) AS dropped, coalesce(p.spooled, 0) AS spooled,
       coalesce(p.broker_resets, 0) AS broker_resets, coalesce(p.resent, 0) AS resent,
       coalesce(p.not_resent, 0) AS not_resent, coalesce(p.send_failures, 0) AS send_failures,
       coalesce(p.windows_lost, 0) AS windows_lost,
       coalesce(g.missing_messages, 0) AS missing_messages, p.last_heartbeat_ns, r.last_heard_ns,
       coalesce(x.ranks_with_several_processes, 0) AS ranks_with_several_processes
FROM runs r
LEFT JOIN batches b USING (run_id) LEFT JOIN gaps g USING (run_id) LEFT JOIN processes x USING (run_id)
LEFT JOIN fr USING (run_id) LEFT JOIN producers p USING (run_id)
ORDER BY r.started_at DESC
"""


def collect_status(config: Config) -> dict[str, Any]:
    report: dict[str, Any] = {"db_path": str(config.db_path), "bootstrap_servers": config.bootstrap_servers}
    broker = broker_status(config) if config.uses_embedded_broker else None
    report["embedded_broker"] = None if broker is None else {"pid": broker.pid, "bootstrap": broker.bootstrap}
    pid = materializer_pid(config)
    materializer: dict[str, Any] = {"running": pid is not None, "pid": pid}
    try:
        materializer.update(json.loads(status_path(config).read_text()))
        materializer["status_age_s"] = round(time.time() - materializer["updated_at"], 1)
    except (OSError, ValueError, KeyError):
        pass
    report["materializer"] = materializer
    if not config.db_path.exists():
        report["runs"], report["rejects"], report["live_findings"] = [], 0, []
        return report
    database = connect(config.db_path)
    report["runs"] = database.arrow(RUNS_SQL).to_pylist()
    now_ns = time.time_ns()
    for run in report["runs"]:
        run["state"] = _state(run, now_ns)
    report["rejects"] = database.fetchall("SELECT count(*) FROM rejects")[0][0]
    running = {run["run_id"] for run in report["runs"] if run["state"] == "running"}
    # a run that ended or went silent has no live hang any more: its report says what was found
    report["live_findings"] = [f for f in live_findings(database) if f["run_id"] in running]
    return report


def _state(run: dict, now_ns: int) -> str:
    """``ended <when>``, ``removed``, ``running``, or ``silent since <when>``: a run killed or
    crashed before its ranks said goodbye never gets an end, and is not running either."""
    if run["removed_at"]:
        return "removed"
    if run["ended_at"]:
        return f"ended {run['ended_at']}"
    last = run["last_heard_ns"]
    if last is not None and now_ns - last > SILENT_AFTER_S * 1e9:
        return f"silent since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(last // 10**9))}"
    return "running"


def live_findings(database, run_id: str | None = None) -> list[dict]:
    """The hang watch's episodes still going on (of one run, or all), with how long each has lasted."""
    return database.arrow(
        "SELECT run_id, kind, pg_name, seq, culprit_ranks, waiting_ranks, detail, "
        "round((last_seen_ns - first_seen_ns) / 1e9, 1) AS for_s FROM live_findings "
        "WHERE cleared_ns IS NULL AND ($run IS NULL OR run_id = $run) ORDER BY run_id, first_seen_ns",
        {"run": run_id}).to_pylist()


def live_finding_line(finding: dict) -> str:
    """One line of console markup for a live episode."""
    label = {"dead_rank": "DEAD", "straggler": "SLOW"}.get(finding["kind"], "HANG")
    return f"[bold red]{label}[/] run {finding['run_id']}: {finding['detail']} (for {finding['for_s']} s)"


def render_status(report: dict[str, Any], console: Console) -> None:
    broker = report["embedded_broker"]
    console.print(f"database: {report['db_path']}")
    console.print(f"kafka: {report['bootstrap_servers']}"
                  + (f" (embedded broker pid {broker['pid']})" if broker else ""))
    m = report["materializer"]
    if m.get("running"):
        lag = m.get("lag_messages")
        console.print(f"materializer: running (pid {m['pid']}), lag {'?' if lag is None else lag} messages, "
                      f"{m.get('events_per_s', 0):,.0f} events/s"
                      + (f", {m['broker_resets']} broker restart(s) recovered" if m.get("broker_resets") else "")
                      + (f", last error: {m['last_error']}" if m.get("last_error") else ""))
    else:
        console.print("materializer: not running")
    table = Table("run", "world", "ranks", "started", "state", "events", "fr entries", "dropped",
                  "spooled", "broker resets", "not resent", "missing msgs", title="runs")
    for run in report["runs"]:
        table.add_row(str(run["run_id"]), str(run["world_size"]), str(run["ranks_seen"]), str(run["started_at"]),
                      run["state"], f"{run['events']:,}", f"{run['fr_entries']:,}",
                      f"{run['dropped']:,}", f"{run['spooled']:,}", f"{run['broker_resets']:,}",
                      f"{run['not_resent']:,}", f"{run['missing_messages']:,}")
    console.print(table)
    if any(run["not_resent"] or run["missing_messages"] for run in report["runs"]):
        console.print("not resent: events acknowledged by a broker that then restarted without its log, after the "
                      "producer's resend window had let them go; missing msgs: sequence gaps in what arrived")
    for run in report["runs"]:
        if run["send_failures"] or run["windows_lost"]:
            console.print(f"run {run['run_id']}: {run['send_failures']:,} send(s) failed (the messages were kept and "
                          f"sent again, not lost), {run['windows_lost']:,} profiler window(s) lost")
        if run["ranks_with_several_processes"]:
            console.print(f"[yellow]warning[/]: run {run['run_id']}: {run['ranks_with_several_processes']} rank(s) "
                          "were sent by more than one process (two launches under one run id, or a restart); "
                          "give each launch its own run id")
    for finding in report["live_findings"]:
        console.print(live_finding_line(finding) + (" (details: the live_findings table)"
                                                    if finding["kind"] != "dead_rank" else ""))
    console.print(f"rejected messages: {report['rejects']}" + (" (see the rejects table)" if report["rejects"] else ""))
