"""The settings objects every rankstream process resolves once: what to connect to, where to
store, how the rank-side producer behaves.

Plain frozen dataclasses, validated in ``__post_init__`` so a bad value is refused with the key
and the value named. Where the values come from (flags, environment, config file, defaults) is
``schemas.settings``, the only module that reads the environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankstream.schemas.errors import ConfigError

__all__ = ["KafkaSettings", "ProducerSettings", "Config", "EMBEDDED_HOST", "path_safe"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def path_safe(run_id: str) -> str:
    """A run id as one file name: every character that could leave the folder (``/``, ``..`` as a
    whole name) or confuse a shell is replaced, so a run's files stay where they are expected."""
    name = _UNSAFE.sub("_", run_id)
    return name if name.strip(".") else name.replace(".", "_")

#: Where the embedded broker listens unless ``up --bind`` says otherwise.
EMBEDDED_HOST = "127.0.0.1"
_EVERY_ADDRESS = ("0.0.0.0", "::")


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
    #: Port of the embedded broker (used when kafka.bootstrap_servers is unset).
    broker_port: int = 29092
    #: Address the embedded broker listens on: loopback unless other nodes must reach it
    #: (``up --bind``), and the host name it gives clients (``up --advertise``; default: the bound
    #: address, or this host's name when bound to every address).
    broker_bind: str = EMBEDDED_HOST
    broker_advertise: str = ""
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
        return self.kafka.bootstrap_servers or f"{self.broker_local_host}:{self.broker_port}"

    @property
    def broker_local_host(self) -> str:
        """Where a client on this machine reaches the embedded broker."""
        return EMBEDDED_HOST if self.broker_bind in _EVERY_ADDRESS + (EMBEDDED_HOST, "localhost") else self.broker_bind

    @property
    def broker_advertised(self) -> str:
        """``host:port`` the embedded broker names to clients (other nodes connect there)."""
        import socket

        host = self.broker_advertise or (socket.gethostname() if self.broker_bind in _EVERY_ADDRESS
                                         else self.broker_bind)
        return f"{host}:{self.broker_port}"

    @property
    def broker_is_private(self) -> bool:
        """Whether only this machine can reach the embedded broker (nobody else can write events)."""
        return self.broker_bind in (EMBEDDED_HOST, "localhost", "::1")

    @property
    def spool_dir(self) -> Path:
        return Path(self.producer.spool_dir) if self.producer.spool_dir else self.state_dir / "spool"

    def run_dir(self, run_id: str) -> Path:
        """Where ``rankstream run`` writes a run's report and timeline."""
        return self.state_dir / "runs" / path_safe(run_id)
