"""Configuration: the only module that reads environment variables.

Every setting has one name (``section.key`` or ``key``) and is looked up, first match wins, in:

1. explicit overrides (CLI flags, keyword arguments), e.g. ``{"db_path": "x.duckdb"}``;
2. the environment: ``RANKSTREAM_<KEY>`` for top-level keys, ``RANKSTREAM_<SECTION>_<KEY>`` otherwise
   (``RANKSTREAM_DB_PATH``, ``RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS``, ``RANKSTREAM_PRODUCER_SPOOL_MAX_BYTES``);
3. a TOML file: ``RANKSTREAM_CONFIG`` or ``./rankstream.toml`` if it exists (sections as TOML tables);
4. the embedded defaults: local Tansu broker on 127.0.0.1:29092 and ``./rankstream.duckdb``.

Secrets (``kafka.sasl_password``) may also come from a file (``RANKSTREAM_KAFKA_SASL_PASSWORD_FILE``);
they are never printed (``repr=False``) and never stored in DuckDB.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rankstream.errors import ConfigError

__all__ = ["KafkaSettings", "ProducerSettings", "Config", "load_config", "config_env", "env_flag", "ENV_PREFIX",
           "LaunchEnvironment", "launch_environment", "enable_flight_recorder", "flight_recorder_buffer_size"]

ENV_PREFIX = "RANKSTREAM_"
EMBEDDED_HOST = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class KafkaSettings:
    """How to reach Kafka. ``bootstrap_servers=None`` means the embedded local broker."""

    bootstrap_servers: str | None = None
    #: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, passed to kafka-python as is.
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def __post_init__(self) -> None:
        allowed = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
        if self.security_protocol not in allowed:
            raise ConfigError(
                f"kafka.security_protocol={self.security_protocol!r} is not one of {sorted(allowed)}"
            )

    def client_options(self) -> dict[str, Any]:
        """Security keyword arguments for kafka-python clients (only the ones that are set)."""
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        for ours, theirs in (
            ("sasl_mechanism", "sasl_mechanism"),
            ("sasl_username", "sasl_plain_username"),
            ("sasl_password", "sasl_plain_password"),
            ("ssl_cafile", "ssl_cafile"),
            ("ssl_certfile", "ssl_certfile"),
            ("ssl_keyfile", "ssl_keyfile"),
        ):
            value = getattr(self, ours)
            if value is not None:
                options[theirs] = value
        return options


@dataclass(frozen=True, kw_only=True)
class ProducerSettings:
    """Rank-side producer tuning. Defaults keep a training step unaffected on a busy node."""

    #: Events per trace batch message; a batch is also cut every ``flush_interval_s``.
    batch_events: int = 1000
    flush_interval_s: float = 0.1
    #: Events that may wait on the training thread's side before new ones are dropped (and counted).
    max_buffered_events: int = 500_000
    #: Encoded bytes handed to Kafka and not yet acknowledged; past this, batches go to the spool.
    max_inflight_bytes: int = 64 << 20
    #: Where batches wait while the broker is unreachable. Empty means ``<state_dir>/spool``.
    spool_dir: str = ""
    #: Disk cap of one producer's spool; past it batches are dropped and counted.
    spool_max_bytes: int = 1 << 30
    #: Acknowledged batches kept to resend if the broker restarts and loses its log: the last
    #: ``resend_window_s`` seconds, at most ``resend_window_bytes`` (memory on the rank).
    resend_window_s: float = 60.0
    resend_window_bytes: int = 64 << 20
    #: How often a connected producer asks the broker for its topic ids, to notice a restart.
    broker_check_s: float = 2.0
    heartbeat_interval_s: float = 1.0
    #: How long ``close()`` may wait to deliver what is buffered.
    close_timeout_s: float = 10.0
    #: lz4 (default: 4x cheaper CPU than zstd on both ends, 2x the bytes) or zstd (smaller on the broker).
    compression: str = "lz4"

    def __post_init__(self) -> None:
        for name in ("batch_events", "max_buffered_events", "max_inflight_bytes", "spool_max_bytes",
                     "resend_window_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"producer.{name}={getattr(self, name)!r} must be positive")
        for name in ("flush_interval_s", "heartbeat_interval_s", "close_timeout_s", "resend_window_s",
                     "broker_check_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"producer.{name}={getattr(self, name)!r} must be positive")
        if self.compression not in ("zstd", "lz4", "gzip", "none"):
            raise ConfigError(f"producer.compression={self.compression!r} is not zstd, lz4, gzip or none")


@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything a rankstream process needs to know, resolved once."""

    #: The DuckDB file the materializer writes and queries read.
    db_path: Path = Path("rankstream.duckdb")
    #: Pid files, broker state, logs and the default spool live here.
    state_dir: Path = Path(".rankstream")
    #: Topics are ``<prefix>.trace``, ``<prefix>.fr`` and ``<prefix>.control``.
    topic_prefix: str = "rankstream"
    #: Partitions per topic, created by the materializer or ``rankstream up``.
    partitions: int = 8
    #: Port of the embedded broker on 127.0.0.1 (used when kafka.bootstrap_servers is unset).
    broker_port: int = 29092
    #: DuckDB's memory limit in the materializer, for its own writes and the queries it serves
    #: (beyond it they spill to ``<db_path>.tmp``). DuckDB's default, 80% of RAM, lets its cache of
    #: the file's blocks grow with the data a run has written, on the training job's machine.
    materializer_memory_mb: int = 256
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    producer: ProducerSettings = field(default_factory=ProducerSettings)

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ConfigError(f"partitions={self.partitions!r} must be at least 1")
        if self.materializer_memory_mb < 64:
            raise ConfigError(f"materializer_memory_mb={self.materializer_memory_mb!r} must be at least 64")
        if not 0 < self.broker_port < 65536:
            raise ConfigError(f"broker_port={self.broker_port!r} is not a TCP port")
        if not self.topic_prefix or any(c in self.topic_prefix for c in " /\\"):
            raise ConfigError(f"topic_prefix={self.topic_prefix!r} is not a valid topic name prefix")

    @property
    def uses_embedded_broker(self) -> bool:
        return self.kafka.bootstrap_servers is None

    @property
    def bootstrap_servers(self) -> str:
        """Where Kafka clients connect: the configured servers or the embedded broker."""
        return self.kafka.bootstrap_servers or f"{EMBEDDED_HOST}:{self.broker_port}"

    @property
    def spool_dir(self) -> Path:
        return Path(self.producer.spool_dir) if self.producer.spool_dir else self.state_dir / "spool"

    def with_overrides(self, **overrides: Any) -> "Config":
        """A copy with dotted-key overrides applied, e.g. ``with_overrides(**{"producer.batch_events": 10})``."""
        return _build(overrides, {}, {}, base=self)


