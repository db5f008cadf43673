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
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rankstream.schemas.config import Config, KafkaSettings, ProducerSettings
from rankstream.schemas.errors import ConfigError

__all__ = ["load_config", "with_overrides", "config_env", "env_flag", "ENV_PREFIX", "LaunchEnvironment",
           "launch_environment", "enable_flight_recorder", "flight_recorder_buffer_size", "RunOptions",
           "run_options", "run_environment", "record_endpoint", "forget_endpoint", "advertised_endpoint", "ENDPOINT_FILE", "requested_run_id", "absolute_paths",
           "endpoint_mismatch"]

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


#: What ``rankstream up`` recorded in its state dir: the endpoint later commands and ranks use.
ENDPOINT_FILE = "endpoint.json"
#: The settings ``up`` records there (a flag, variable or config file still wins over them).
_ENDPOINT_KEYS = ("broker_port", "broker_bind", "broker_advertise", "kafka.bootstrap_servers", "db_path")


def _lookup(name: str, section: str | None, key: str, overrides, env, file_values, file_name, endpoint=None):
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
    if endpoint and name in endpoint:
        return endpoint[name], "the endpoint `rankstream up` recorded"
    return dataclasses.MISSING, ""


def _build(overrides: Mapping[str, Any], env: Mapping[str, str], file_values: Mapping[str, Any],
           file_name: str = "", base: Config | None = None, endpoint: Mapping[str, Any] | None = None) -> Config:
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
            raw, source = _lookup(name, section, f.name, overrides, env, file_values, file_name, endpoint)
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
    config = _build(dict(overrides or {}), env, file_values, file_name)
    endpoint = _read_endpoint(config.state_dir)
    return _build(dict(overrides or {}), env, file_values, file_name, endpoint=endpoint) if endpoint else config


