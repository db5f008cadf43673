"""Public functions with more than three parameters take the rest by keyword, so a call reads as
what it passes (``Spool(root, run_id, rank, max_bytes=...)``) and parameters can be added safely.

The CLI's command functions are left out: typer calls them, by name, from the command line."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("schemas", "producers", "consumers", "flows", "rankstream", "deploy")
MOST_POSITIONAL = 3


def _public_functions(tree: ast.AST):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for inner in _public_functions(node):
                yield f"{node.name}.{inner[0]}", inner[1]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                not node.name.startswith("_") or node.name == "__init__"):
            yield node.name, node


def _too_positional() -> list[str]:
    found = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            if path.relative_to(ROOT).parts[:2] == ("rankstream", "cli"):
                continue
            for name, function in _public_functions(ast.parse(path.read_text())):
                arguments = function.args
                positional = [a for a in arguments.posonlyargs + arguments.args if a.arg not in ("self", "cls")]
                if len(positional) > MOST_POSITIONAL and arguments.vararg is None:
                    found.append(f"{path.relative_to(ROOT)}:{function.lineno} {name}")
    return found


def test_public_functions_take_parameters_past_the_third_by_keyword():
    assert _too_positional() == []


def test_the_check_sees_a_function_with_four_positional_parameters(tmp_path, monkeypatch):
    tree = ast.parse("def publish(config, run_id, ranks, world_size):\n    pass\n")
    (name, function), = _public_functions(tree)
    assert name == "publish" and len(function.args.args) == 4 > MOST_POSITIONAL
