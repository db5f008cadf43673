"""Trace-event batches: the column-oriented payload that carries almost all of the volume.

On the wire a batch is ``{"n": count, "str": {col: [values, codes]}, "int": {col: bytes}, "args": [...]}``:

* string columns (``name``, ``cat``, ``ph``) are dictionary-encoded: the distinct values once,
  plus one little-endian uint32 code per event. Op names repeat constantly, so this is both
  smaller on the broker and far faster to load than a list of strings;
* integer columns are little-endian int64 buffers; ``NULL_INT`` marks a missing value in the
  nullable ones (``step``, ``flow_id``, ``correlation_id``);
* ``args`` is sparse: ``"args": [json texts]`` for the events that have any, and ``"args_at"``,
  their event indexes as little-endian uint32. Most events carry none, so a batch usually sends
  two empty fields instead of a thousand nils. The texts are encoded on the producer's thread.

Building a batch (:meth:`TraceBatch.from_rows`) packs rows with the standard library's ``array``,
which is fastest for the few hundred events a producer flushes at a time. Reading one
(:meth:`TraceBatch.from_wire`) validates every length and code, because the consumer must refuse
bad input before it reaches DuckDB.
"""

from __future__ import annotations

import json
import operator
import sys
import zlib
from array import array
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import orjson

from rankstream.schemas.fields import PayloadError

__all__ = [
    "TraceBatch",
    "TRACE_STRING_COLUMNS",
    "TRACE_INT_COLUMNS",
    "TRACE_NULLABLE_COLUMNS",
    "TRACE_ROW_FIELDS",
    "NULL_INT",
    "MAX_BATCH_EVENTS",
    "MAX_TIMESTAMP_NS",
    "row_problem",
]

NULL_INT = -(2**63)
MAX_BATCH_EVENTS = 1_000_000
#: A span longer than 30 days is a corrupt timestamp, not a measurement.
MAX_DURATION_NS = 30 * 24 * 3600 * 10**9
#: The latest timestamp accepted (2^62 ns: the year 2116), so that ts + dur, and the clock offsets
#: and unit conversions the analyses apply, always fit in int64: one event can never break its run.
MAX_TIMESTAMP_NS = 2**62

TRACE_STRING_COLUMNS = ("name", "cat", "ph")
TRACE_INT_COLUMNS = ("ts_ns", "dur_ns", "pid", "tid", "step", "flow_id", "correlation_id")
TRACE_NULLABLE_COLUMNS = frozenset({"step", "flow_id", "correlation_id"})
#: Order of the fields in one producer row tuple.
TRACE_ROW_FIELDS = TRACE_STRING_COLUMNS + TRACE_INT_COLUMNS + ("args",)

_BIG_ENDIAN = sys.byteorder == "big"


def _dictionary_encode(values: Sequence[Any]) -> tuple[list[str], bytes]:
    try:
        index = {v: i for i, v in enumerate(dict.fromkeys(values))}
        if len(index) == 1:  # one value (ph, often cat): every code is 0
            codes = array("I", bytes(4 * len(values)))
        else:  # an itemgetter of every value looks them all up in one C call
            codes = array("I", operator.itemgetter(*values)(index) if len(values) > 1 else [index[values[0]]])
    except TypeError:  # an unhashable value: fall back to its text
        texts = [v if type(v) is str else str(v) for v in values]
        index = {v: i for i, v in enumerate(dict.fromkeys(texts))}
        codes = array("I", map(index.__getitem__, texts))
    if _BIG_ENDIAN:
        codes.byteswap()
    return [v if type(v) is str else str(v) for v in index], codes.tobytes()


def _int_column(values: Sequence[Any], name: str) -> bytes:
    try:  # the common case, a column of integers, converts in one C call
        column = array("q", values)
    except (TypeError, OverflowError):
        if values.count(None) == len(values):  # a column nobody filled: common for flow ids
            column = array("q", [NULL_INT]) * len(values)
        else:
            try:  # a column with some NULLs (correlation ids of ops, none on spans) stays in C too
                column = array("q", [NULL_INT if v is None else v for v in values])
            except (TypeError, OverflowError):
                column = array("q", [_to_int(v, name) for v in values])
    if _BIG_ENDIAN:
        column.byteswap()
    return column.tobytes()


def _to_int(value: Any, name: str) -> int:
    """An integer column's value: an integer (Python's or numpy's) that fits in 64 bits, or None.
    Anything else raises ValueError naming the field: text is not a number and a float is not an
    integer, so nothing is coerced into a value the user did not give."""
    if value is None:
        return NULL_INT
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"field {name!r}: expected an integer, got {type(value).__name__}") from None
    if not NULL_INT < number < 2**63:
        raise ValueError(f"field {name!r}: integer {number} does not fit in 64 bits")
    return number


