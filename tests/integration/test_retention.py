"""``rankstream gc`` and the retention flow on a real DuckDB file, with the real command.

Three finished runs (one started 40 days ago) and one in progress are materialized from the
in-memory bus; each has a spool, a ``rankstream run`` folder and timeline files. Removing a run
must take every row of it from every table, its files, and keep a tombstone that stops a replay of
the bus from bringing it back.
"""

import threading
import time

import duckdb
import pytest

from rankstream.consumers.materializer import Materializer
from rankstream.consumers.store import Store
from rankstream.producers.producer import Producer
from rankstream.schemas import all_topics
from rankstream.schemas.tables import REMOVED_RUNS, TABLES
from tests.doubles import MemorySource, MemoryTransport

from .conftest import cli

pytestmark = pytest.mark.integration

DAY_NS = 86400 * 10**9
FINISHED = {"old": 40, "mid": 2, "new": 1}  # run: days since it started


def _materialize(config, bus, rebuild=False) -> None:
    store = Store(duckdb.connect(str(config.db_path)))
    if rebuild:
        store.reset()
    Materializer(config, store, MemorySource(bus, all_topics(config.topic_prefix)), log=lambda line: None).run(
        threading.Event(), until_caught_up=True)
    store.connection.close()


@pytest.fixture
def runs(make_config, bus, tmp_path):
    config = make_config()
    for run, days in [*FINISHED.items(), ("live", 0)]:
        producer = Producer(run_id=run, rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
        producer.emit_rank_metadata(started_at_ns=time.time_ns() - days * DAY_NS - 1)
        for i in range(50):
            producer.emit("op", ts_ns=time.time_ns(), dur_ns=10, step=i // 10)
        producer.emit_fr_entries([{"record_id": 0, "pg_id": 0, "collective_seq_id": 1, "op_id": 1,
                                   "profiling_name": "nccl:all_reduce", "state": "completed"}])
        if run == "live":
            producer.flush()  # heartbeats, but no final one: the run is in progress
        else:
            producer.close()
        (config.spool_dir / run / "rank0").mkdir(parents=True)
        (config.spool_dir / run / "rank0" / "1-1.seg").write_bytes(b"x")
        config.run_dir(run).mkdir(parents=True)
        (config.run_dir(run) / "report.txt").write_text("report")
        (tmp_path / "timelines").mkdir(exist_ok=True)
        for name in (f"{run}.json.gz", f"{run}.steps0-4.json.gz"):
            (tmp_path / "timelines" / name).write_bytes(b"{}")
    _materialize(config, bus)
    return config


def _rows_per_run(config) -> dict[str, int]:
    con = duckdb.connect(str(config.db_path), read_only=True)
    try:
        tables = [t.name for t in TABLES if t is not REMOVED_RUNS and any(c.name == "run_id" for c in t.columns)]
        union = " UNION ALL ".join(f"SELECT run_id FROM {name}" for name in tables)
        return dict(con.execute(f"SELECT run_id, count(*) FROM ({union}) GROUP BY run_id").fetchall())
    finally:
        con.close()


def _listed(config) -> dict[str, bool]:
    """Each run in the ``runs`` view, and whether it is listed as removed."""
    con = duckdb.connect(str(config.db_path), read_only=True)
    try:
        return dict(con.execute("SELECT run_id, removed_at IS NOT NULL FROM runs").fetchall())
    finally:
        con.close()


def test_gc_removes_old_runs_everywhere_keeps_a_tombstone_and_a_replay_does_not_bring_them_back(runs, bus, tmp_path):
    config, timelines = runs, tmp_path / "timelines"
    before = _rows_per_run(config)
    assert set(before) == {"old", "mid", "new", "live"}

    dry = cli(config, "gc", "--older-than", "30", "--timeline-dir", str(timelines), "--dry-run")
    assert "would remove run old (started more than 30 days ago)" in dry.stdout
    assert _rows_per_run(config) == before and (config.spool_dir / "old").exists()

    done = cli(config, "gc", "--older-than", "30", "--timeline-dir", str(timelines))
    assert f"removed run old (started more than 30 days ago): {before['old']:,} rows, 4 " in done.stdout
    assert _rows_per_run(config) == {run: n for run, n in before.items() if run != "old"}
    assert _listed(config) == {"old": True, "mid": False, "new": False, "live": False}
    assert "│ removed " in cli(config, "status").stdout
    assert not (config.spool_dir / "old").exists() and not config.run_dir("old").exists()
    assert sorted(p.name for p in timelines.iterdir()) == sorted(
        f"{run}{suffix}" for run in ("mid", "new", "live") for suffix in (".json.gz", ".steps0-4.json.gz"))

    kept = cli(config, "gc", "--keep-runs", "0")  # every finished run goes; the one in progress stays
    assert "removed run mid" in kept.stdout and "removed run new" in kept.stdout and "live" not in kept.stdout
    assert set(_rows_per_run(config)) == {"live"}

    _materialize(config, bus, rebuild=True)  # the bus still holds every message of the removed runs
    assert set(_rows_per_run(config)) == {"live"}
    assert _listed(config) == {"old": True, "mid": True, "new": True, "live": False}


def test_gc_without_a_limit_is_one_clear_error(runs):
    result = cli(runs, "gc", check=False)
    assert result.returncode == 2 and "give --keep-runs N, --older-than DAYS, or both" in result.stderr


def test_the_retention_flow_removes_what_gc_would(runs, prefect_harness):
    from rankstream.flows.prefect_flows import retention

    lines = retention(db_path=str(runs.db_path), keep_runs=2, older_than_days=None)  # the run in progress counts
    assert [line.split(" (")[0] for line in lines] == ["removed run mid", "removed run old"]
    assert set(_rows_per_run(runs)) == {"new", "live"}
