"""The importers' first pass: every accepted format, rank detection, and one-line errors."""

import gzip
import json
import pickle

import pytest

from rankstream.schemas.errors import BadInput
from rankstream.producers.fr_reader import read_fr_directory
from rankstream.producers.import_trace import scan_trace

EVENTS = [
    {"ph": "X", "name": "ProfilerStep#4", "pid": 7, "tid": 7, "ts": 100.0, "dur": 50.0},
    {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 7, "tid": 7, "ts": 110.5, "dur": 3.25},
    {"ph": "i", "name": "mark", "pid": "Spans", "tid": "x", "ts": 120.0},
]


def write(path, data, compress=False):
    text = data if isinstance(data, str) else json.dumps(data)
    if compress:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_kineto_object_with_base_time_and_distributed_info(tmp_path):
    trace = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 3, "world_size": 4},
             "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": EVENTS}
    info = scan_trace(write(tmp_path / "worker.json", trace))
    assert (info.events, info.rank, info.world_size, info.base_ns) == (3, 3, 4, 1_700_000_000_000_000_000)
    assert info.steps[7] == ([100_000], [150_000], [4])


def test_plain_array_gzip_and_rank_from_file_name(tmp_path):
    info = scan_trace(write(tmp_path / "ep0-ba1-rank2.json.gz", EVENTS, compress=True))
    assert (info.events, info.rank, info.base_ns) == (3, 2, 0)


def test_unterminated_arrays_from_a_dead_writer_are_read(tmp_path):
    text = json.dumps(EVENTS)[:-1]  # no closing bracket
    assert scan_trace(write(tmp_path / "rank0.json", text)).events == 3
    assert scan_trace(write(tmp_path / "rank1.json", text + ",\n")).events == 3


def test_merged_trace_takes_ranks_from_pids(tmp_path):
    merged = [dict(e, pid=r) for r in (0, 1) for e in EVENTS[:2]]
    info = scan_trace(write(tmp_path / "merged_trace.json", merged))
    assert info.ranks_from_pid and info.pids == {0, 1}


def test_a_file_that_does_not_say_its_rank_is_refused_or_takes_the_fallback(tmp_path):
    path = write(tmp_path / "worker.json", [dict(e, pid=123456) for e in EVENTS[:2]])
    with pytest.raises(BadInput, match="cannot tell the rank"):
        scan_trace(path)
    info = scan_trace(path, fallback_rank=0)
    assert (info.rank, info.rank_assumed, info.ranks_from_pid) == (0, True, False)
    named = scan_trace(write(tmp_path / "rank5.json", EVENTS), fallback_rank=0)
    assert (named.rank, named.rank_assumed) == (5, False)


def test_a_merged_trace_keeps_its_pid_ranks_despite_a_fallback(tmp_path):
    merged = [dict(e, pid=r) for r in (0, 1) for e in EVENTS[:2]]
    info = scan_trace(write(tmp_path / "merged_trace.json", merged), fallback_rank=0)
    assert info.ranks_from_pid and not info.rank_assumed


@pytest.mark.parametrize("content,problem", [
    ("", "empty file"),
    ("\x00\x01binary", "not a Chrome trace"),
    ('{"traceEvents": [{"ph": "X", "ts": 1}', "not readable as a Chrome trace: at byte 37: unexpected end of data"),
    ('[{"ph": "Q", "ts": 1}]', "unknown phase 'Q'"),
    ('[{"ph": "X", "name": "a", "ts": 1, "dur": -5}]', "'dur' must be a number of microseconds between 0"),
    ('{"traceEvents": []}', "contains no trace events"),
    ('[1, 2]', "not a JSON object (none of its 2 events is valid)"),
])
def test_bad_trace_files_get_one_line_naming_the_file(tmp_path, content, problem):
    path = write(tmp_path / "rank0.json", content)
    with pytest.raises(BadInput) as error:
        scan_trace(path)
    message = str(error.value)
    assert message.startswith(str(path)) and problem in message and "\n" not in message


