"""A dump's entries to the diagnosis's columns through Arrow: the fast way, for torch's own types.

Arrow converts the list of entry maps in C++ (a quarter of the time the same in Python takes), and
everything after is array work: names are dictionary-encoded, and each entry's sizes and dtypes
(lists of lists) are reduced to a 64-bit fingerprint computed over the flattened values, so that
comparing them across ranks is comparing integers. Only the distinct values are turned into text.
A dump that strays from torch's types makes Arrow refuse it; ``entries.from_dump_entries`` then
converts it field by field (and names what is wrong).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rankstream.flows.diagnosis.entries import (UNEVEN, UNEVEN_OPS, Entries, Vocabulary, dtypes_used, waited_us,
                                                folded_state, p2p_peers, parse_op)

__all__ = ["entry_table", "from_entry_tables"]

_SIZES = pa.list_(pa.list_(pa.int64()))
_NAMES = pa.list_(pa.string())
_ENTRY = pa.struct([
    ("process_group", pa.list_(pa.string())), ("collective_seq_id", pa.int64()), ("p2p_seq_id", pa.int64()),
    ("profiling_name", pa.string()), ("input_sizes", _SIZES), ("output_sizes", _SIZES),
    ("input_dtypes", _NAMES), ("output_dtypes", _NAMES), ("state", pa.string()),
    ("time_created_ns", pa.int64()), ("time_discovered_started_ns", pa.int64()),
    ("time_discovered_completed_ns", pa.int64()), ("record_id", pa.int64()),
])
_STATES = {"scheduled": 0, "started": 1, "completed": 2}
#: Odd 64-bit multipliers for the fingerprints (any fixed odd constants do).
_MIX = np.uint64(0x9E3779B97F4A7C15)
_STEP = np.uint64(0xBF58476D1CE4E5B9)


def _ints(column: pa.Array) -> np.ndarray:
    return pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _fingerprint(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """One uint64 per segment ``values[offsets[i]:offsets[i+1]]``, mixing each value with its
    position and the segment's length (wrapping arithmetic)."""
    n = len(offsets) - 1
    lengths = np.diff(offsets).astype(np.uint64)
    if not len(values):
        return lengths * _STEP
    positions = np.arange(len(values), dtype=np.uint64) - np.repeat(offsets[:-1], np.diff(offsets)).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = (values.astype(np.uint64) + np.uint64(1)) * _MIX ^ (positions + np.uint64(1)) * _STEP
        sums = np.zeros(n, dtype=np.uint64)
        nonempty = np.flatnonzero(lengths)
        if len(nonempty):
            sums[nonempty] = np.add.reduceat(mixed, offsets[:-1][nonempty])
        return sums + lengths * _STEP


def _nested_fingerprint(column: pa.Array) -> np.ndarray:
    """Per entry, a fingerprint of its list of lists of integers (the sizes of its tensors)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    inner = column.flatten()
    inner_prints = _fingerprint(inner.flatten().to_numpy(zero_copy_only=False), inner.offsets.to_numpy())
    outer = column.offsets.to_numpy()
    return _fingerprint(inner_prints, outer) if len(outer) else np.zeros(0, np.uint64)


def _list_fingerprint(column: pa.Array) -> np.ndarray:
    """Per entry, a fingerprint of its list of names (the dtypes of its tensors)."""
    names = pc.dictionary_encode(column.flatten())
    codes = names.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    # the codes are this dump's own: fingerprint the names' hashes instead
    hashes = np.array([hash(name) for name in names.dictionary.to_pylist()], dtype=np.int64)
    return _fingerprint(hashes[codes] if len(codes) else codes, column.offsets.to_numpy())


def _uneven_dtypes(field: dict, rows: np.ndarray) -> dict[int, str]:
    """The ``dtypes_used`` key of each row of an uneven op (gather, scatter, all_to_all)."""
    if not len(rows):
        return {}
    indices = pa.array(rows)
    return dict(zip(rows.tolist(), map(dtypes_used, field["input_dtypes"].take(indices).to_pylist(),
                                       field["output_dtypes"].take(indices).to_pylist())))


def _codes_with_text(prints: np.ndarray, kind: str, vocabulary: Vocabulary, text_of) -> np.ndarray:
    """The vocabulary codes of fingerprints; each distinct one named by ``text_of(first row)``."""
    distinct, first, inverse = np.unique(prints, return_index=True, return_inverse=True)
    texts = [text_of(int(row)) for row in first]
    return vocabulary.codes(kind, texts)[inverse.reshape(-1)] if len(texts) else np.zeros(0, np.int32)


def entry_table(entries: list) -> pa.StructArray:
    """One dump's raw entries as an Arrow array of the fields the diagnosis reads. Raises
    ``pa.ArrowInvalid``/``ArrowTypeError`` (or TypeError) when they are not of torch's types."""
    return pa.array(entries, type=_ENTRY)


