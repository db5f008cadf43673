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


def _pickle_bomb() -> bytes:
    """About 500 bytes naming 10^13 sizes through shared references (the probe's input)."""
    import pickle

    sizes: list = [1] * 10
    for _ in range(12):
        sizes = [sizes] * 10
    entry = {"record_id": 1, "profiling_name": "nccl:all_reduce", "input_sizes": sizes, "collective_seq_id": 1,
             "process_group": ("0", "default_pg")}
    return pickle.dumps({"version": "2.4", "entries": [entry] * 5})


@pytest.mark.parametrize("command", [["import", "fr"], ["diagnose"]])
def test_a_pickle_bomb_is_refused_in_one_line(tmp_path, command):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "rank_0").write_bytes(_pickle_bomb())
    env = {**os.environ, "RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "RANKSTREAM_DB_PATH": str(tmp_path / "db"),
           "RANKSTREAM_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run([sys.executable, "-m", "rankstream", *command, str(dumps), "--prefix", "rank_"],
                            capture_output=True, text=True, timeout=60, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "rank_0" in lines[0] and "expand" in lines[0], result.stderr


@pytest.mark.timed
def test_reading_a_pickle_bomb_stops_within_a_second_and_100_mb(tmp_path):
    """Measured in a fresh interpreter: the time and the peak memory the read itself adds."""
    path = tmp_path / "rank_0"
    path.write_bytes(_pickle_bomb())
    probe = ("import resource, sys, time\n"
             "from rankstream.producers.fr_reader import parse_dump\n"
             "from rankstream.schemas.errors import BadInput\n"
             "raw = open(sys.argv[1], 'rb').read()\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "started = time.perf_counter()\n"
             "try:\n    parse_dump(raw, 'bomb')\nexcept BadInput:\n    pass\nelse:\n    sys.exit('accepted')\n"
             "print(time.perf_counter() - started, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    seconds, megabytes = map(float, done.stdout.split())
    assert seconds <= 1.0 and megabytes <= 100, (seconds, megabytes)


def test_diagnose_names_the_file_of_an_entry_that_does_not_fit(tmp_path):
    import pickle

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    entry = {"record_id": 2**64 + 5, "profiling_name": "nccl:all_reduce", "input_sizes": [[4]], "collective_seq_id": 1,
             "process_group": ("0", "default_pg")}
    (dumps / "rank_0").write_bytes(pickle.dumps({"entries": [entry]}))
    result = subprocess.run([sys.executable, "-m", "rankstream", "diagnose", str(dumps), "--prefix", "rank_"],
                            capture_output=True, text=True, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "rank_0" in lines[0] and "record_id" in lines[0], result.stderr
