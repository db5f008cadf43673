"""Flight Recorder entries as columns: what the diagnosis reads, and nothing else.

One row per entry, numpy arrays, text fields dictionary-encoded (an op, a shape or a group name is
a small integer), so matching a million entries is array work. Two sources fill it: a rank's raw
dump entries (``from_dump_entries``, in the dump loader's worker processes) and the stored
``fr_entries`` rows (``from_arrow``, for a run in the database, live or imported). The fields are
torch's, translated the way ``producers.fr_reader`` translates them for the bus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["Entries", "Vocabulary", "STATES", "from_dump_entries", "concatenate", "recoded", "parse_op", "folded_state", "fold_close_states", "p2p_peers",
           "dtypes_used"]

#: Entry states in progress order; a missing or unknown state counts as scheduled.
STATES = ("scheduled", "started", "completed")
_STATE_CODE = {name: code for code, name in enumerate(STATES)}

#: Collectives whose members legitimately pass different sizes (uneven splits, a root that alone
#: gathers or scatters): their shapes are not compared.
UNEVEN_OPS = frozenset({"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "gather", "scatter"})
UNEVEN = "(sizes differ by design)"


def dtypes_used(input_dtypes: Sequence | None, output_dtypes: Sequence | None) -> str:
    """The dtype key of an ``UNEVEN_OPS`` call: the distinct dtypes it used. Its per-side lists
    differ by design (only a gather's root lists outputs, only a scatter's root inputs), so a rank
    is at odds with its peers only when it used another dtype."""
    return repr(sorted(set(input_dtypes or ()) | set(output_dtypes or ())))

#: Columns kept as 32-bit integers when every value is within +-2**30 (sequence numbers and record
#: ids are; times are not): the headroom keeps arithmetic on them from overflowing.
_NARROW, _NARROW_LIMIT = ("seq", "p2p_seq", "record"), 2**30
_COLUMNS = ("rank", "group", "seq", "p2p_seq", "is_p2p", "op", "peer", "shape", "dtype", "state", "created",
            "waited", "record")


def parse_op(profiling_name: str) -> tuple[str, int, int]:
    """``nccl:all_reduce`` -> ("all_reduce", -1, -1); ``nccl:send 0->1`` -> ("send", 0, 1) and
    ``nccl:recv 1<-0`` -> ("recv", 0, 1): (op, group-local source, group-local destination)."""
    name = profiling_name.split(":", 1)[-1]
    op, _, meta = name.partition(" ")
    try:
        if op == "send" and "->" in meta:
            src, dst = meta.split("->")
            return op, int(src), int(dst)
        if op == "recv" and "<-" in meta:
            dst, src = meta.split("<-")
            return op, int(src), int(dst)
    except ValueError:
        pass
    return op, -1, -1


@dataclass
class Vocabulary:
    """Dictionary encodings shared by every rank's columns: text -> code, and back."""

    groups: list[tuple[str, str | None]] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    _indexes: dict = field(default_factory=dict, repr=False, compare=False)
    #: Turns a value that is only a key into its text (``kind``, value) -> text; None: all are text.
    resolver: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:  # the lookup tables are rebuilt on demand: half the bytes
        return {"groups": self.groups, "ops": self.ops, "shapes": self.shapes, "dtypes": self.dtypes}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _indexes={}, resolver=None)

    def text(self, kind: str, code: int) -> str:
        """The value of a code as text; a value known only by a key (a stored run's) is looked up
        with ``resolver`` once."""
        table = getattr(self, kind)
        value = table[code]
        if not isinstance(value, str) and self.resolver is not None:
            value = table[code] = self.resolver(kind, value)
        return value if isinstance(value, str) else repr(value)

    def codes(self, kind: str, values: Iterable) -> np.ndarray:
        """The code of each value, new values added. Lookups run in C (``map``), and each distinct
        value is handled in Python once: a dump repeats a handful of ops, groups and shapes."""
        table: list = getattr(self, kind)
        index = self._indexes.get(kind)
        if index is None:
            index = self._indexes[kind] = {value: code for code, value in enumerate(table)}
        values = values if isinstance(values, list) else list(values)
        for value in dict.fromkeys(values):
            if value not in index:
                index[value] = len(table)
                table.append(value)
        return np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))


