"""``rankstream up`` / ``down`` / ``consume``: the embedded broker plus a materializer, wired.

This is where the layers meet: the broker launcher (``deploy``), the materializer (``consumers``)
and the live hang watch and analysis procedures (``flows``) are started together here, so none of
them imports the others. ``up`` starts the materializer as ``python -m rankstream consume`` in its
own session, logging to ``<state_dir>/materializer.log`` with its pid in
``<state_dir>/materializer.pid``, and returns once its query server answers.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rankstream.consumers.materializer import MaterializerStatus
from rankstream.consumers.query_server import server_socket
from rankstream.consumers.runner import run_materializer
from rankstream.deploy.broker import BrokerState, start_broker, stop_broker
from rankstream.flows import breakdown, gpu_breakdown  # noqa: F401  (imported for the query procedures they register)
from rankstream.flows.hang_watch import HangWatch
from rankstream.producers.kafka_client import ensure_topics
from rankstream.schemas.config import Config
from rankstream.schemas.errors import BrokerUnavailable, RankstreamError
from rankstream.schemas.processes import is_process, start_ticks, stop_process, yield_to_training
from rankstream.schemas.settings import absolute_paths, config_env, forget_endpoint, record_endpoint

__all__ = ["up", "down", "materialize", "materializer_pid", "stop_materializer", "start_embedded_broker", "Services"]


@dataclass(frozen=True)
class Services:
    broker: BrokerState | None
    materializer_pid: int


def start_embedded_broker(config: Config, wait_s: float = 15.0) -> BrokerState:
    """The embedded broker started (or the running one) with rankstream's topics created."""
    state = start_broker(config, wait_s=wait_s)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            ensure_topics(config, timeout_s=2.0)
            return state
        except BrokerUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def materialize(config: Config, stop: threading.Event, *, once: bool = False, rebuild: bool = False,
                query_server: bool = True, max_messages: int = 500,
                log: Callable[[str], None] = print) -> MaterializerStatus:
    """The materializer with what runs beside it: the live hang watch, and (imported above) the
    analyses' procedures registered with its query server."""
    return run_materializer(config, stop, once=once, rebuild=rebuild, query_server=query_server,
                            max_messages=max_messages, watchers=[functools.partial(HangWatch, log=log)], log=log)


def _pid_file(config: Config) -> Path:
    return config.state_dir / "materializer.pid"


def materializer_pid(config: Config) -> int | None:
    """The running materializer recorded for this state dir (``<pid> <start ticks>``), if any."""
    try:
        fields = _pid_file(config).read_text().split()
        pid, started = int(fields[0]), int(fields[1]) if len(fields) > 1 else None
    except (OSError, ValueError, IndexError):
        return None
    return pid if is_process(pid, started, command_has="rankstream") else None


def up(config: Config, wait_s: float = 30.0) -> Services:
    """Start the embedded broker (unless a cluster is configured) and the materializer."""
    config = absolute_paths(config)
    broker = start_embedded_broker(config) if config.uses_embedded_broker else None
    pid = materializer_pid(config)
    if pid is None:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **config_env(config)}
        with open(config.state_dir / "materializer.log", "ab") as log:
            process = subprocess.Popen([sys.executable, "-m", "rankstream", "consume"], env=env,
                                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, preexec_fn=yield_to_training)
        pid = process.pid
        _pid_file(config).write_text(f"{pid} {start_ticks(pid)}")
        deadline = time.monotonic() + wait_s
        while server_socket(config.db_path) is None:
            if process.poll() is not None:
                raise RankstreamError(f"the materializer exited with code {process.returncode}; "
                                      f"see {config.state_dir / 'materializer.log'}")
            if time.monotonic() > deadline:
                raise RankstreamError(f"the materializer did not start serving within {wait_s:.0f} s; "
                                      f"see {config.state_dir / 'materializer.log'}")
            time.sleep(0.05)
    record_endpoint(config)
    return Services(broker=broker, materializer_pid=pid)


def down(config: Config) -> list[str]:
    """Stop the materializer (it finishes its transaction) and the embedded broker."""
    config = absolute_paths(config)
    stopped = [stop_materializer(config)]
    if config.uses_embedded_broker and stop_broker(config):
        stopped.append("embedded broker")
    forget_endpoint(config)
    return [name for name in stopped if name]


def stop_materializer(config: Config) -> str | None:
    """Stop the background materializer (it finishes its transaction); what was stopped, if any."""
    pid = materializer_pid(config)
    stopped = pid is not None and stop_process(pid, timeout_s=20.0)
    _pid_file(config).unlink(missing_ok=True)
    return f"materializer (pid {pid})" if stopped else None
