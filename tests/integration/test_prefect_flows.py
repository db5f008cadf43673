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