_SECTIONS = {"kafka": KafkaSettings, "producer": ProducerSettings}


def _env_name(section: str | None, key: str) -> str:
    return ENV_PREFIX + (f"{section}_{key}" if section else key).upper()


def _coerce(key: str, raw: Any, kind: Any, source: str) -> Any:
    """Convert a raw value from a flag, env var or file to the field's type, naming the key on failure."""
    if raw is None:
        return None
    text_kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if "Path" in text_kind:
            return Path(raw)
        if text_kind.startswith("int"):
            if isinstance(raw, bool):
                raise ValueError("a boolean is not a number")
            return int(raw)
        if text_kind.startswith("float"):
            return float(raw)
        if text_kind.startswith("str"):
            return str(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{key}={raw!r} (from {source}) is not a valid {text_kind}: {exc}") from exc
    return raw


def _read_file(env: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    explicit = env.get(ENV_PREFIX + "CONFIG")
    path = Path(explicit) if explicit else Path("rankstream.toml")
    if not path.exists():
        if explicit:
            raise ConfigError(f"RANKSTREAM_CONFIG={explicit!r}: no such file")
        return {}, ""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable TOML config file: {exc}") from exc
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            for sub, subvalue in value.items():
                flat[f"{key}.{sub}"] = subvalue
        else:
            flat[key] = value
    return flat, str(path)


def _lookup(name: str, section: str | None, key: str, overrides, env, file_values, file_name):
    if name in overrides and overrides[name] is not None:
        return overrides[name], "override"
    env_name = _env_name(section, key)
    if env_name in env:
        return env[env_name], f"environment {env_name}"
    if section == "kafka" and key == "sasl_password" and env_name + "_FILE" in env:
        secret_path = env[env_name + "_FILE"]
        try:
            return Path(secret_path).read_text().strip(), f"file named by {env_name}_FILE"
        except OSError as exc:
            raise ConfigError(f"{env_name}_FILE={secret_path!r}: cannot read: {exc.strerror}") from exc
    if name in file_values:
        return file_values[name], f"config file {file_name}"
    return dataclasses.MISSING, ""


def _build(overrides: Mapping[str, Any], env: Mapping[str, str], file_values: Mapping[str, Any],
           file_name: str = "", base: Config | None = None) -> Config:
    known = {f.name for f in dataclasses.fields(Config)} | {
        f"{s}.{f.name}" for s, cls in _SECTIONS.items() for f in dataclasses.fields(cls)
    }
    for name in list(overrides) + list(file_values):
        if name not in known:
            raise ConfigError(f"unknown setting {name!r}; known settings: {', '.join(sorted(known))}")

    def resolve(cls, section: str | None, current) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in _SECTIONS:
                continue
            name = f"{section}.{f.name}" if section else f.name
            raw, source = _lookup(name, section, f.name, overrides, env, file_values, file_name)
            if raw is dataclasses.MISSING:
                if current is not None:
                    values[f.name] = getattr(current, f.name)
                continue
            values[f.name] = _coerce(name, raw, f.type, source)
        return values

    sections = {
        name: cls(**resolve(cls, name, getattr(base, name) if base else None))
        for name, cls in _SECTIONS.items()
    }
    return Config(**resolve(Config, None, base), **sections)


def load_config(overrides: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None) -> Config:
    """Resolve the configuration from overrides, the environment, the config file and the defaults."""
    env = os.environ if env is None else env
    file_values, file_name = _read_file(env)
    return _build(dict(overrides or {}), env, file_values, file_name)


def config_env(config: Config) -> dict[str, str]:
    """Environment variables that reproduce ``config`` in a child process (``rankstream up``).

    Secrets are left out: the child inherits them from this process's own environment or file.
    """
    env: dict[str, str] = {}
    for f in dataclasses.fields(Config):
        if f.name not in _SECTIONS:
            env[_env_name(None, f.name)] = str(getattr(config, f.name))
    for section, cls in _SECTIONS.items():
        values = getattr(config, section)
        for f in dataclasses.fields(cls):
            value = getattr(values, f.name)
            if value is not None and f.name != "sasl_password":
                env[_env_name(section, f.name)] = str(value)
    return env


@dataclass(frozen=True)
class LaunchEnvironment:
    """What a launcher (torchrun, torch.multiprocessing, SLURM wrappers) tells a rank about itself."""

    rank: int | None
    world_size: int | None
    local_rank: int | None
    node_rank: int | None
    local_world_size: int | None
    run_id: str | None
    master: str | None


def launch_environment(env: Mapping[str, str] | None = None) -> LaunchEnvironment:
    """Read torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, ...) and RANKSTREAM_RUN_ID.

    ``run_id`` comes from RANKSTREAM_RUN_ID, else torchrun's TORCHELASTIC_RUN_ID; ``master`` is
    MASTER_ADDR:MASTER_PORT, which every rank of one launch shares.
    """
    env = os.environ if env is None else env

    def number(name: str) -> int | None:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            return None

    master = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if "MASTER_ADDR" in env and "MASTER_PORT" in env else None
    run_id = env.get(ENV_PREFIX + "RUN_ID") or env.get("TORCHELASTIC_RUN_ID")
    return LaunchEnvironment(
        rank=number("RANK"), world_size=number("WORLD_SIZE"), local_rank=number("LOCAL_RANK"),
        node_rank=number("GROUP_RANK") if number("GROUP_RANK") is not None else number("NODE_RANK"),
        local_world_size=number("LOCAL_WORLD_SIZE"), run_id=run_id or None, master=master,
    )


#: torch reads these before it creates a process group; older torch only knows the NCCL name.
FLIGHT_RECORDER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_buffer_size() -> int:
    """The Flight Recorder ring size torch will use (0: recording is off)."""
    for name in FLIGHT_RECORDER_VARIABLES:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 0


def enable_flight_recorder(entries: int) -> bool:
    """Ask torch to record ``entries`` Flight Recorder entries; True if it was not already on.

    Only effective before the process group is created; a value the user set is kept.
    """
    if flight_recorder_buffer_size() > 0:
        return False
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(entries)
    return True


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean environment switch such as ``RANKSTREAM_DISABLED=1`` (for rank-side code)."""
    value = os.environ.get(ENV_PREFIX + name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def prefect_api_url() -> str | None:
    """The Prefect API the user configured (``PREFECT_API_URL``), if any."""
    return os.environ.get("PREFECT_API_URL") or None


def prefect_server_environment(home: Path) -> dict[str, str]:
    """Environment for a local ``prefect server start`` that rankstream runs itself: its own home
    (database and logs under ``home``), no analytics, nothing inherited that points elsewhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_PROFILES_PATH")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")
    return env
