"""The real ``rankstream`` command: broker lifecycle, up/down, status, sql output formats, errors."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rankstream.schemas.settings import config_env
from rankstream.producers.producer import Producer

from .conftest import cli, free_port

pytestmark = pytest.mark.integration


def test_broker_start_status_stop(make_config):
    config = make_config(broker_port=free_port())
    assert cli(config, "broker", "status", check=False).returncode == 1
    assert "broker up" in cli(config, "broker", "start").stdout
    assert "running at" in cli(config, "broker", "status").stdout
    assert "broker up" in cli(config, "broker", "start").stdout  # idempotent
    assert "broker stopped" in cli(config, "broker", "stop").stdout
    assert cli(config, "broker", "status", check=False).returncode == 1


def test_up_query_status_down(make_config):
    config = make_config(broker_port=free_port())
    try:
        assert "materializer pid" in cli(config, "up").stdout
        producer = Producer(run_id="cli-run", rank=0, world_size=1, config=config)
        for i in range(1234):
            producer.emit("op", ts_ns=i + 1, step=i // 100)
        producer.close()
        deadline = time.monotonic() + 15
        rows = []
        while time.monotonic() < deadline:
            rows = json.loads(cli(config, "sql", "--json", "SELECT count(*) AS n FROM trace_events").stdout)
            if rows[0]["n"] == 1234:
                break
            time.sleep(0.2)
        assert rows == [{"n": 1234}]
        csv_out = cli(config, "sql", "--csv", "SELECT DISTINCT name FROM trace_events").stdout.splitlines()
        assert csv_out == ["name", "op"]
        injected = cli(config, "sql", "--json", "-p", "cli-run' OR '1'='1",
                       "SELECT count(*) AS n FROM trace_events WHERE run_id = ?").stdout
        assert json.loads(injected) == [{"n": 0}]
        refused = cli(config, "sql", "DROP TABLE trace_events", check=False)
        assert refused.returncode == 2 and "read-only" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) <= 3  # one message, no traceback
        report = json.loads(cli(config, "status", "--json").stdout)
        assert report["materializer"]["running"]
        run = next(r for r in report["runs"] if r["run_id"] == "cli-run")
        assert run["events"] == 1234 and run["dropped"] == 0 and run["missing_messages"] == 0
        assert "cli-run" in cli(config, "status").stdout
    finally:
        stopped = cli(config, "down").stdout
    assert "materializer" in stopped and "embedded broker" in stopped


@pytest.mark.timed
def test_unreachable_broker_gets_one_clear_retrying_line(make_config):
    config = make_config(broker_port=free_port())
    process = subprocess.Popen([sys.executable, "-m", "rankstream", "consume"],
                               env={**os.environ, **config_env(config)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # long enough for two retries
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    complaints = [line for line in stderr.splitlines() if "did not answer" in line]
    assert len(complaints) == 1, stderr
    assert config.bootstrap_servers in complaints[0] and "retrying" in complaints[0]
    assert "Traceback" not in stderr
    assert process.returncode == 0


def test_bad_configuration_is_one_line_and_exit_2(make_config):
    config = make_config()
    result = cli(config, "--broker-port", "99999", "status", check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("rankstream: error: broker_port=99999")


HOLD = """
import duckdb, sys
con = duckdb.connect(sys.argv[1])
print("holding", flush=True)
sys.stdin.readline()  # hold until the test has seen the waiting line
"""


def test_locked_database_gets_one_clear_retrying_line_then_proceeds(kafka_config):
    config = kafka_config()
    producer = Producer(run_id="locked", rank=0, world_size=1, config=config, confirm_stored=False)  # no materializer yet
    producer.emit("op", ts_ns=1)
    producer.close()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(config.db_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    consume = subprocess.Popen([sys.executable, "-m", "rankstream", "consume", "--once"],
                               env={**os.environ, **config_env(config)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen = []  # up to the waiting line (the CLI's header comes first, and rich may wrap it)
    for line in consume.stderr:
        seen.append(line)
        if "held by another process" in line:
            break
    holder.communicate("release\n", timeout=30)
    _, rest = consume.communicate(timeout=60)
    stderr = "".join(seen) + rest
    complaints = [line for line in stderr.splitlines() if "held by another process" in line]
    assert len(complaints) == 1 and f"pid {holder.pid}" in complaints[0] and "retrying" in complaints[0], stderr
    assert "Traceback" not in stderr and "1 events" in stderr
    assert consume.returncode == 0


def test_bad_import_file_is_one_line_and_exit_2(make_config, tmp_path):
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    result = cli(make_config(), "import", "trace", str(bad), check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"rankstream: error: {bad}: not readable as a Chrome trace: "
                                                  + result.stderr.split("Chrome trace: ", 1)[1].strip()]
