"""The diagnosis on the generated matrix: every fault kind, layout, format, position and culprit
dump present or absent, plus a healthy case of every layout. The root cause must name the right
kind, culprits, group and sequence number in every case, through each of the three doors the
engine has: a dump directory, a stored run, and the live hang watch."""

from __future__ import annotations

import time

import duckdb
import pytest

from rankstream.consumers.query import Database
from rankstream.consumers.store import apply_schema
from rankstream.flows.diagnosis.report import diagnose_directory, diagnose_stored
from rankstream.flows.hang_watch import watch_pass
from tests.diagnosis.fr_scenarios import scenarios, write_scenario
from tests.diagnosis.storing import store_case

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
    con = duckdb.connect()
    apply_schema(con)
    store_case(con, case, now_ns=now_ns)
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
