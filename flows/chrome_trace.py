"""Checks a file against the Chrome trace event format, as chrome://tracing and Perfetto read it.

Used by the tests on every timeline rankstream writes, and available to users
(``rankstream check-trace FILE``) for any trace. Each event is first judged by the importer's own
validator (``producers.trace_validation``), then by the format's rules the importer does not need
(instant scopes, counter values, flow ids, B/E nesting). It loads the file whole: it is a checker,
not part of the streaming path.
"""

from __future__ import annotations

import gzip
import json
from numbers import Number
from pathlib import Path

from rankstream.producers.trace_reader import unreadable
from rankstream.producers.trace_validation import CHROME_PHASES, event_problem

__all__ = ["check_chrome_trace", "PHASES"]

#: Every phase the format defines.
PHASES = CHROME_PHASES
_SCOPES = {"g", "p", "t"}


def _load(path: Path):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def check_chrome_trace(path: Path | str, limit: int = 20) -> tuple[list[str], dict]:
    """(problems, summary): up to ``limit`` problems, and counts of events by phase and of pids."""
    path = Path(path)
    try:
        data = _load(path)
    except (ValueError, RecursionError) as exc:
        return [unreadable(path, exc)], {}
    except (OSError, EOFError) as exc:
        return [f"not readable: {exc}"], {}
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        return ["expected a JSON array or an object with a traceEvents array"], {}
    problems: list[str] = []
    stacks: dict[tuple, list[str]] = {}
    phases: dict[str, int] = {}
    pids: set = set()

    def problem(index: int, text: str) -> None:
        if len(problems) < limit:
            problems.append(f"event {index}: {text}")

    for index, event in enumerate(events):
        if isinstance(event, dict) and not event:
            continue  # padding, as torch.profiler ends its arrays
        invalid = event_problem(event)  # what ``import trace`` refuses, word for word
        if invalid is not None:
            problem(index, invalid)
            if not isinstance(event, dict) or event.get("ph") not in PHASES:
                continue
        ph = event["ph"]
        phases[ph] = phases.get(ph, 0) + 1
        pids.add(event.get("pid"))
        if "args" in event and not isinstance(event["args"], dict):
            problem(index, "args must be an object")
        if ph in ("i", "I") and event.get("s", "t") not in _SCOPES:
            problem(index, f"instant scope {event.get('s')!r} is not g, p or t")
        if ph == "C" and not all(isinstance(v, Number) for v in (event.get("args") or {}).values()):
            problem(index, "counter args must be numbers")
        if ph in ("s", "t", "f", "b", "n", "e") and "id" not in event and "id2" not in event:
            problem(index, f"phase {ph} needs an id")
        if ph == "M" and not isinstance(event.get("args"), dict):
            problem(index, "metadata event needs args")
        if ph in ("B", "E"):
            stack = stacks.setdefault((event.get("pid"), event.get("tid")), [])
            if ph == "B":
                stack.append(event.get("name"))
            elif not stack:
                problem(index, "E with no open B on its thread")
            else:
                stack.pop()
    for (pid, tid), stack in stacks.items():
        if stack:
            problems.append(f"pid {pid} tid {tid}: {len(stack)} B event(s) never ended ({stack[-1]!r} last)")
    return problems[:limit], {"events": len(events), "phases": phases, "pids": sorted(p for p in pids if p is not None)}
