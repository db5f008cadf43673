"""The collective-diagnosis flow on a real Prefect (ephemeral test harness) and a real DuckDB file."""

import duckdb
import pytest

from rankstream.consumers.store import apply_schema
from tests.diagnosis.fr_scenarios import scenario
from tests.diagnosis.storing import store_case

pytestmark = pytest.mark.integration

HEALTHY = "w8-tp2-dp4__healthy__-__pickle__present"
BROKEN = "w8-tp2-dp4__type_mismatch__inflight__pickle__present__tp"


def test_flow_reports_every_run_in_the_database(tmp_path, prefect_harness):
    from rankstream.flows.prefect_flows import collective_diagnosis

    db_path = tmp_path / "flows.duckdb"
    con = duckdb.connect(str(db_path))
    apply_schema(con)
    store_case(con, scenario(HEALTHY), "healthy-run")
    store_case(con, scenario(BROKEN), "broken-run")
    con.close()
    reports = collective_diagnosis(str(db_path))
    assert reports["healthy-run"]["verdict"] == "healthy" and reports["healthy-run"]["findings"] == []
    broken = reports["broken-run"]
    assert broken["verdict"] == "hang"
    assert broken["findings"][0]["culprit_ranks"] == list(scenario(BROKEN).expected.culprits)
    stored = duckdb.connect(str(db_path), read_only=True).execute(
        "SELECT run_id, kind FROM findings ORDER BY run_id, position").fetchall()
    assert stored[0] == ("broken-run", "type_mismatch")  # the analysis tables stay in the database


def test_tasks_retry_transient_failures_only(tmp_path, prefect_harness, monkeypatch):
    from prefect import flow

    from rankstream.flows import prefect_flows
    from rankstream.schemas.errors import BadInput, DatabaseBusy

    calls = {"busy": 0, "bad": 0}

    def busy_twice(db_path, run_id):
        calls["busy"] += 1
        if calls["busy"] <= 2:
            raise DatabaseBusy("another process holds the file")

    def bad_run(db_path, run_id):
        calls["bad"] += 1
        raise BadInput(f"no run {run_id!r}")

    monkeypatch.setitem(prefect_flows.ANALYSES, "busy_twice", busy_twice)
    monkeypatch.setitem(prefect_flows.ANALYSES, "bad_run", bad_run)
    monkeypatch.setattr(prefect_flows.analysis_task, "retry_delay_seconds", 0)

    @flow
    def both(db_path: str) -> str:
        done = prefect_flows.analysis_task(db_path, "r1", "busy_twice")
        failed = prefect_flows.analysis_task(db_path, "r1", "bad_run", return_state=True)
        return done, failed.is_failed()

    done, failed = both(str(tmp_path / "x.duckdb"))
    assert done == "r1" and failed
    assert calls == {"busy": 3, "bad": 1}  # the busy database was retried; bad input was not