def from_entry_tables(tables: list[pa.StructArray], ranks: list[int], members: dict[str, list[int]],
                      *, vocabulary: Vocabulary) -> Entries:
    """Several dumps' ``entry_table`` (``ranks[i]`` wrote ``tables[i]``, all listing the same group
    ``members``) as columns. Converting them together pays the dozens of array calls once for
    all of them instead of once per dump: that was half the conversion time."""
    table = tables[0] if len(tables) == 1 else pa.concat_arrays(tables)
    n = len(table)
    rank = np.repeat(np.asarray(ranks, dtype=np.int32), [len(t) for t in tables])
    field = {name: table.field(name) for name in _ENTRY.names}
    group = field["process_group"]
    names = pc.dictionary_encode(pc.fill_null(pc.list_element(group, 0), ""))
    descs = pc.if_else(pc.greater(pc.list_value_length(group), 1), pc.list_element(group, 1), None)
    name_codes = names.indices.to_numpy(zero_copy_only=False)
    present, first = np.unique(name_codes, return_index=True)
    desc_of = dict(zip(present.tolist(), descs.take(pa.array(first)).to_pylist())) if n else {}
    name_text = names.dictionary.to_pylist()
    group_codes = vocabulary.codes("groups", [(name_text[c], desc_of.get(c)) for c in range(len(name_text))])
    profiling = pc.dictionary_encode(field["profiling_name"])
    if profiling.null_count:
        raise ValueError("an entry has no profiling_name")
    profiling_codes = profiling.indices.to_numpy(zero_copy_only=False)
    parsed = [parse_op(name) for name in profiling.dictionary.to_pylist()]
    op_codes = vocabulary.codes("ops", [op for op, _, _ in parsed])
    is_p2p, peer = p2p_peers(parsed, profiling_codes, name_codes, group_text=name_text, members=members)
    uneven = np.array([op in UNEVEN_OPS for op, _, _ in parsed], dtype=bool)[profiling_codes] if n else \
        np.zeros(0, dtype=bool)
    with np.errstate(over="ignore"):
        shape_prints = _nested_fingerprint(field["input_sizes"]) * _MIX + _nested_fingerprint(field["output_sizes"])
        dtype_prints = _list_fingerprint(field["input_dtypes"]) * _MIX + _list_fingerprint(field["output_dtypes"])
    shape_prints[uneven] = 0
    shapes = _codes_with_text(shape_prints, "shapes", vocabulary, lambda row: UNEVEN if uneven[row] else repr(
        (field["input_sizes"][row].as_py(), field["output_sizes"][row].as_py())))
    used = _uneven_dtypes(field, np.flatnonzero(uneven))
    for row, text in used.items():
        dtype_prints[row] = np.uint64(hash(text) % 2**64)
    dtypes = _codes_with_text(dtype_prints, "dtypes", vocabulary, lambda row: used.get(row) or repr(
        (field["input_dtypes"][row].as_py(), field["output_dtypes"][row].as_py())))
    states = pc.dictionary_encode(field["state"])
    state_map = np.array([_STATES.get(s, 0) for s in states.dictionary.to_pylist()] or [0], dtype=np.int8)
    state = state_map[pc.fill_null(states.indices, 0).to_numpy(zero_copy_only=False)] if n else \
        np.zeros(0, np.int8)
    created, completed = _ints(field["time_created_ns"]), _ints(field["time_discovered_completed_ns"])
    return Entries(
        rank=rank, group=group_codes[name_codes] if n else np.zeros(0, np.int32),
        seq=_ints(field["collective_seq_id"]), p2p_seq=_ints(field["p2p_seq_id"]), is_p2p=is_p2p,
        op=op_codes[profiling_codes] if n else np.zeros(0, np.int32), peer=peer, shape=shapes, dtype=dtypes,
        state=folded_state(state, _ints(field["time_discovered_started_ns"]), completed),
        created=created, waited=waited_us(created, completed), record=_ints(field["record_id"]),
        vocabulary=vocabulary)
