"""Usage errors are a short message and exit code 2, never a traceback."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args, message", [
    (["merge", "x.json"], "Missing option '-o'"),
    (["diagnose", ".", "--selected-ranks", "a,b"], "--selected-ranks takes rank numbers, e.g. 0,3; got 'a,b'"),
    (["timeline", "--run", "r", "-o", "t.json", "--steps", "1:2", "--window", "0:1"], "give --steps or --window"),
])
def test_usage_errors_name_the_problem_without_a_traceback(tmp_path, args, message):
    done = subprocess.run([sys.executable, "-m", "rankstream", *args], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [["timeline", "--run", "r", "-o", "t.json"], ["analyze", "run", "--run", "r"],
                                  ["report", "--run", "r"]])
def test_a_command_on_a_database_that_does_not_exist_says_so_and_creates_none(tmp_path, args):
    done = subprocess.run([sys.executable, "-m", "rankstream", *args], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "no such database yet" in done.stderr
    assert list(tmp_path.iterdir()) == []
