"""A stale pid file never points a signal at someone else's process (`down` after a reboot or a
crash, when the pid was reused)."""

from __future__ import annotations

import json
import subprocess
import sys

from rankstream.schemas.processes import is_process, start_ticks
from rankstream.schemas.settings import load_config


def test_down_leaves_alone_a_process_that_reuses_a_recorded_pid(tmp_path):
    from rankstream.services import down, materializer_pid

    config = load_config({"state_dir": tmp_path / "state", "db_path": tmp_path / "x.duckdb"}, env={})
    config.state_dir.mkdir(parents=True)
    bystanders = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        materializer, broker = bystanders
        # recorded with another start time (the pid was reused), and the broker in an older format
        (config.state_dir / "materializer.pid").write_text(f"{materializer.pid} {start_ticks(materializer.pid) - 1}")
        (config.state_dir / "broker.json").write_text(json.dumps(
            {"pid": broker.pid, "port": 1, "bootstrap": "127.0.0.1:1", "log": "x"}))
        assert materializer_pid(config) is None
        down(config)
        assert all(process.poll() is None for process in bystanders)  # neither got a signal
    finally:
        for process in bystanders:
            process.kill()
            process.wait()


def test_a_recorded_process_is_recognized_by_its_start_time():
    me = __import__("os").getpid()
    assert is_process(me, start_ticks(me), command_has="no-such-word")
    assert not is_process(me, start_ticks(me) + 1, command_has="python")
    assert is_process(me, None, command_has="python") and not is_process(me, None, command_has="tansu")
