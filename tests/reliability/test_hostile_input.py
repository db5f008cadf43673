"""Hostile files, SQL and secrets: no code runs, values never become SQL, secrets never leak."""

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from rankstream.schemas.settings import load_config
from tests.doubles import MemorySource, MemoryTransport
from rankstream.consumers.store import Store
from tests.doubles import MemoryBus
from rankstream.producers.producer import Producer
from rankstream.schemas import all_topics
from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank

from ..unit.run_builder import build_run

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("rankstream", "schemas", "producers", "consumers", "flows", "deploy")
INJECTIONS = ("x'; DROP TABLE trace_events; --", "' OR '1'='1", 'built" OR 1=1 --', "built'")


def rankstream(db: Path, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rankstream", "--db", str(db), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_no_plain_unpickling_anywhere_in_the_code_base():
    plain = re.compile(r"\bpickle\.(loads?|Unpickler)\b|\bfrom pickle import\b.*\b(loads?|Unpickler)\b")
    offenders = []
    for folder in SOURCE_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "safe_pickle.py":  # the restricted unpickler itself subclasses pickle.Unpickler
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if plain.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_malicious_flight_recorder_pickle_runs_nothing_and_gets_one_line(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    marker = tmp_path / "pwned"
    (dumps / "rank_0").write_bytes(pickle.dumps({"version": "2.4", "entries": [_Exploit(marker)]}))
    result = rankstream(tmp_path / "x.duckdb", "diagnose", str(dumps), "--prefix", "rank_")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank_0" in lines[0] and "system" in lines[0]
    assert not marker.exists()


@pytest.fixture(scope="module")
def built_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("hostile") / "built.duckdb"
    build_run(db, run_id="built", world_size=2, steps=2)
    return db


def _events(db: Path) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM trace_events").fetchall()[0][0]
    finally:
        con.close()


@pytest.mark.parametrize("value", INJECTIONS)
def test_run_ids_from_the_command_line_are_bound_not_pasted(built_db, value, tmp_path):
    before = _events(built_db)
    for args in (["report", "--run", value], ["analyze", "run", "--run", value],
                 ["timeline", "--run", value, "-o", str(tmp_path / "t.json")]):
        result = rankstream(built_db, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stderr.count("\n") == 1 and "rankstream: error:" in result.stderr
    bound = rankstream(built_db, "sql", "--json", "-p", value, "SELECT count(*) AS n FROM trace_events WHERE run_id = ?")
    assert bound.returncode == 0 and '"n": 0' in bound.stdout
    assert _events(built_db) == before


def test_sql_is_read_only_unless_asked(built_db):
    before = _events(built_db)
    for statement in ("DROP TABLE trace_events", "DELETE FROM trace_events", "COPY trace_events TO '/tmp/x.csv'",
                      "SELECT 1; DROP TABLE trace_events"):
        result = rankstream(built_db, "sql", statement)
        assert result.returncode == 2, statement
    assert _events(built_db) == before


def test_a_sasl_password_never_reaches_logs_status_or_duckdb(tmp_path):
    secret = "s3cr3t-Pa55word-77"
    password_file = tmp_path / "password"
    password_file.write_text(secret + "\n")
    env = {"RANKSTREAM_KAFKA_SASL_PASSWORD_FILE": str(password_file), "RANKSTREAM_KAFKA_SASL_USERNAME": "alice",
           "RANKSTREAM_KAFKA_SASL_MECHANISM": "PLAIN", "RANKSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}
    db = tmp_path / "secret.duckdb"
    config = load_config({"db_path": db, "state_dir": tmp_path / "state", "topic_prefix": "sec"},
                         env={**env, "RANKSTREAM_KAFKA_SASL_PASSWORD": secret})
    assert config.kafka.sasl_password == secret and secret not in repr(config)
    bus = MemoryBus(partitions=2)
    producer = Producer(run_id="secret-run", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    run_synthetic_rank(SyntheticJob("secret-run", 1, 2, events_per_step=40), 0, producer)
    producer.close()
    store = Store(duckdb.connect(str(db)))
    source = MemorySource(bus, all_topics("sec"))
    source.open(store.offsets())
    while records := source.poll(0, 50):
        store.write(records)
    store.connection.close()
    status = rankstream(db, "status", "--json", env={**env, "RANKSTREAM_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert secret not in status.stdout + status.stderr
    for path in [db, *tmp_path.rglob("*")]:
        if path.is_file() and path != password_file:
            assert secret.encode() not in path.read_bytes(), path
