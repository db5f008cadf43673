"""``rankstream up`` / ``down``: the embedded broker plus a background materializer.

The materializer runs as ``python -m rankstream consume`` in its own session, logging to
``<state_dir>/materializer.log`` with its pid in ``<state_dir>/materializer.pid``. ``up`` returns
once its query server answers, so the next command can query at once.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rankstream.config import Config, config_env
from rankstream.consumers.query_server import server_socket
from rankstream.deploy.broker import BrokerState, process_alive, start_broker, stop_broker, stop_process
from rankstream.errors import RankstreamError

__all__ = ["up", "down", "materializer_pid", "Services"]


@dataclass(frozen=True)
class Services:
    broker: BrokerState | None
    materializer_pid: int


def _pid_file(config: Config) -> Path:
    return config.state_dir / "materializer.pid"


def materializer_pid(config: Config) -> int | None:
    try:
        pid = int(_pid_file(config).read_text())
    except (OSError, ValueError):
        return None
    return pid if process_alive(pid) else None


def absolute(config: Config) -> Config:
    """The same configuration with paths made absolute, for a child in any directory."""
    return dataclasses.replace(config, db_path=config.db_path.resolve(), state_dir=config.state_dir.resolve())


def up(config: Config, wait_s: float = 30.0) -> Services:
    """Start the embedded broker (unless a cluster is configured) and the materializer."""
    config = absolute(config)
    broker = start_broker(config) if config.uses_embedded_broker else None
    pid = materializer_pid(config)
    if pid is None:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **config_env(config)}
        with open(config.state_dir / "materializer.log", "ab") as log:
            process = subprocess.Popen([sys.executable, "-m", "rankstream", "consume"], env=env,
                                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        pid = process.pid
        _pid_file(config).write_text(str(pid))
        deadline = time.monotonic() + wait_s
        while server_socket(config.db_path) is None:
            if process.poll() is not None:
                raise RankstreamError(f"the materializer exited with code {process.returncode}; "
                                      f"see {config.state_dir / 'materializer.log'}")
            if time.monotonic() > deadline:
                raise RankstreamError(f"the materializer did not start serving within {wait_s:.0f} s; "
                                      f"see {config.state_dir / 'materializer.log'}")
            time.sleep(0.05)
    return Services(broker=broker, materializer_pid=pid)


def down(config: Config) -> list[str]:
    """Stop the materializer (it finishes its transaction) and the embedded broker."""
    config = absolute(config)
    stopped = []
    pid = materializer_pid(config)
    if pid is not None and stop_process(pid, timeout_s=20.0):
        stopped.append(f"materializer (pid {pid})")
    _pid_file(config).unlink(missing_ok=True)
    if config.uses_embedded_broker and stop_broker(config):
        stopped.append("embedded broker")
    return stopped
