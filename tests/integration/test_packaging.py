"""Both install modes import every package: the editable one under test, and a built wheel."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["rankstream", "rankstream.schemas", "rankstream.producers", "rankstream.consumers",
            "rankstream.flows", "rankstream.deploy"]
PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    print(name, module.__file__)
from rankstream.schemas.tables import ddl
assert "CREATE TABLE IF NOT EXISTS trace_events" in ddl()
"""


def probe(python_path: str | None = None) -> dict[str, str]:
    env = None
    if python_path:
        import os

        env = {**os.environ, "PYTHONPATH": python_path}
    out = subprocess.run([sys.executable, "-c", PROBE, *PACKAGES], capture_output=True, text=True, env=env,
                         check=True, cwd="/").stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def test_editable_install_imports_every_package_from_the_source_folders():
    files = probe()
    assert files["rankstream.schemas"] == str(ROOT / "schemas" / "__init__.py")
    assert files["rankstream.producers"] == str(ROOT / "producers" / "__init__.py")


def test_built_wheel_imports_every_package(tmp_path):
    # Build from a clean copy: an in-tree build/ folder could carry modules deleted since.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", "build", "*.egg-info", ".git", "__pycache__",
                                                                 ".pytest_cache", ".rankstream", "*.duckdb*"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True)
    wheel = next((tmp_path / "dist").glob("rankstream-*.whl"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    files = probe(str(target))
    assert set(files) == set(PACKAGES)
    assert all(path.startswith(str(target)) for path in files.values()), files
    assert (target / "rankstream" / "bootstrap" / "sitecustomize.py").is_file()  # what `rankstream run` puts on PYTHONPATH
