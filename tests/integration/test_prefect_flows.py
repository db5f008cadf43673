"""The collective-diagnosis flow on a real Prefect (ephemeral test harness) and a real DuckDB file."""

import duckdb
import pytest

from rankstream.flows.dump_loader import load_dump_directory
from rankstream.schemas.tables import ddl

from ..unit.test_collectives import write_job

pytestmark = pytest.mark.integration


def test_flow_reports_every_run_in_the_database(tmp_path, prefect_harness):
    from rankstream.flows.prefect_flows import collective_diagnosis

    db_path = tmp_path / "flows.duckdb"
    con = duckdb.connect(str(db_path))
    con.execute(ddl())
    for run, fault in (("healthy-run", "none"), ("broken-run", "wrong_op")):
        entries, _, _ = load_dump_directory(write_job(tmp_path / run, fault, fault_rank=3), "rank_", run)
        con.register("_entries", entries)
        con.execute("INSERT INTO fr_entries SELECT * FROM _entries")
        con.unregister("_entries")
    con.close()
    reports = collective_diagnosis(str(db_path))
    assert reports["healthy-run"] == {"verdict": "healthy", "findings": []}
    assert reports["broken-run"]["verdict"] == "desync"
    assert reports["broken-run"]["findings"][0]["culprit_ranks"] == [3]
    stored = duckdb.connect(str(db_path), read_only=True).execute(
        "SELECT run_id, kind FROM findings ORDER BY run_id, position").fetchall()
    assert stored[0] == ("broken-run", "type_mismatch")  # the analysis tables stay in the database