def test_bad_events_among_good_ones_are_refused_one_by_one_and_named(tmp_path):
    """Missing times used to be stored as 0, times past int64 as NULL, a 65-bit pid as INT64_MIN."""
    good = {"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 0, "tid": 0}
    bad = {1: dict(good, ts=None), 2: {k: v for k, v in good.items() if k != "dur"}, 3: dict(good, ts=2e21),
           4: dict(good, ts="5"), 5: dict(good, pid=1.5), 6: dict(good, dur=-1), 7: dict(good, tid=[1]),
           8: {k: v for k, v in good.items() if k != "name"}}
    events = [bad.get(i, good) for i in range(10)] + [{"ph": "M", "name": "process_name", "pid": 0,
                                                      "args": {"name": "p"}}]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(events))
    info = scan_trace(path)
    assert info.events == 3
    assert [r["item"] for r in info.rejects] == sorted(bad)
    reasons = {r["item"]: r["reason"] for r in info.rejects}
    assert "'ts'" in reasons[1] and "'dur'" in reasons[2] and "2^62" in reasons[3] and "'ts'" in reasons[4]
    assert "'pid'" in reasons[5] and "'dur'" in reasons[6] and "'tid'" in reasons[7] and "'name'" in reasons[8]
    assert all(r["source"] == str(path) and json.loads(r["raw"]) for r in info.rejects)


def test_directories_and_broken_links_are_refused(tmp_path):
    (tmp_path / "rank0.json").mkdir()
    with pytest.raises(BadInput, match="is a directory"):
        scan_trace(tmp_path / "rank0.json")
    (tmp_path / "rank1.json").symlink_to(tmp_path / "missing")
    with pytest.raises(BadInput, match="broken symbolic link"):
        scan_trace(tmp_path / "rank1.json")


def test_fr_directory_reads_pickle_and_json_and_names_bad_files(tmp_path):
    entry = {"record_id": 0, "profiling_name": "nccl:all_reduce", "process_group": ["0", "default_pg"],
             "collective_seq_id": 1}
    (tmp_path / "rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [entry]}))
    (tmp_path / "rank_1").write_text(json.dumps({"version": "2.10", "entries": [entry]}))
    dumps = read_fr_directory(tmp_path, "rank_")
    assert [(d.rank, d.backend, len(d.entries)) for d in dumps] == [(0, "nccl", 1), (1, "nccl", 1)]
    (tmp_path / "rank_2").write_bytes(b"\x80\x04garbage")
    with pytest.raises(BadInput, match="rank_2: not a readable pickle"):
        read_fr_directory(tmp_path, "rank_")
    (tmp_path / "rank_2").write_text(json.dumps({"entries": [{"record_id": "x"}]}))
    with pytest.raises(BadInput, match="rank_2: entry 0: an FR entry needs"):
        read_fr_directory(tmp_path, "rank_")


PARALLEL_SCAN = """
import os, sys
from pathlib import Path
from rankstream.schemas.errors import BadInput
from rankstream.producers import import_trace
from rankstream.producers.batch_file import BatchFile

root = Path(sys.argv[1])
paths = sorted(root.glob("*.json"))
reader_pids = root / "reader_pids"
real_scan = import_trace.scan_trace

def recording_scan(*args, **kwargs):
    with open(reader_pids, "a") as out:
        out.write(f"{os.getpid()}\\n")
    return real_scan(*args, **kwargs)

import_trace.scan_trace = recording_scan
import_trace.PARALLEL_READ_BYTES = 0
(root / "par").mkdir()
parallel = import_trace.scan_files(paths, None, 7, directory=root / "par")
readers = set(reader_pids.read_text().split())
assert readers and str(os.getpid()) not in readers, readers  # either forked reader may take both files
(root / "seq").mkdir()
sequential = [import_trace._scan_into(p, None, 7, root / "seq" / str(i)) for i, p in enumerate(paths)]
assert parallel == sequential
for i in range(len(paths)):
    with BatchFile(root / "par" / str(i)) as a, BatchFile(root / "seq" / str(i)) as b:
        assert [x.to_wire() for x in a] == [y.to_wire() for y in b]
(root / "rank1.json").write_text('[{"ph": "X", "ts": 1}, {"ph": "Q"}]')
(root / "bad").mkdir()
try:
    import_trace.scan_files(paths, None, 7, directory=root / "bad")
except BadInput as error:
    print("ERROR", error)
"""


def test_files_read_by_parallel_readers_match_reading_them_here(tmp_path):
    """Two files read in forked reader processes (never here): the same first-pass results and
    batches as one by one, and a bad file's one-line error comes back through the pool."""
    import subprocess
    import sys

    for rank in (0, 1):
        events = [dict(e, pid=rank) for e in EVENTS[:2]] * 30
        write(tmp_path / f"rank{rank}.json", {"traceEvents": events, "baseTimeNanoseconds": 5})
    done = subprocess.run([sys.executable, "-c", PARALLEL_SCAN, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"ERROR {tmp_path / 'rank1.json'}: event 0: phase X needs a string 'name' "
                                   "(none of its 2 events is valid)")
