"""Parsed Chrome trace events (dicts) to trace batches, a chunk at a time, in two steps.

:func:`event_columns` turns a chunk into whole columns while the file is first read (one
a ``Producer.emit`` per event pays its argument handling on every event; a column pays it once).
What needs the whole file, the base time (Kineto may write it last) and the step spans, is
filled in afterwards by :func:`finish_batch`. The values are exactly what a per-event
conversion gives:

* ``ts``/``dur`` are microseconds, ints or floats, and become ``int(value * 1000)`` ns (times
  then plus the file's base time). numpy does this for a column of all ints or all floats when
  no value can overflow; anything else goes value by value, in Python integers.
* pid and tid are integers as they are, names become a stable number (:func:`as_int`).
* an event's step is the ``ProfilerStep#N`` span of its own pid that contains it (or of the
  file's only stepped pid: GPU kernels carry the device as pid).
* flow ids come from ``id`` on flow events (``s``/``t``/``f``), correlation ids from
  ``args.correlation`` or ``args["External id"]``, and args are kept as JSON text.
"""

from __future__ import annotations

import dataclasses
import json
import re
import zlib
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import orjson

from rankstream.schemas.codec import MAX_MESSAGE_BYTES
from rankstream.schemas.trace import NULL_INT, TraceBatch

__all__ = ["as_int", "Steps", "event_columns", "trace_batches", "finish_batch", "step_number", "steps_by_pid",
           "steps_column"]

#: (span starts, span ends, step numbers) of one pid, sorted by start; times in ns relative to
#: the file's base time.
Steps = tuple[list[int], list[int], list[int]]

_FLOW_PHASES = frozenset("stf")
_STEP_NAME = re.compile(r"ProfilerStep#(\d+)$")
_INT64_MAX = 2**63 - 1
#: Characters of args text per batch: at most 4 bytes each in UTF-8, so a batch stays well under
#: the message cap whatever its names and numbers add.
_MAX_ARGS_CHARS = MAX_MESSAGE_BYTES // 8


def as_int(value: Any) -> int:
    """pid/tid and flow ids: integers that fit in 64 bits as they are; names (Kineto's "Spans",
    "Traces") and integers too large for the column as a stable number of their text."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and NULL_INT < value <= _INT64_MAX:
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2.0**63:
        return int(value)
    return (1 << 40) + zlib.crc32(str(value).encode())


def _texts(values: list) -> list:
    return values if set(map(type, values)) <= {str} else [str(v) for v in values]


def _ints(values: list) -> list:
    if set(map(type, values)) <= {int} and NULL_INT < min(values, default=0) and max(values, default=0) <= _INT64_MAX:
        return values
    return [as_int(v) for v in values]


def _microseconds_to_ns(values: list) -> np.ndarray | list:
    """``int(v * 1000)`` for every value: int64 numpy when that is exact, else a list."""
    types = set(map(type, values))
    if values and types == {int}:
        try:
            column = np.array(values, dtype=np.int64)
        except OverflowError:
            column = None
        if column is not None and max(int(column.max()), -int(column.min())) <= _INT64_MAX // 1000:
            return column * 1000
    elif values and types == {float}:
        scaled = np.array(values, dtype=np.float64) * 1000
        if np.isfinite(scaled).all() and float(np.abs(scaled).max()) < 2.0**62:
            return scaled.astype(np.int64)
    return [_ns_or_null(v) for v in values]


def _ns_or_null(microseconds: Any) -> int:
    """One time in ns, or NULL when it is not a finite number or does not fit in 64 bits."""
    try:
        ns = int(microseconds * 1000)
    except (TypeError, ValueError, OverflowError):
        return NULL_INT
    return ns if NULL_INT < ns <= _INT64_MAX else NULL_INT


def step_number(name: str) -> int | None:
    """N for a span named ``ProfilerStep#N`` (torch.profiler's step marker), else None."""
    match = _STEP_NAME.match(name) if name.startswith("ProfilerStep#") else None
    return int(match.group(1)) if match else None


def steps_by_pid(spans: Iterable[tuple[int, int, int, int]]) -> dict[int, Steps]:
    """``(pid, start ns, end ns, step)`` spans of ``ProfilerStep#N`` grouped per pid and sorted by
    start, as :func:`steps_column` takes them."""
    grouped: dict[int, list[tuple[int, int, int]]] = {}
    for pid, start, end, step in spans:
        grouped.setdefault(pid, []).append((start, end, step))
    return {pid: ([s[0] for s in found], [s[1] for s in found], [s[2] for s in found])
            for pid, found in ((pid, sorted(found)) for pid, found in grouped.items())}