@dataclass
class Entries:
    """Columns of every entry (see the module docstring); ``peer`` is the p2p peer's global rank
    (-1 for collectives), ``created`` is 0 when unknown, ``state`` a code of ``STATES``: the state
    torch wrote, or later when it recorded a start or completion time. ``waited`` is the
    microseconds from creation to discovered completion on the rank's own clock (-1 when unknown):
    unlike either time, it does not depend on how far that clock is from its peers'."""

    rank: np.ndarray
    group: np.ndarray
    seq: np.ndarray
    p2p_seq: np.ndarray
    is_p2p: np.ndarray
    op: np.ndarray
    peer: np.ndarray
    shape: np.ndarray
    dtype: np.ndarray
    state: np.ndarray
    created: np.ndarray
    waited: np.ndarray
    record: np.ndarray
    vocabulary: Vocabulary

    def __post_init__(self) -> None:
        for name in _NARROW:  # a dump's numbers are small: half the bytes of the widest columns
            column = getattr(self, name)
            if column.dtype == np.int64 and len(column) and -_NARROW_LIMIT < column.min() and column.max() < _NARROW_LIMIT:
                setattr(self, name, column.astype(np.int32))

    def __len__(self) -> int:
        return len(self.rank)

    def head(self, count: int) -> "Entries":
        """The first ``count`` rows, as views (no copy)."""
        return Entries(**{name: getattr(self, name)[:count] for name in _COLUMNS}, vocabulary=self.vocabulary)

    def reorder(self, order: np.ndarray) -> None:
        """Put the rows in ``order``, one column at a time, so that only one column is ever copied."""
        for name in _COLUMNS:
            setattr(self, name, getattr(self, name)[order])


#: The fields read from each raw entry, in one C-level lookup per entry.
_FIELDS = ("process_group", "collective_seq_id", "p2p_seq_id", "profiling_name", "input_sizes", "output_sizes",
           "input_dtypes", "output_dtypes", "state", "time_created_ns", "time_discovered_started_ns",
           "time_discovered_completed_ns", "record_id")
_GET_ALL = itemgetter(*_FIELDS)


def _lenient(entry: Any) -> tuple:
    if not isinstance(entry, dict):
        raise ValueError(f"an FR entry must be a map, got {type(entry).__name__}")
    return tuple(entry.get(name) for name in _FIELDS)


def folded_state(state: np.ndarray, started: np.ndarray, completed: np.ndarray) -> np.ndarray:
    """The state, raised to started or completed where torch recorded that time."""
    return np.maximum(state, np.where(completed > 0, 2, np.where(started > 0, 1, 0)).astype(np.int8))


def waited_us(created: np.ndarray, completed: np.ndarray) -> np.ndarray:
    """Creation to discovered completion in microseconds (int32), -1 where either is unknown."""
    known = (created > 0) & (completed >= created)
    span = np.where(known, (completed - created) // 1000, -1)
    return np.minimum(span, np.iinfo(np.int32).max).astype(np.int32)


def fold_close_states(entries: Entries) -> None:
    """Give the members of each coalesced block the state of the ``coalesced`` entry that closes it.

    torch records the members of a ``batch_isend_irecv`` or of coalesced collectives without
    events of their own: they stay ``scheduled`` forever, and only the close, recorded right after
    them (same rank and group, the members' p2p number or collective number), carries the block's
    state. A block is one call: its members started and completed when the close did."""
    ops = entries.vocabulary.ops
    if "coalesced" not in ops or not len(entries):
        return
    order = np.lexsort((entries.record, entries.rank))
    rank, group = entries.rank[order], entries.group[order]
    p2p, close = entries.is_p2p[order], entries.op[order] == ops.index("coalesced")
    key = np.where(p2p, entries.p2p_seq[order], entries.seq[order])
    # a close takes the key of the block before it: its p2p number after sends and receives
    previous_p2p = np.r_[False, p2p[:-1]]
    key = np.where(close & previous_p2p, entries.p2p_seq[order], key)
    same = np.r_[False, (rank[1:] == rank[:-1]) & (group[1:] == group[:-1]) & (key[1:] == key[:-1])
                 & ~close[:-1] & ((p2p[1:] == p2p[:-1]) | close[1:])]
    block = np.cumsum(~same) - 1
    last = np.r_[np.flatnonzero(block[1:] != block[:-1]), len(block) - 1]
    closing = np.where(close[last], entries.state[order][last], 0).astype(entries.state.dtype)
    entries.state[order] = np.maximum(entries.state[order], closing[block])


def _ints(values: Sequence, what: str) -> np.ndarray:
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):  # None for unknown, or not an integer at all
        try:
            return np.array([0 if v is None else v for v in values], dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"an entry's {what} is not a 64-bit integer") from None


def _group_key(group) -> tuple[str, str | None]:
    if isinstance(group, (list, tuple)) and group:
        return str(group[0]), None if len(group) < 2 or group[1] is None else str(group[1])
    return "", None


