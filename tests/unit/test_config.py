from pathlib import Path

import pytest

from rankstream.schemas.settings import config_env, load_config
from rankstream.schemas.errors import ConfigError


def test_defaults_are_the_embedded_setup():
    config = load_config(env={})
    assert config.db_path == Path("rankstream.duckdb")
    assert config.uses_embedded_broker
    assert config.bootstrap_servers == "127.0.0.1:29092"


def test_override_beats_environment_beats_file(tmp_path):
    config_file = tmp_path / "rs.toml"
    config_file.write_text('db_path = "from_file.duckdb"\npartitions = 3\n[producer]\nbatch_events = 7\n')
    env = {"RANKSTREAM_CONFIG": str(config_file), "RANKSTREAM_DB_PATH": "from_env.duckdb",
           "RANKSTREAM_PRODUCER_BATCH_EVENTS": "9"}
    config = load_config({"db_path": "from_flag.duckdb"}, env=env)
    assert config.db_path == Path("from_flag.duckdb")
    assert config.producer.batch_events == 9
    assert config.partitions == 3
    assert load_config(env=env).db_path == Path("from_env.duckdb")


def test_bad_value_names_key_value_and_source():
    with pytest.raises(ConfigError) as error:
        load_config(env={"RANKSTREAM_PARTITIONS": "many"})
    assert "partitions" in str(error.value) and "'many'" in str(error.value)
    assert "RANKSTREAM_PARTITIONS" in str(error.value)


def test_a_materializer_memory_limit_too_small_for_duckdb_is_refused():
    assert load_config(env={"RANKSTREAM_MATERIALIZER_MEMORY_MB": "64"}).materializer_memory_mb == 64
    with pytest.raises(ConfigError, match="materializer_memory_mb=63 must be at least 64"):
        load_config(env={"RANKSTREAM_MATERIALIZER_MEMORY_MB": "63"})


def test_unknown_setting_is_refused_with_the_known_ones_listed():
    with pytest.raises(ConfigError, match="unknown setting 'db_pth'.*db_path"):
        load_config({"db_pth": "x"}, env={})


def test_password_comes_from_a_file_and_never_shows(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    config = load_config(env={"RANKSTREAM_KAFKA_SASL_PASSWORD_FILE": str(secret),
                              "RANKSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    assert config.kafka.sasl_password == "hunter2"
    assert config.kafka.client_options()["sasl_plain_password"] == "hunter2"
    assert "hunter2" not in repr(config)
    assert "hunter2" not in str(config_env(config))


def test_config_env_round_trips_through_the_environment(tmp_path):
    config = load_config({"db_path": tmp_path / "x.duckdb", "producer.spool_max_bytes": 1234,
                          "kafka.bootstrap_servers": "k1:9092,k2:9092"}, env={})
    again = load_config(env=config_env(config))
    assert again == config


@pytest.mark.parametrize("run_id", ["..", ".", "../../etc", "a/../../b", "/abs", "x\\y", "run 1;rm -rf", "ok-run.1"])
def test_a_run_id_becomes_one_file_name_inside_its_folder(run_id, tmp_path):
    from rankstream.schemas.config import path_safe

    name = path_safe(run_id)
    assert (tmp_path / name).resolve().parent == tmp_path.resolve() and name not in (".", "..")
    assert name == run_id or run_id != "ok-run.1"