def _read_endpoint(state_dir: Path) -> dict[str, Any]:
    """The endpoint ``up`` recorded in ``state_dir`` (nothing when there is none, or it is unreadable)."""
    try:
        data = json.loads((state_dir / ENDPOINT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {key: data[key] for key in _ENDPOINT_KEYS if isinstance(data, dict) and data.get(key) is not None}


def record_endpoint(config: Config) -> Path:
    """Keep where ``up`` serves (its broker port, the address other nodes use, the database) in
    its state dir, so that later commands and the ranks started from there find it."""
    path = config.state_dir / ENDPOINT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    advertised = None if config.broker_is_private or not config.uses_embedded_broker else config.broker_advertised
    values = {"broker_port": config.broker_port, "broker_bind": config.broker_bind,
              "broker_advertise": config.broker_advertise or None, "db_path": str(config.db_path.resolve()),
              "kafka.bootstrap_servers": config.kafka.bootstrap_servers, "advertised": advertised}
    path.write_text(json.dumps(values))
    return path


def advertised_endpoint(config: Config) -> str | None:
    """The ``host:port`` other nodes use to reach this state dir's embedded broker, if ``up`` named one."""
    try:
        value = json.loads((config.state_dir / ENDPOINT_FILE).read_text()).get("advertised")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def endpoint_mismatch(config: Config) -> str | None:
    """Why ``config`` sends somewhere other than the broker ``up`` recorded in its state dir (a
    variable set by hand, another user's broker on the default port), or None when it agrees."""
    recorded = _read_endpoint(config.state_dir)
    if not recorded:
        return None
    chosen = load_config({"state_dir": config.state_dir}, env={})
    if chosen.bootstrap_servers == config.bootstrap_servers:
        return None
    return (f"events go to {config.bootstrap_servers}, but `rankstream up` in {config.state_dir} serves "
            f"{chosen.bootstrap_servers}: another broker's materializer will store them (unset the variable "
            "that says otherwise, or run `rankstream up` for it)")


def absolute_paths(config: Config) -> Config:
    """The same configuration with paths made absolute, for a child in any directory."""
    return dataclasses.replace(config, db_path=config.db_path.resolve(), state_dir=config.state_dir.resolve())


def forget_endpoint(config: Config) -> None:
    (config.state_dir / ENDPOINT_FILE).unlink(missing_ok=True)


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
    #: torchrun's agent serves a store at ``master`` (TORCHELASTIC_USE_AGENT_STORE): the ranks of
    #: one launch can agree on a run id through it before any process group exists.
    agent_store: bool = False
    #: A launcher's id for this launch (SLURM job and step, PMIx namespace): shared by every rank
    #: of the launch and by no other launch.
    launcher_job: str | None = None
    #: The run id ``rankstream run`` proposes (RANKSTREAM_RUN_PROPOSAL): rank 0's node's proposal
    #: wins through the launch's store, so all the nodes of a launch agree.
    run_proposal: str | None = None


def launch_environment(env: Mapping[str, str] | None = None) -> LaunchEnvironment:
    """Read torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, ...) and RANKSTREAM_RUN_ID.

    ``run_id`` comes from RANKSTREAM_RUN_ID, else torchrun's TORCHELASTIC_RUN_ID, unless
    ``rankstream run`` proposed one: its proposal then goes through the store, so that the id the
    user sees printed by ``run`` is the run's (torchrun without ``--master-port`` makes a random
    rendezvous id of its own). ``master`` is MASTER_ADDR:MASTER_PORT, which every rank of one
    launch shares.
    """
    env = os.environ if env is None else env

    def number(name: str) -> int | None:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            return None

    master = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if "MASTER_ADDR" in env and "MASTER_PORT" in env else None
    proposal = env.get(ENV_PREFIX + "RUN_PROPOSAL") or None
    run_id = env.get(ENV_PREFIX + "RUN_ID") or (None if proposal else env.get("TORCHELASTIC_RUN_ID"))
    return LaunchEnvironment(
        rank=number("RANK"), world_size=number("WORLD_SIZE"), local_rank=number("LOCAL_RANK"),
        node_rank=number("GROUP_RANK") if number("GROUP_RANK") is not None else number("NODE_RANK"),
        local_world_size=number("LOCAL_WORLD_SIZE"), run_id=run_id or None, master=master,
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true", launcher_job=_launcher_job(env),
        run_proposal=proposal,
    )


def requested_run_id() -> str | None:
    """The run id the user chose for the next launch (RANKSTREAM_RUN_ID), if any."""
    return os.environ.get(ENV_PREFIX + "RUN_ID") or None


def _launcher_job(env: Mapping[str, str]) -> str | None:
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    namespace = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid")
    return f"mpi-{namespace}" if namespace else None


@dataclass(frozen=True)
class RunOptions:
    """What ``rankstream run`` tells the processes it launches (``RANKSTREAM_RUN_*``)."""

    #: A profiler window opens every ``profile_every`` steps (0: never) and records ``profile_active``.
    profile_every: int = 0
    profile_active: int = 0
    #: Where the ranks write Flight Recorder dumps and Python stacks when ``run`` asks them to.
    run_dir: Path | None = None


def run_options(env: Mapping[str, str] | None = None) -> RunOptions:
    env = os.environ if env is None else env
    try:
        every, active = int(env.get(ENV_PREFIX + "RUN_PROFILE_EVERY", 0)), int(env.get(ENV_PREFIX + "RUN_PROFILE_ACTIVE", 0))
    except ValueError:
        every = active = 0
    directory = env.get(ENV_PREFIX + "RUN_DIR")
    return RunOptions(profile_every=max(every, 0), profile_active=max(active, 0),
                      run_dir=Path(directory) if directory else None)


def run_environment(options: RunOptions, run_id: str, *, bootstrap_dir: Path, fr_entries: int,
                    chosen: bool) -> dict[str, str]:
    """The variables ``rankstream run`` adds to the job's environment: the run id (``chosen`` by the
    user, else proposed: see ``LaunchEnvironment.run_proposal``), the bootstrap directory first on
    PYTHONPATH, the Flight Recorder on (unless the user sized it), the options."""
    path = os.pathsep.join(filter(None, [str(bootstrap_dir), os.environ.get("PYTHONPATH")]))
    env = {ENV_PREFIX + ("RUN_ID" if chosen else "RUN_PROPOSAL"): run_id, "PYTHONPATH": path,
           ENV_PREFIX + "RUN_PROFILE_EVERY": str(options.profile_every),
           ENV_PREFIX + "RUN_PROFILE_ACTIVE": str(options.profile_active)}
    if options.run_dir is not None:
        env[ENV_PREFIX + "RUN_DIR"] = str(options.run_dir)
    if flight_recorder_buffer_size() <= 0:
        env["TORCH_FR_BUFFER_SIZE"] = str(fr_entries)
    return env


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
