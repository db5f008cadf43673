"""Disk faults: an unwritable spool while the broker is down, an unwritable database path. The
training side never raises and says why it dropped; the materializer stops with one line."""

import os
import subprocess
import sys

from rankstream.deploy.memory_bus import MemoryBus
from rankstream.producers import Producer
from rankstream.synthetic import SyntheticJob, run_synthetic_rank


def test_unwritable_spool_with_the_broker_down_drops_counts_and_says_why(make_config, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the spool directory should be")
    config = make_config(**{"producer.spool_dir": str(blocker / "spool")})
    bus = MemoryBus(partitions=2)
    bus.available = False  # the broker is down for the whole run
    producer = Producer(run_id="diskfull", rank=0, world_size=1, config=config, bus=bus)
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
