"""``rankstream merge``: per-rank Composer traces to one Chrome trace on one clock, no broker."""

import json
import subprocess
import sys

import pytest

from rankstream.schemas.errors import BadInput
from rankstream.flows.chrome_trace import check_chrome_trace
from rankstream.flows.merge_traces import merge_trace_files

EPOCH_US = 1_700_000_000_000_000


def write_rank(path, rank, ahead_us, ops):
    """A Composer per-rank trace whose clock reads ``ahead_us`` ahead of true time: the same
    ops at the same true instants on every rank, and the clock-sync reading Composer records."""
    events = [
        {"name": "process_name", "ph": "M", "ts": EPOCH_US + ahead_us, "pid": rank, "tid": 1000,
         "args": {"name": f"Rank {rank} training loop process"}},
        {"name": "clock_sync_timestamp_us", "ph": "M", "ts": EPOCH_US + ahead_us, "pid": rank, "tid": 1000,
         "args": {"value": EPOCH_US + 5 + ahead_us}},
        {"name": "clock_sync_error_bound", "ph": "M", "ts": EPOCH_US + ahead_us, "pid": rank, "tid": 1000,
         "args": {"value": 40}},
    ]
    events += [{"name": f"op{i}", "cat": "cpu_op", "ph": "X", "ts": EPOCH_US + 100 * i + ahead_us, "dur": 50,
                "pid": rank, "tid": 1001, "args": {"External id": i}} for i in range(ops)]
    path.write_text(json.dumps(events))


def test_ranks_land_on_one_clock_in_one_valid_trace(tmp_path):
    write_rank(tmp_path / "rank0.json", 0, 0, ops=50)
    write_rank(tmp_path / "rank1.json", 1, 3_000, ops=50)  # rank 1's clock is 3 ms ahead
    output = tmp_path / "merged.json.gz"
    merged = merge_trace_files([tmp_path / "rank0.json", tmp_path / "rank1.json"], output)
    problems, summary = check_chrome_trace(output)
    assert problems == []
    chosen = {e["rank"]: e for e in merged.offsets if e["chosen"]}
    assert chosen[1]["source"] == "barrier" and abs(chosen[1]["offset_ns"] - 3_000_000) <= chosen[1]["error_ns"]
    import gzip

    events = json.loads(gzip.decompress(output.read_bytes()))["traceEvents"]
    starts = {}
    for event in events:
        if event.get("cat") == "cpu_op":
            starts.setdefault(event["name"], {})[event["pid"]] = event["ts"]
    assert len(starts) == 50
    assert all(set(by_rank) == {0, 1} and by_rank[0] == by_rank[1] for by_rank in starts.values())


def test_a_trace_composer_already_merged_is_not_shifted_again(tmp_path):
    """Composer's merger shifts every event by the clock-sync readings and keeps the readings."""
    write_rank(tmp_path / "rank0.json", 0, 0, ops=20)
    write_rank(tmp_path / "rank1.json", 1, 3_000, ops=20)
    merged = []
    for rank in (0, 1):
        events = json.loads((tmp_path / f"rank{rank}.json").read_text())
        shift = 3_000 * rank  # this rank's clock-sync reading minus rank 0's
        merged += [{**e, "ts": e["ts"] - shift} for e in events]
    (tmp_path / "composer_merged.json").write_text(json.dumps(merged))
    output = tmp_path / "out.json"
    result = merge_trace_files([tmp_path / "composer_merged.json"], output)
    assert {e["rank"]: e["offset_ns"] for e in result.offsets if e["chosen"]} == {0: 0, 1: 0}
    starts = {}
    for event in json.loads(output.read_text())["traceEvents"]:
        if event.get("cat") == "cpu_op":
            starts.setdefault(event["name"], set()).add(event["ts"])
    assert len(starts) == 20 and all(len(times) == 1 for times in starts.values())


def test_a_bad_file_is_named_and_nothing_is_written(tmp_path):
    write_rank(tmp_path / "rank0.json", 0, 0, ops=5)
    (tmp_path / "rank1.json").write_text('[{"ph": "X", "name": "a", "ts": "soon"}]')
    output = tmp_path / "merged.json"
    with pytest.raises(BadInput, match="rank1.json: event 0: 'ts' must be a number"):
        merge_trace_files([tmp_path / "rank0.json", tmp_path / "rank1.json"], output)
    assert not output.exists()
    command = subprocess.run([sys.executable, "-m", "rankstream", "merge", str(tmp_path / "rank0.json"),
                              str(tmp_path / "rank1.json"), "-o", str(output)], capture_output=True, text=True)
    assert command.returncode == 2 and command.stderr.strip().splitlines() == [
        f"rankstream: error: {tmp_path / 'rank1.json'}: event 0: 'ts' must be a number of microseconds within "
        "2^62 ns (got 'soon') (none of its 1 events is valid)"]
    assert not output.exists()


def _events(path):
    import gzip

    text = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    return sorted(json.dumps(e, sort_keys=True) for e in json.loads(text)["traceEvents"])


def test_duckdb_and_the_importer_read_files_into_the_same_timeline(tmp_path, monkeypatch):
    """Plain arrays go to DuckDB's reader, gzip files to the importer's; the merged events agree."""
    import gzip

    import rankstream.flows.merge_traces as merge_traces

    write_rank(tmp_path / "rank0.json", 0, 0, ops=30)
    write_rank(tmp_path / "rank1.json", 1, 2_000, ops=30)
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json.gz").write_bytes(gzip.compress((tmp_path / f"rank{rank}.json").read_bytes()))
    scanned = []
    real_scan = merge_traces.scan_files
    monkeypatch.setattr(merge_traces, "scan_files", lambda paths, *a, **k: scanned.extend(paths) or real_scan(paths, *a, **k))
    plain = merge_trace_files([tmp_path / "rank0.json", tmp_path / "rank1.json"], tmp_path / "plain.json")
    assert scanned == []
    mixed = merge_trace_files([tmp_path / "rank0.json", tmp_path / "rank1.json.gz"], tmp_path / "mixed.json")
    assert scanned == [tmp_path / "rank1.json.gz"]
    assert [(f.rank, f.events) for f in plain.files] == [(f.rank, f.events) for f in mixed.files] == [(0, 33), (1, 33)]
    assert _events(tmp_path / "plain.json") == _events(tmp_path / "mixed.json")
    assert plain.offsets == mixed.offsets