def from_dump_entries(entries: list, rank: int, members: dict[str, list[int]],
                      *, vocabulary: Vocabulary) -> Entries:
    """One rank's raw dump entries as columns. ``members`` maps a group name to its sorted global
    ranks (to turn a p2p op's group-local peer into a global rank). Raises ValueError naming the
    field when an entry does not follow the dump layout."""
    try:
        rows = list(map(_GET_ALL, entries))
    except (KeyError, TypeError):  # a dump that omits fields (older torch, hand-made): field by field
        rows = list(map(_lenient, entries))
    n = len(rows)
    (groups, seqs, p2p_seqs, names, in_sizes, out_sizes, in_dtypes, out_dtypes, states, created, started,
     completed, records) = zip(*rows) if n else ((),) * len(_FIELDS)
    try:  # pickled process groups are tuples: their codes come straight from them
        raw_groups = {g: _group_key(g) for g in dict.fromkeys(groups)}
    except TypeError:  # JSON's are lists
        raw_groups = None
    group_keys = list(map(raw_groups.__getitem__, groups)) if raw_groups is not None else list(map(_group_key, groups))
    distinct_names = dict.fromkeys(names)
    if any(not isinstance(name, str) for name in distinct_names):
        raise ValueError("an entry has no profiling_name")
    parsed_by_name = {name: parse_op(name) for name in distinct_names}
    parsed = list(map(parsed_by_name.__getitem__, names))
    op_names = [op for op, _, _ in parsed]
    every_row = np.arange(n)
    is_p2p, peer = p2p_peers(parsed, every_row, every_row, group_text=[key[0] for key in group_keys], members=members)
    uneven = {name for name, (op, _, _) in parsed_by_name.items() if op in UNEVEN_OPS}
    shape_keys = list(map(repr, zip(in_sizes, out_sizes)))
    dtype_keys = list(map(repr, zip(in_dtypes, out_dtypes)))
    if uneven:
        shape_keys = [UNEVEN if name in uneven else key for name, key in zip(names, shape_keys)]
        dtype_keys = [dtypes_used(i, o) if name in uneven else key
                      for name, i, o, key in zip(names, in_dtypes, out_dtypes, dtype_keys)]
    created_ns = _ints(created, "time_created_ns")
    completed_ns = _ints(completed, "time_discovered_completed_ns")
    return Entries(
        rank=np.full(n, rank, dtype=np.int32),
        group=vocabulary.codes("groups", group_keys),
        seq=_ints(seqs, "collective_seq_id"), p2p_seq=_ints(p2p_seqs, "p2p_seq_id"),
        is_p2p=is_p2p,
        op=vocabulary.codes("ops", op_names),
        peer=peer,
        shape=vocabulary.codes("shapes", shape_keys),
        dtype=vocabulary.codes("dtypes", dtype_keys),
        state=folded_state(np.fromiter(map(_STATE_CODE.get, states, (0,) * n), dtype=np.int8, count=n),
                           _ints(started, "time_discovered_started_ns"), completed_ns),
        created=created_ns, waited=waited_us(created_ns, completed_ns),
        record=_ints(records, "record_id"),
        vocabulary=vocabulary,
    )


def p2p_peers(parsed: list[tuple], profiling: np.ndarray, group_of_row: np.ndarray, *, group_text: list[str],
              members: dict[str, list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per entry: whether it is a send or receive, and its peer's global rank (-1 for collectives).
    ``parsed[code]`` is ``parse_op`` of profiling name ``code``; the peer in a name is local to
    the group, so it is mapped through the group's members when the dumps list them."""
    n = len(profiling)
    is_p2p = np.array([op in ("send", "recv") for op, _, _ in parsed], dtype=bool)[profiling] if n else \
        np.zeros(0, dtype=bool)
    peer = np.full(n, -1, dtype=np.int32)
    for row in np.flatnonzero(is_p2p).tolist():
        op, src, dst = parsed[profiling[row]]
        ranks = members.get(group_text[group_of_row[row]]) or []
        local = dst if op == "send" else src
        peer[row] = ranks[local] if 0 <= local < len(ranks) else local
    return is_p2p, peer


def concatenate(parts: list[Entries], vocabulary: Vocabulary) -> Entries:
    """Parts that share ``vocabulary`` as one table. ``parts`` is emptied: each column's pieces are
    let go as soon as that column is joined, so the parts and the table are never both whole in
    memory (at 8192 ranks they are a gigabyte each)."""
    if not parts:
        empty = {name: np.zeros(0, dtype=np.int64) for name in _COLUMNS}
        empty["is_p2p"] = np.zeros(0, dtype=bool)
        return Entries(**empty, vocabulary=vocabulary)
    pieces = {name: [getattr(p, name) for p in parts] for name in _COLUMNS}
    parts.clear()
    joined = {}
    for name in _COLUMNS:
        joined[name] = np.concatenate(pieces.pop(name))
    return Entries(**joined, vocabulary=vocabulary)


def recoded(part: Entries, vocabulary: Vocabulary) -> Entries:
    """``part`` (with its own vocabulary, as a worker process built it) in ``vocabulary``'s codes."""
    columns = {name: getattr(part, name) for name in _COLUMNS}
    for column, kind in (("group", "groups"), ("op", "ops"), ("shape", "shapes"), ("dtype", "dtypes")):
        mapping = vocabulary.codes(kind, getattr(part.vocabulary, kind))
        columns[column] = mapping[columns[column]] if len(mapping) else columns[column]
    return Entries(**columns, vocabulary=vocabulary)
