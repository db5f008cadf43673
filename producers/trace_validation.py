"""What makes one trace event importable: the one validator behind ``import trace`` and
``check-trace``, so the two never disagree on what is valid.

An event is refused when its columns could not hold it faithfully: an unknown phase, a named phase
without a name, a time that is missing (only metadata events may omit it), not a number, or beyond
2^62 ns, a complete event without a duration or with one that is negative or longer than 30 days,
a pid or tid that is neither an integer nor a name (args are kept as JSON, whatever they are). The importer
turns each refused event into an ``input_rejects`` row and imports the rest.

The importer checks whole chunks at once (``checked_chunk``) and looks at events one by one only
in a chunk that fails, so a valid file costs a few passes in C over its columns.
"""

from __future__ import annotations

from typing import Any

from rankstream.schemas.trace import MAX_DURATION_NS, MAX_TIMESTAMP_NS

__all__ = ["CHROME_PHASES", "NEEDS_NAME", "event_problem", "checked_chunk"]

#: Every phase the Chrome trace event format defines.
CHROME_PHASES = frozenset("BEXiICMsStfPNODVvRcbne") | {"(", ")"}
#: Phases whose events are drawn by name.
NEEDS_NAME = frozenset("BXiICbnesSftPNOD")
_MAX_TS_US = MAX_TIMESTAMP_NS // 1000
_MAX_DUR_US = MAX_DURATION_NS // 1000
_NUMBERS = frozenset({int, float})


def event_problem(event: Any) -> str | None:
    """Why ``event`` cannot be imported, or None."""
    if not isinstance(event, dict):
        return "not a JSON object"
    ph = event.get("ph")
    if not isinstance(ph, str) or ph not in CHROME_PHASES:
        return f"unknown phase {ph!r}"
    if ph in NEEDS_NAME and not isinstance(event.get("name"), str):
        return f"phase {ph} needs a string 'name'"
    ts = event.get("ts")
    if ph != "M" or ts is not None:
        if type(ts) not in _NUMBERS or ts != ts or abs(ts) > _MAX_TS_US:
            return f"'ts' must be a number of microseconds within 2^62 ns (got {_short(ts)})"
    duration = event.get("dur")
    if ph == "X" or duration is not None:
        if type(duration) not in _NUMBERS or not 0 <= duration <= _MAX_DUR_US:
            return f"'dur' must be a number of microseconds between 0 and 30 days (got {_short(duration)})"
    for key in ("pid", "tid"):
        if event.get(key) is not None and not isinstance(event[key], (int, str)):
            return f"'{key}' must be an integer or a name (got {_short(event[key])})"
    return None


def _short(value: Any) -> str:
    return repr(value)[:60]


def checked_chunk(chunk: list) -> tuple[list[dict], list[tuple[int, str]]]:
    """The chunk's events to import ({} padding left out) and the refused ones as (position in the
    chunk, problem). Whole columns are checked first; only a chunk that fails is checked event by
    event."""
    try:
        if set(map(type, chunk)) <= {dict}:
            events = [e for e in chunk if e]
            if _columns_valid(events):
                return events, []
    except TypeError:  # an unhashable value where a phase was expected
        pass
    events, refused = [], []
    for index, event in enumerate(chunk):
        if isinstance(event, dict) and not event:
            continue
        problem = event_problem(event)
        if problem is None:
            events.append(event)
        else:
            refused.append((index, problem))
    return events, refused


def _columns_valid(events: list[dict]) -> bool:
    """Whether every event passes ``event_problem``, judged column by column."""
    phases = [e.get("ph") for e in events]
    if not set(phases) <= CHROME_PHASES:
        return False
    names = [e.get("name") for e in events]
    if not set(map(type, names)) <= {str} and any(
            type(n) is not str and p in NEEDS_NAME for n, p in zip(names, phases)):
        return False
    times = [e.get("ts") for e in events]
    time_types = set(map(type, times))
    if None in times:
        if any(t is None and p != "M" for t, p in zip(times, phases)):
            return False
        times = [t for t in times if t is not None]
        time_types.discard(type(None))
    if not time_types <= _NUMBERS or (float in time_types and any(t != t for t in times)) \
            or (times and max(max(times), -min(times)) > _MAX_TS_US):
        return False
    durations = [e.get("dur") for e in events]
    if None in durations:
        if any(d is None and p == "X" for d, p in zip(durations, phases)):
            return False
        durations = [d for d in durations if d is not None]
    duration_types = set(map(type, durations))
    if not duration_types <= _NUMBERS or (float in duration_types and any(d != d for d in durations)) \
            or (durations and not (min(durations) >= 0 and max(durations) <= _MAX_DUR_US)):
        return False
    for key in ("pid", "tid"):
        if not set(map(type, (e.get(key) for e in events))) <= {int, str, type(None)}:
            return False
    return True
