"""The external-cluster recipe of docs/multinode.md, as written: its settings reach kafka-python's
producer and consumer unchanged (no cluster runs here, so the clients are stand-ins that record
what they were given)."""

from __future__ import annotations

import re
from pathlib import Path

from rankstream.consumers import source
from rankstream.producers import transport
from rankstream.schemas.settings import load_config

RECIPE = (Path(__file__).resolve().parents[2] / "docs" / "multinode.md").read_text()


def _recipe_environment(tmp_path) -> dict[str, str]:
    block = RECIPE[RECIPE.index("## An external Kafka cluster"):]
    env = dict(re.findall(r"^export (RANKSTREAM_\w+)=(\S+)$", block, flags=re.M))
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    env["RANKSTREAM_KAFKA_SASL_PASSWORD_FILE"] = str(password)  # the recipe's path, made real here
    return env


class _Recorded(Exception):
    pass


def _recording(seen: dict):
    def client(*args, **kwargs):
        seen.update(kwargs)
        raise _Recorded()

    return client


def test_the_recipe_settings_reach_the_producer_and_the_consumer(tmp_path, monkeypatch):
    config = load_config({"state_dir": tmp_path / "state"}, env=_recipe_environment(tmp_path))
    expected = {"bootstrap_servers": ["kafka-1.example.com:9093", "kafka-2.example.com:9093"],
                "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": "training", "sasl_plain_password": "s3cret",
                "ssl_cafile": "/etc/ssl/certs/kafka-ca.pem"}
    produced, consumed = {}, {}
    monkeypatch.setattr(transport, "KafkaProducer", _recording(produced))
    monkeypatch.setattr(source, "KafkaConsumer", _recording(consumed))
    monkeypatch.setattr(transport, "unreachable", lambda *a, **k: None)  # as if the cluster answered
    monkeypatch.setattr(transport, "ensure_topics", lambda *a, **k: [])
    transport.KafkaTransport(config).connect()
    try:
        source.KafkaSource(config, ["team-a.trace"]).open({})
    except Exception:
        pass
    for seen in (produced, consumed):
        assert {k: seen.get(k) for k in expected} == expected, seen
    assert config.topic_prefix == "team-a" and not config.uses_embedded_broker
