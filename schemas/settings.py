"""Settings: the only module that reads environment variables.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rankstream.schemas.config import Config, KafkaSettings, ProducerSettings
from rankstream.schemas.errors import ConfigError

__all__ = ["load_config", "with_overrides", "config_env", "env_flag", "ENV_PREFIX", "LaunchEnvironment",
           "launch_environment", "enable_flight_recorder", "flight_recorder_buffer_size"]

ENV_PREFIX = "RANKSTREAM_"

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


def with_overrides(config: Config, **overrides: Any) -> Config:
    """A copy of ``config`` with dotted-key overrides applied, e.g. ``{"producer.batch_events": 10}``."""
    return _build(overrides, {}, {}, base=config)


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
