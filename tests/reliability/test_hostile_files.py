"""Hostile input files: each gets one line naming it and the problem, exit code 2, and nothing of
the import is published (every file is checked before the first message leaves; here no broker
even listens, so an attempt to publish would fail with a different error)."""

import gzip
import os
import subprocess
import sys

import pytest

from rankstream.producers.importing import MAX_INPUT_BYTES

GOOD_TRACE = b'[{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 0, "tid": 0}]'


def make_bad_inputs(root):
    """name -> path of a bad input, for the trace importer."""
    root.mkdir(exist_ok=True)
    cases = {}

    def write(name, data):
        path = root / name
        path.write_bytes(data)
        cases[name] = path

    write("empty_rank0.json", b"")
    write("binary_rank0.json", os.urandom(4096))
    write("truncated_rank0.json", b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 0, "tid"')
    write("not_events_rank0.json", b'{"traceEvents": [1, 2, 3]}')
    write("bad_phase_rank0.json", b'[{"ph": "Q", "name": "a", "ts": 1}]')
    write("negative_dur_rank0.json", b'[{"ph": "X", "name": "a", "ts": 1, "dur": -5, "pid": 0, "tid": 0}]')
    write("nan_ts_rank0.json", b'[{"ph": "X", "name": "a", "ts": NaN, "dur": 1, "pid": 0, "tid": 0}]')
    write("corrupt_rank0.json.gz", gzip.compress(GOOD_TRACE)[:-12] + b"garbage!")
    enormous = root / "enormous_rank0.json"
    with open(enormous, "wb") as handle:  # sparse: takes no disk
        handle.truncate(MAX_INPUT_BYTES + 1)
    cases["enormous_rank0.json"] = enormous
    (root / "a_directory_rank0.json").mkdir()
    cases["a_directory_rank0.json"] = root / "a_directory_rank0.json"
    (root / "broken_rank0.json").symlink_to(root / "nowhere.json")
    cases["broken_rank0.json"] = root / "broken_rank0.json"
    (root / "device_rank0.json").symlink_to("/dev/zero")
    cases["device_rank0.json"] = root / "device_rank0.json"
    os.mkfifo(root / "fifo_rank0.json")
    cases["fifo_rank0.json"] = root / "fifo_rank0.json"
    return cases


def run_import(tmp_path, *args):
    env = {**os.environ, "RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "RANKSTREAM_DB_PATH": str(tmp_path / "db"),
           "RANKSTREAM_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run([sys.executable, "-m", "rankstream", "import", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_every_bad_trace_file_gets_one_line_and_nothing_is_imported(tmp_path):
    good = tmp_path / "good_rank1.json"
    good.write_bytes(GOOD_TRACE)
    for name, path in make_bad_inputs(tmp_path / "bad").items():
        result = run_import(tmp_path, "trace", str(good), str(path), "--run", "hostile")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (name, result.stderr)
        assert len(lines) == 1 and name in lines[0], (name, result.stderr)
        assert "Kafka" not in lines[0] and "broker" not in lines[0].lower(), (name, lines[0])


@pytest.mark.parametrize("content", [b"", b"\x80\x04garbage", b"not a pickle at all", b'{"entries": 5}'])
def test_bad_flight_recorder_dumps_get_one_line(tmp_path, content):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "rank_0").write_bytes(content)
    result = run_import(tmp_path, "fr", str(dumps), "--prefix", "rank_")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "rank_0" in lines[0], result.stderr
