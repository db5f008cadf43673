"""``rankstream serve``: run the scheduled analysis flows of ``deploy/prefect.yaml``.

Schedules need a real Prefect API (the ephemeral one used by plain flow calls has no scheduler).
When ``PREFECT_API_URL`` is set, the deployments are served against it. Otherwise a local
``prefect server start`` is launched under the state directory, used, and stopped on exit, so
``rankstream serve`` is one command on a fresh machine.

The deployment file is the single source of the schedules: each entry's ``entrypoint``
(``flows/<module>.py:<flow>``) names a flow of ``rankstream.flows``, its ``parameters`` are passed
on (``db_path`` defaults to the configured database) and its ``schedules`` (``interval`` seconds or
``cron``) become the served deployment's schedules.
"""

from __future__ import annotations

import importlib
from importlib import resources
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rankstream.schemas.config import Config
from rankstream.schemas.settings import prefect_api_url, prefect_server_environment
from rankstream.schemas.errors import ConfigError, RankstreamError

__all__ = ["load_deployments", "prefect_server", "serve", "DEFAULT_PREFECT_FILE"]

#: deploy/prefect.yaml, shipped as package data of rankstream.deploy.
DEFAULT_PREFECT_FILE = Path(str(resources.files("rankstream.deploy").joinpath("prefect.yaml")))


def _flow(entrypoint: str, source: Path):
    try:
        path, name = entrypoint.split(":")
        folder, module = Path(path).parent.name, Path(path).stem
        return getattr(importlib.import_module(f"rankstream.{folder}.{module}"), name)
    except (ValueError, ImportError, AttributeError) as exc:
        raise ConfigError(f"{source}: entrypoint {entrypoint!r} does not name a rankstream flow ({exc})") from None


def load_deployments(prefect_file: Path, db_path: Path) -> list:
    """The served deployments described by ``prefect_file``."""
    import yaml  # the [flows] extra (Prefect brings PyYAML)
    from prefect.schedules import Cron, Interval  # the [flows] extra

    try:
        spec = yaml.safe_load(prefect_file.read_text())
        entries = spec["deployments"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ConfigError(f"{prefect_file}: not a Prefect deployment file ({exc})") from None
    deployments = []
    for entry in entries:
        schedules = []
        for schedule in entry.get("schedules") or []:
            if "interval" in schedule:
                schedules.append(Interval(float(schedule["interval"])))
            elif "cron" in schedule:
                schedules.append(Cron(str(schedule["cron"])))
            else:
                raise ConfigError(f"{prefect_file}: deployment {entry.get('name')!r}: a schedule needs interval or cron")
        flow = _flow(str(entry.get("entrypoint", "")), prefect_file)
        parameters = {"db_path": str(db_path), **(entry.get("parameters") or {})}
        # one run of a deployment at a time: without a materializer, runs share the file's write lock
        deployments.append(flow.to_deployment(name=entry["name"], schedules=schedules, parameters=parameters,
                                              description=entry.get("description"),
                                              concurrency_limit=int(entry.get("concurrency_limit", 1))))
    return deployments


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def prefect_server(config: Config, timeout_s: float = 90.0) -> Iterator[str]:
    """The Prefect API URL to use: the configured one, or a local server started (and later
    stopped) here."""
    configured = prefect_api_url()
    if configured:
        yield configured
        return
    home = Path(config.state_dir) / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = open(home / "server.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                "--port", str(port)], env=prefect_server_environment(home),
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(url):
            if process.poll() is not None:
                raise RankstreamError(f"prefect server exited with {process.returncode}; see {home / 'server.log'}")
            if time.monotonic() > deadline:
                raise RankstreamError(f"prefect server did not answer within {timeout_s:.0f} s; see {home / 'server.log'}")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def serve(config: Config, prefect_file: Path = DEFAULT_PREFECT_FILE, on_ready=None) -> None:
    """Serve every deployment of ``prefect_file`` until interrupted."""
    from prefect.settings import PREFECT_API_URL, temporary_settings  # the [flows] extra

    with prefect_server(config) as url:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            from prefect import serve as prefect_serve  # the [flows] extra

            deployments = load_deployments(prefect_file, Path(config.db_path))
            if on_ready:
                on_ready(url, [d.name for d in deployments])
            prefect_serve(*deployments, print_starting_message=False)
