"""Files with a few bad entries or events among good ones: the good ones are imported, each bad one
becomes an ``input_rejects`` row naming the file, the item and the field, and the import exits 1
saying so. Nothing vanishes (an FR integer of 65 bits used to make its whole batch disappear at
encoding, with exit 0; a trace event without a time was stored at time 0)."""

from __future__ import annotations

import json
import pickle

import pytest

from rankstream.consumers.query import connect

from .conftest import cli

pytestmark = pytest.mark.integration


def _entry(index: int, **changes) -> dict:
    entry = {"record_id": index, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": index,
             "p2p_seq_id": 0, "op_id": index, "profiling_name": "nccl:all_reduce", "time_created_ns": 1000 + index,
             "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
             "state": "completed", "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
             "retired": True, "timeout_ms": 600000, "is_p2p": False, "frames": []}
    entry.update(changes)
    return entry


@pytest.mark.parametrize("encoding", ["pickle", "json"])
def test_bad_entries_become_rejects_and_the_rest_is_imported(live, tmp_path, encoding):
    entries = [_entry(0), _entry(1, record_id=2**64 + 1), _entry(2), _entry(3, input_sizes=[["four"]]),
               _entry(4, time_created_ns="1"), _entry(5)]
    dump = {"version": "2.4", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}},
            "entries": entries}
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    path = dumps / "rank_0"
    if encoding == "pickle":
        path.write_bytes(pickle.dumps(dump))
    else:
        path.write_text(json.dumps(dump))
    run = f"hostile-fr-{encoding}"
    done = cli(live, "import", "fr", str(dumps), "--prefix", "rank_", "--run", run, check=False)
    assert done.returncode == 1, done.stderr + done.stdout
    assert "3 item(s) failed validation" in done.stdout

    database = connect(live.db_path)
    stored = database.arrow("SELECT record_id FROM fr_entries WHERE run_id = ? ORDER BY record_id", [run])
    assert stored["record_id"].to_pylist() == [0, 2, 5]
    rejects = database.arrow("SELECT source, item, reason, raw FROM input_rejects WHERE run_id = ? ORDER BY item",
                             [run]).to_pylist()
    assert [r["item"] for r in rejects] == [1, 3, 4]
    assert all(r["source"] == str(path) for r in rejects)
    assert "'record_id'" in rejects[0]["reason"] and "64 bits" in rejects[0]["reason"]
    assert "'input_sizes'" in rejects[1]["reason"] and "'time_created_ns'" in rejects[2]["reason"]
    assert json.loads(rejects[0]["raw"])["record_id"] == 2**64 + 1  # the item itself is kept


def test_bad_trace_events_become_rejects_and_the_rest_is_imported(live, tmp_path):
    good = {"ph": "X", "name": "op", "cat": "cpu_op", "ts": 10, "dur": 2, "pid": 0, "tid": 0}
    events = [good, {k: v for k, v in good.items() if k != "ts"}, dict(good, ts=20), dict(good, dur=-3),
              dict(good, ts=2e21), dict(good, ts=30)]
    path = tmp_path / "trace_rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    run = "hostile-trace"
    done = cli(live, "import", "trace", str(path), "--run", run, check=False)
    assert done.returncode == 1 and "3 item(s) failed validation" in done.stdout, done.stderr + done.stdout
    database = connect(live.db_path)
    stored = database.arrow("SELECT ts_ns FROM trace_events WHERE run_id = ? AND name = 'op' ORDER BY ts_ns", [run])
    assert stored["ts_ns"].to_pylist() == [10_000, 20_000, 30_000]  # none at time 0
    rejects = database.arrow("SELECT item, reason FROM input_rejects WHERE run_id = ? ORDER BY item", [run]).to_pylist()
    assert [r["item"] for r in rejects] == [1, 3, 4]
    assert "'ts'" in rejects[0]["reason"] and "'dur'" in rejects[1]["reason"] and "2^62" in rejects[2]["reason"]
    checked = cli(live, "check-trace", str(path), check=False)  # the same validator
    said = " ".join(checked.stdout.split())  # the console may wrap long lines
    assert checked.returncode == 1 and all(f"{path}: {r['reason']}" in said for r in rejects), said
