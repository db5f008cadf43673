"""Every broad ``except`` in the package re-raises or says, on its line, why swallowing is right
(and what makes the failure visible); none is a bare ``pass``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("schemas", "producers", "consumers", "flows", "deploy", "rankstream")
BROAD = {"Exception", "BaseException"}


def _is_broad(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in BROAD for n in names)


def _reraises(handler: ast.ExceptHandler) -> bool:
    return any(isinstance(node, ast.Raise) for node in ast.walk(handler))


def broad_handlers_without_reason(root: Path = ROOT) -> list[str]:
    problems = []
    for folder in PACKAGE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            source = path.read_text()
            lines = source.splitlines()
            for node in ast.walk(ast.parse(source)):
                if not isinstance(node, ast.ExceptHandler) or not _is_broad(node):
                    continue
                where = f"{path.relative_to(root)}:{node.lineno}"
                reason = any("#" in line for line in lines[node.lineno - 1:node.end_lineno])
                if _reraises(node) or reason:
                    continue
                silent = len(node.body) == 1 and isinstance(node.body[0], ast.Pass)
                problems.append(f"{where}: bare pass" if silent else f"{where}: swallowed without a reason")
    return problems


def test_every_broad_except_reraises_or_gives_its_reason():
    assert broad_handlers_without_reason() == []


def test_the_scan_catches_a_silent_handler(tmp_path):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "bad.py").write_text(
        "try:\n    x = 1\nexcept Exception:\n    pass\n"
        "try:\n    y = 1\nexcept (OSError, Exception):\n    y = 0\n"
        "try:\n    z = 1\nexcept Exception:  # the reason\n    z = 0\n")
    assert broad_handlers_without_reason(tmp_path) == ["schemas/bad.py:3: bare pass",
                                                       "schemas/bad.py:7: swallowed without a reason"]
