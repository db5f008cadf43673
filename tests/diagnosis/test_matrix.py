"""The diagnosis on the generated matrix: every fault kind, layout, format, position and culprit
dump present or absent, plus a healthy case of every layout. The root cause must name the right
kind, culprits, group and sequence number in every case, through each of the three doors the
engine has: a dump directory, a stored run, and the live hang watch."""

from __future__ import annotations

import json
import time

import duckdb
import pyarrow as pa
import pytest

from rankstream.consumers.query import Database
from rankstream.consumers.store import apply_schema
from rankstream.flows.diagnosis.report import diagnose_directory, diagnose_stored
from rankstream.flows.hang_watch import watch_pass
from rankstream.producers.fr_reader import entry_from_dump, groups_from_pg_config
from rankstream.schemas.tables import FR_ENTRIES
from tests.diagnosis.fr_scenarios import dump_documents, scenarios, write_scenario

CASES = scenarios()


def _matches(finding, expected) -> bool:
    if finding is None:
        return expected.kind is None
    seq_ok = expected.seq is None or finding.seq == expected.seq or (
        finding.seq_range is not None and finding.seq_range[0] <= expected.seq <= finding.seq_range[1])
    return (finding.kind == expected.kind and tuple(finding.culprit_ranks) == tuple(expected.culprits)
            and (expected.group_desc is None or finding.group_desc == expected.group_desc) and seq_ok)


def _describe(report) -> str:
    return "\n".join(f"{f.kind} {f.culprit_ranks} {f.group_desc} #{f.seq}: {f.evidence}" for f in report.findings[:4])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_dump_directory_names_the_root_cause(case, tmp_path):
    report = diagnose_directory(write_scenario(case, tmp_path / "dumps"), prefix="rank_")
    assert _matches(report.diagnosis.root, case.expected), f"{case.expected}\n{_describe(report)}"
    assert report.exit_code == (0 if case.expected.kind is None else 1)
    if case.expected.kind is not None:
        assert report.root_cause.startswith("root cause: ")


def _stored(case, now_ns: int | None = None) -> duckdb.DuckDBPyConnection:
    """The case's dumps as the materializer would store them, with heartbeats when ``now_ns``."""
    con = duckdb.connect()
    apply_schema(con)
    rows, groups = [], []
    for rank, dump in dump_documents(case).items():
        for entry in dump["entries"]:
            rows.append({"run_id": "run", "rank": rank, "snapshot_ns": now_ns or 1, **entry_from_dump(entry)})
        groups += [{"run_id": "run", "rank": rank, "reported_ns": 1, **g}
                   for g in groups_from_pg_config(dump.get("pg_config"))]
        if now_ns is not None:  # alive, and no progress for a minute
            for sent in (now_ns - 60 * 10**9, now_ns - 10**9):
                con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final, collectives) "
                            "VALUES ('run', ?, 's', ?, false, ?)", [rank, sent, json.dumps({"0": {"last": 1}})])
    con.register("_rows", pa.Table.from_pylist(rows, schema=FR_ENTRIES.arrow_schema()))
    con.execute("INSERT INTO fr_entries BY NAME SELECT * FROM _rows")
    if groups:
        con.register("_groups", pa.Table.from_pylist(groups))
        con.execute("INSERT INTO process_groups BY NAME SELECT * FROM _groups")
    return con


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_stored_run_gets_the_same_diagnosis(case):
    report = diagnose_stored(Database.over(_stored(case), "matrix"), "run")
    assert _matches(report.diagnosis.root, case.expected), f"{case.expected}\n{_describe(report)}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_live_watch_finds_the_same_root_cause(case):
    now = time.time_ns()
    found = [f for _, f in watch_pass(_stored(case, now_ns=now), now_ns=now)[1]]
    expected = case.expected
    if expected.kind is None:
        assert found == []
        return
    root = found[0] if found else None
    assert root is not None and tuple(root.culprit_ranks) == tuple(expected.culprits), (expected, found[:3])
    # live, a rank that left no data has stopped heartbeating: a dead rank, not a missing dump
    assert root.kind == expected.kind or (expected.kind == "missing_dump" and root.kind == "dead_rank")