def row_problem(row: Sequence[Any]) -> str | None:
    """What is wrong with one producer row (``TRACE_ROW_FIELDS`` order), or None: the check behind
    a batch that failed to build or to pass ``check_values``, to drop only the bad events."""
    fields = dict(zip(TRACE_ROW_FIELDS, row))
    try:
        values = {name: _to_int(fields[name], name) for name in TRACE_INT_COLUMNS}
    except ValueError as exc:
        return str(exc)
    if not 0 <= values["ts_ns"] <= MAX_TIMESTAMP_NS:
        return f"field 'ts_ns': {values['ts_ns']} is not a time between 0 and 2^62 ns"
    if not 0 <= values["dur_ns"] <= MAX_DURATION_NS:
        return f"field 'dur_ns': {values['dur_ns']} is negative or longer than 30 days"
    return None


def _sparse_args(values: Sequence[Any]) -> tuple[bytes, list[str]]:
    if values.count(None) == len(values):
        return b"", []
    present = [i for i, a in enumerate(values) if a is not None]
    at = array("I", present)
    if _BIG_ENDIAN:
        at.byteswap()
    return at.tobytes(), [_args_text(values[i]) for i in present]


#: orjson, because with the broker down encoding counter args with ``json`` was most of the sender
#: thread's time (docs/benchmarks.md, "Measurements behind the code").
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS


