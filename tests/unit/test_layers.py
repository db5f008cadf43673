"""The layers hold: import-linter's contracts in pyproject.toml pass, and fail on an upward import.

The linter runs on a non-editable copy of the package: in the editable install the package-dir
mapping lives in an import hook that the linter cannot see, so it would check nothing.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.fixture(scope="module")
def installed_copy(tmp_path_factory) -> Path:
    source, target = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("copy")
    # built from a copy, so the build leaves nothing in the checkout
    shutil.copytree(ROOT, source, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", ".rankstream"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True)
    return target


def lint(copy: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
                          capture_output=True, text=True, cwd=copy, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin"})


def test_the_layer_contracts_are_kept(installed_copy):
    result = lint(installed_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize("module,upward", [
    ("producers/producer.py", "from rankstream.consumers import query"),
    ("schemas/codec.py", "from rankstream import cli"),
    ("deploy/broker.py", "from rankstream.producers import kafka_client"),
    ("flows/steps.py", "from tests import doubles"),
])
def test_an_upward_import_breaks_the_contract(installed_copy, tmp_path, module, upward):
    copy = tmp_path / "copy"
    shutil.copytree(installed_copy, copy)
    path = copy / "rankstream" / module
    path.write_text(path.read_text() + f"\n{upward}  # injected by the test\n")
    result = lint(copy)
    assert result.returncode != 0 and "BROKEN" in result.stdout.upper()
    importer = "rankstream." + module.removesuffix(".py").replace("/", ".")
    assert importer in result.stdout, result.stdout


def test_importing_rankstream_loads_nothing_else():
    code = "import rankstream, sys; print(sorted(m for m in sys.modules if m.startswith('rankstream')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['rankstream']"