def steps_column(times_ns: np.ndarray, pids: np.ndarray, steps: dict[int, Steps]) -> np.ndarray:
    """Each event's step number: that of the span of its own pid (or of the only stepped pid)
    that contains its time, or NULL_INT outside every span. ``times_ns`` and the spans share
    one clock (relative for an imported file, absolute for a live profiling window)."""
    result = np.full(len(pids), NULL_INT, dtype=np.int64)
    only = next(iter(steps.values())) if len(steps) == 1 else None
    for pid in np.unique(pids) if steps else ():
        found = steps.get(int(pid)) or only
        if found is None:
            continue
        mask = pids == pid
        times = times_ns[mask]
        starts, ends, numbers = (np.array(part, dtype=np.int64) for part in found)
        at = np.maximum(np.searchsorted(starts, times, side="right") - 1, 0)
        inside = (times >= starts[at]) & (times < ends[at]) & (times != NULL_INT)
        result[mask] = np.where(inside, numbers[at], NULL_INT)
    return result


def _args_texts(args: list) -> list[str | None]:
    try:
        return [orjson.dumps(a).decode() if a else None for a in args]
    except TypeError:  # an integer beyond 64 bits (ijson keeps those exact)
        return [json.dumps(a, separators=(",", ":")) if a else None for a in args]


def _correlations(args: list) -> list[int | None]:
    return [c if type(a) is dict and isinstance(c := a.get("correlation", a.get("External id")), int) else None
            for a in args]


def event_columns(events: list[dict]) -> dict[str, Any]:
    """The ``TraceBatch`` columns of ``events`` (checked, non-empty dicts), with times relative
    to the file's base time and no steps yet (see :func:`finish_batch`)."""
    args = [e.get("args") for e in events]
    return {
        "name": _texts([e.get("name", "") for e in events]),
        "cat": _texts([e.get("cat", "") for e in events]),
        "ph": [e["ph"] for e in events],
        "ts_ns": _microseconds_to_ns([e.get("ts", 0) for e in events]),
        "dur_ns": _microseconds_to_ns([e.get("dur", 0) for e in events]),
        "pid": _ints([e.get("pid", 0) for e in events]),
        "tid": _ints([e.get("tid", 0) for e in events]),
        "step": [None] * len(events),
        "flow_id": [as_int(e["id"]) if e["ph"] in _FLOW_PHASES and e.get("id") is not None else None
                    for e in events],
        "correlation_id": _correlations(args),
        "args": _args_texts(args),
    }


def finish_batch(batch: TraceBatch, base_ns: int, steps: dict[int, Steps]) -> TraceBatch:
    """``batch`` with absolute times (plus ``base_ns``) and each event's step, once the whole
    file is known. A time that does not fit stays NULL, as the batch encoder makes it."""
    relative, _ = batch.int_column("ts_ns")
    pids, _ = batch.int_column("pid")
    ints = {**batch.ints, "step": steps_column(relative, pids, steps).astype("<i8").tobytes()}
    if base_ns:
        fits = (relative != NULL_INT) & (relative <= _INT64_MAX - base_ns)
        ints["ts_ns"] = np.where(fits, relative + np.where(fits, base_ns, 0), NULL_INT).astype("<i8").tobytes()
    return dataclasses.replace(batch, ints=ints)


def _batch_bounds(args: Sequence[str | None], size: int) -> list[tuple[int, int]]:
    """(start, end) of consecutive batches of at most ``size`` events and ``_MAX_ARGS_CHARS``."""
    lengths = [len(text) if text else 0 for text in args]
    bounds = [(start, min(start + size, len(args))) for start in range(0, len(args), size)]
    if all(sum(lengths[start:end]) <= _MAX_ARGS_CHARS for start, end in bounds):
        return bounds
    bounds, start, used = [], 0, 0
    for index, length in enumerate(lengths):
        if index > start and (index - start == size or used + length > _MAX_ARGS_CHARS):
            bounds.append((start, index))
            start, used = index, 0
        used += length
    if start < len(args):
        bounds.append((start, len(args)))
    return bounds


def _part(column: Any, start: int, end: int) -> Any:
    if isinstance(column, np.ndarray):
        return column[start:end].astype("<i8", copy=False).tobytes()
    return column[start:end]


def trace_batches(columns: dict[str, Any], size: int) -> Iterator[TraceBatch]:
    """``columns`` cut into batches of at most ``size`` events (fewer when args are large)."""
    for start, end in _batch_bounds(columns["args"], size):
        yield TraceBatch.from_columns({name: _part(column, start, end) for name, column in columns.items()})