def _args_text(value: Any) -> str | None:
    """An event's args as JSON text: a mapping, a flat tuple of keys then values (how the producer
    queues a mapping), or text already. NaN and infinities become null (JSON has neither);
    integers beyond 64 bits go through the standard library, which keeps them exact."""
    if value is None:
        return None
    if type(value) is str:
        return value
    try:
        if type(value) is tuple:
            half = len(value) // 2
            value = dict(zip(value[:half], value[half:]))
        try:
            return orjson.dumps(value, default=str, option=_ORJSON_OPTIONS).decode()
        except orjson.JSONEncodeError:
            return json.dumps(value, separators=(",", ":"), default=str, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return json.dumps({"unserializable": _short_repr(value)})


def _short_repr(value: Any) -> str:
    try:
        return repr(value)[:200]
    except RecursionError:  # args nested past the interpreter's recursion limit
        return "nested too deep to encode"


@dataclass(frozen=True, slots=True)
class TraceBatch:
    """A batch of trace events in wire layout (see the module docstring)."""

    count: int
    strings: Mapping[str, tuple[list[str], bytes]]
    ints: Mapping[str, bytes]
    #: Event indexes (uint32 LE) of the events that have args, and their JSON texts.
    args_at: bytes
    args: list[str]

    @classmethod
    def from_rows(cls, rows: Sequence[tuple]) -> "TraceBatch":
        """Build a batch from producer row tuples ordered as ``TRACE_ROW_FIELDS``."""
        columns: list[Sequence[Any]] = list(zip(*rows)) if rows else [() for _ in TRACE_ROW_FIELDS]
        return cls.from_columns(dict(zip(TRACE_ROW_FIELDS, columns)))

    @classmethod
    def from_columns(cls, columns: Mapping[str, Sequence[Any] | bytes]) -> "TraceBatch":
        """Build a batch from whole columns named as ``TRACE_ROW_FIELDS``. An integer column may
        also be little-endian int64 bytes already (an importer that computed it with numpy);
        ``args`` holds JSON texts, mappings or None."""
        count = len(columns["ph"])
        ints = {}
        for name in TRACE_INT_COLUMNS:
            column = columns[name]
            if type(column) is bytes:
                if len(column) != 8 * count:
                    raise ValueError(f"column {name!r}: {len(column)} bytes for {count} events")
                ints[name] = column
            else:
                ints[name] = _int_column(column, name)
        args_at, args = _sparse_args(columns["args"])
        return cls(
            count=count,
            strings={name: _dictionary_encode(columns[name]) for name in TRACE_STRING_COLUMNS},
            ints=ints,
            args_at=args_at,
            args=args,
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "n": self.count,
            "str": {name: [values, codes] for name, (values, codes) in self.strings.items()},
            "int": dict(self.ints),
            "args_at": self.args_at,
            "args": self.args,
        }

    @classmethod
    def from_wire(cls, wire: Any) -> "TraceBatch":
        """Validate a decoded wire map; raises :class:`PayloadError` naming the first problem."""
        if not isinstance(wire, dict):
            raise PayloadError("trace batch: expected a map")
        count = wire.get("n")
        if type(count) is not int or not 0 <= count <= MAX_BATCH_EVENTS:
            raise PayloadError(f"trace batch: event count {count!r} is not an integer in 0..{MAX_BATCH_EVENTS}")
        strings_in, ints_in, args = wire.get("str"), wire.get("int"), wire.get("args")
        if not isinstance(strings_in, dict) or not isinstance(ints_in, dict):
            raise PayloadError("trace batch: 'str' and 'int' must be maps of columns")
        strings: dict[str, tuple[list[str], bytes]] = {}
        for name in TRACE_STRING_COLUMNS:
            column = strings_in.get(name)
            if not isinstance(column, (list, tuple)) or len(column) != 2:
                raise PayloadError(f"trace batch: string column {name!r} is missing or not [values, codes]")
            values, codes = column
            if not isinstance(values, list) or any(type(v) is not str for v in values):
                raise PayloadError(f"trace batch: column {name!r} dictionary must be a list of strings")
            if type(codes) is not bytes or len(codes) != 4 * count:
                raise PayloadError(f"trace batch: column {name!r} codes must be {4 * count} bytes")
            if count and int(np.frombuffer(codes, "<u4").max()) >= len(values):
                raise PayloadError(f"trace batch: column {name!r} has a code outside its dictionary")
            strings[name] = (values, codes)
        ints: dict[str, bytes] = {}
        for name in TRACE_INT_COLUMNS:
            column = ints_in.get(name)
            if type(column) is not bytes or len(column) != 8 * count:
                raise PayloadError(f"trace batch: integer column {name!r} must be {8 * count} bytes")
            ints[name] = column
        args_at = wire.get("args_at")
        if type(args_at) is not bytes or not isinstance(args, list) or len(args_at) != 4 * len(args):
            raise PayloadError("trace batch: 'args_at' must hold one uint32 event index per 'args' entry")
        if any(type(a) is not str for a in args):
            raise PayloadError("trace batch: every 'args' entry must be JSON text")
        if args and int(np.frombuffer(args_at, "<u4").max()) >= count:
            raise PayloadError("trace batch: an 'args_at' index is outside the batch")
        batch = cls(count=count, strings=strings, ints=ints, args_at=args_at, args=args)
        batch.check_values()
        return batch

    def check_values(self) -> None:
        """Raise PayloadError when a time is out of range (see ``MAX_TIMESTAMP_NS``)."""
        if not self.count:
            return
        ts = np.frombuffer(self.ints["ts_ns"], "<i8")
        dur = np.frombuffer(self.ints["dur_ns"], "<i8")
        if int(ts.min()) < 0 or int(ts.max()) > MAX_TIMESTAMP_NS:
            raise PayloadError("trace batch: a timestamp is negative or after 2^62 ns")
        if int(dur.min()) < 0 or int(dur.max()) > MAX_DURATION_NS:
            raise PayloadError("trace batch: duration is negative or longer than 30 days")

    def digest(self) -> int:
        """A checksum of the events (CRC-32 of every column): a resend repeats it exactly, so a
        repeated batch key whose digest differs is another batch, rejected as a conflict."""
        crc = 0
        for name in TRACE_STRING_COLUMNS:
            values, codes = self.strings[name]
            crc = zlib.crc32("\x00".join(values).encode("utf-8", "surrogatepass"), zlib.crc32(codes, crc))
        for name in TRACE_INT_COLUMNS:
            crc = zlib.crc32(self.ints[name], crc)
        return zlib.crc32("\x00".join(self.args).encode("utf-8", "surrogatepass"), zlib.crc32(self.args_at, crc))

    def string_column(self, name: str):
        """``(codes as uint32 numpy array, dictionary values)`` of a string column."""
        values, codes = self.strings[name]
        return np.frombuffer(codes, "<u4"), values

    def args_positions(self):
        """Event indexes (uint32 numpy array) of the events that have args, matching ``args``."""
        return np.frombuffer(self.args_at, "<u4")

    def select(self, rows) -> "TraceBatch":
        """The events at ``rows`` (a sorted numpy array of indexes) as a batch of their own;
        string dictionaries are kept whole."""
        positions = self.args_positions()
        kept = np.flatnonzero(np.isin(positions, rows))
        args_at = np.searchsorted(rows, positions[kept]).astype("<u4")
        return TraceBatch(
            count=len(rows),
            strings={name: (values, np.frombuffer(codes, "<u4")[rows].tobytes())
                     for name, (values, codes) in self.strings.items()},
            ints={name: np.frombuffer(column, "<i8")[rows].tobytes() for name, column in self.ints.items()},
            args_at=args_at.tobytes(),
            args=[self.args[i] for i in kept],
        )

    def int_column(self, name: str):
        """``(int64 numpy array, null mask or None)`` of an integer column."""
        column = np.frombuffer(self.ints[name], "<i8")
        if name in TRACE_NULLABLE_COLUMNS:
            return column, column == NULL_INT
        return column, None


def upcast_v1(wire: Any) -> dict[str, Any]:
    """Version 1 was row-oriented: ``{"events": [{"name", "cat", "ph", "ts_ns", "dur_ns", ...}]}``.

    It is still accepted so that simple producers (or old spools) can send a list of event maps.
    """
    if not isinstance(wire, dict) or not isinstance(wire.get("events"), list):
        raise PayloadError("trace batch v1: expected {'events': [...]}")
    rows = []
    for event in wire["events"]:
        if not isinstance(event, dict):
            raise PayloadError("trace batch v1: every event must be a map")
        if type(event.get("name")) is not str or type(event.get("ts_ns")) is not int:
            raise PayloadError("trace batch v1: every event needs a string 'name' and an integer 'ts_ns'")
        rows.append(tuple(
            event.get(field, "" if field in TRACE_STRING_COLUMNS else (0 if field in ("dur_ns", "pid", "tid") else None))
            for field in TRACE_ROW_FIELDS
        ))
    return TraceBatch.from_rows(rows).to_wire()
