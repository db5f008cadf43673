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


def _positional_limits() -> dict[str, int]:
    """Function (or class) name -> the most positional arguments its keyword-only signature takes."""
    limits: dict[str, int] = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                functions = [(node.name, node)] if isinstance(node, ast.FunctionDef) else [
                    (node.name, f) for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"
                ] if isinstance(node, ast.ClassDef) else []
                for name, function in functions:
                    arguments = function.args
                    if arguments.kwonlyargs and arguments.vararg is None:
                        count = len([a for a in arguments.posonlyargs + arguments.args if a.arg not in ("self", "cls")])
                        limits[name] = max(limits.get(name, 0), count)
    return limits


def test_no_call_passes_a_keyword_only_parameter_by_position():
    """A call the signature refuses fails only when it runs; this finds it in every layer, bench/ and tests/."""
    limits, wrong = _positional_limits(), []
    for folder in (*LAYERS, "bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
                    continue
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in limits and len(node.args) > limits[name]:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert wrong == []
