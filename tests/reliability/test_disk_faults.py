"""Disk faults: an unwritable or full spool while the broker is down, an unwritable database path,
a disk that fills up under DuckDB. The training side never raises and says why it dropped; the
materializer stops with one line for a bad path, and for a full disk says why once and keeps
retrying, with nothing half-imported."""

import json
import os
import subprocess
import sys

import duckdb

from tests.doubles import MemoryBus, MemoryTransport
from rankstream.producers.producer import Producer
from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank


def test_unwritable_spool_with_the_broker_down_drops_counts_and_says_why(make_config, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the spool directory should be")
    config = make_config(**{"producer.spool_dir": str(blocker / "spool")})
    bus = MemoryBus(partitions=2)
    bus.available = False  # the broker is down for the whole run
    producer = Producer(run_id="diskfull", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    emitted = run_synthetic_rank(SyntheticJob("diskfull", 1, 20, events_per_step=500), 0, producer)  # never raises
    stats = producer.close(timeout_s=2)
    assert stats.events_emitted == emitted
    assert stats.events_sent == 0 and stats.events_spooled == 0
    assert stats.events_dropped == emitted  # every event is accounted for as dropped
    assert stats.last_error and "spool" in stats.last_error and "not-a-directory" in stats.last_error


def test_a_database_path_that_cannot_be_written_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    env = {**os.environ, "RANKSTREAM_DB_PATH": str(blocker / "sub" / "rs.duckdb"),
           "RANKSTREAM_STATE_DIR": str(tmp_path / "state"), "RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}
    result = subprocess.run([sys.executable, "-m", "rankstream", "consume", "--once"], env=env, capture_output=True,
                            text=True, timeout=60)
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert result.returncode == 2 and len(errors) == 1 and "rs.duckdb" in errors[0], result.stderr


# A disk that fills up: RLIMIT_FSIZE makes writes past the limit fail (EFBIG, with SIGXFSZ
# ignored) in a child process, as a full disk would. The child runs the real producer or
# materializer against the in-memory bus and reports as JSON.
_FULL_DISK_CHILD = r'''
import json, resource, signal, sys, threading, time
import duckdb
from rankstream.schemas.settings import load_config
from rankstream.consumers.materializer import Materializer
from rankstream.consumers.store import Store
from tests.doubles import MemoryBus, MemorySource, MemoryTransport
from rankstream.producers.producer import Producer
from rankstream.schemas import all_topics
from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank

what, root, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = load_config({"state_dir": root, "db_path": root + "/rs.duckdb", "topic_prefix": "full"}, env={})
bus = MemoryBus(partitions=2)
bus.available = what != "spool"  # the spool is only written while the broker is down
producer = Producer(run_id="full", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
emitted = run_synthetic_rank(SyntheticJob("full", 1, 400, events_per_step=500), 0, producer)
stats = producer.close(timeout_s=2)
report = {"emitted": emitted, "spooled": stats.events_spooled, "dropped": stats.events_dropped,
          "last_error": stats.last_error}
if what == "database":
    lines = []
    store = Store(duckdb.connect(config.db_path))
    stop = threading.Event()
    thread = threading.Thread(target=Materializer(config, store, MemorySource(bus, all_topics("full")),
                                                  log=lines.append).run, args=(stop,))
    thread.start()
    time.sleep(6)
    stop.set()
    thread.join(30)
    report["log"] = lines
print(json.dumps(report))
'''


def _full_disk_child(what: str, root, limit_bytes: int) -> dict:
    result = subprocess.run([sys.executable, "-c", _FULL_DISK_CHILD, what, str(root), str(limit_bytes)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_full_disk_under_the_spool_drops_counts_and_never_raises_in_training(tmp_path):
    report = _full_disk_child("spool", tmp_path, 2 << 20)
    assert 0 < report["spooled"] < report["emitted"]  # the first 2 MB fit
    assert report["spooled"] + report["dropped"] == report["emitted"]
    assert "spool" in report["last_error"] and "too large" in report["last_error"].lower()


def test_a_full_disk_under_duckdb_is_reported_and_nothing_is_half_imported(tmp_path):
    report = _full_disk_child("database", tmp_path, 1 << 20)
    complaints = [line for line in report["log"] if "write failed" in line]
    assert complaints and len(complaints) == len(set(complaints)), report["log"]  # said once, not once per retry
    con = duckdb.connect(str(tmp_path / "rs.duckdb"))  # room again: the WAL replays to a committed state
    rows, batch_events = con.execute("SELECT (SELECT count(*) FROM trace_events), "
                                     "(SELECT coalesce(sum(events), 0) FROM ingested_batches)").fetchall()[0]
    con.close()
    assert rows == batch_events < report["emitted"]
