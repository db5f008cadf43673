"""The projector: decoded envelopes to one Arrow table per DuckDB table, per poll.

Trace batches are merged column-wise without touching single events in Python: their dictionary
codes are offset and concatenated, so a poll of a million events becomes a handful of numpy
concatenations and one Arrow dictionary array per string column, which DuckDB loads directly.
The low-volume payloads (FR entries, process groups, metadata, heartbeats) are built row by row.
"""

from __future__ import annotations

import json
from typing import Iterable

import numpy as np
import pyarrow as pa

from rankstream.schemas.envelope import Envelope, PayloadKind
from rankstream.schemas.records import FR_FIELDS, HEARTBEAT_COUNTERS
from rankstream.schemas.tables import FR_ENTRIES, HEARTBEATS, INPUT_REJECTS, PROCESS_GROUPS, RANK_METADATA
from rankstream.schemas.trace import (NULL_INT, TRACE_INT_COLUMNS, TRACE_NULLABLE_COLUMNS, TRACE_STRING_COLUMNS,
                                      TraceBatch)

__all__ = ["project", "trace_table", "MESSAGE_COLUMN"]

#: Every projected row carries the index of its message in the poll, so rows of a message found
#: to be a duplicate at commit time can be filtered out; the column is dropped before insert.
MESSAGE_COLUMN = "_msg"



_SCHEMAS = {table.name: table.arrow_schema() for table in (FR_ENTRIES, PROCESS_GROUPS, HEARTBEATS, RANK_METADATA,
                                                              INPUT_REJECTS)}


def _constant_strings(values: list[str], counts: list[int]) -> pa.DictionaryArray:
    codes = np.repeat(np.arange(len(values), dtype=np.int32), counts)
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(values, pa.string()))


def _trace_table(envelopes: list[tuple[int, Envelope]]) -> pa.Table | None:
    indexed = [(i, e) for i, e in envelopes if e.payload.count]
    if not indexed:
        return None
    table = trace_table([(e.run_id, e.rank, e.payload) for _, e in indexed])
    messages = np.repeat(np.array([i for i, _ in indexed], dtype=np.int32), [e.payload.count for _, e in indexed])
    return table.add_column(0, MESSAGE_COLUMN, pa.array(messages))


def trace_table(parts: list[tuple[str, int, TraceBatch]]) -> pa.Table:
    """``trace_events`` columns for the events of ``(run id, rank, batch)`` parts (non-empty)."""
    batches = [batch for _, _, batch in parts]
    counts = [b.count for b in batches]
    columns: dict[str, pa.Array] = {
        "run_id": _constant_strings([run_id for run_id, _, _ in parts], counts),
        "rank": pa.array(np.repeat(np.array([rank for _, rank, _ in parts], dtype=np.int32), counts)),
    }
    for name in TRACE_STRING_COLUMNS:
        # One join of every batch's codes, then each batch's offset into the merged dictionary
        # added in one pass: per-batch numpy calls cost more than the copying at 1,000 events each.
        dictionary = [value for batch in batches for value in batch.strings[name][0]]
        sizes = [len(batch.strings[name][0]) for batch in batches]
        codes = np.frombuffer(b"".join(batch.strings[name][1] for batch in batches), "<u4").astype(np.int32)
        if len(batches) > 1:
            codes += np.repeat(np.cumsum([0] + sizes[:-1], dtype=np.int32), counts)
        columns[name] = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(dictionary, pa.string()))
    for name in TRACE_INT_COLUMNS:
        values = np.frombuffer(b"".join(batch.ints[name] for batch in batches), "<i8")
        mask = None
        if name in TRACE_NULLABLE_COLUMNS:
            mask = values == NULL_INT
            mask = mask if mask.any() else None
        columns[name] = pa.array(values, type=pa.int64(), mask=mask)
    columns["args"] = _sparse_args_column(batches, counts)
    return pa.table(columns)


def _sparse_args_column(batches: list, counts: list[int]) -> pa.Array:
    """One nullable string per event from the batches' sparse (positions, texts) args."""
    total = sum(counts)
    texts = [text for batch in batches for text in batch.args]
    if not texts:
        return pa.nulls(total, pa.string())
    starts = np.cumsum([0] + counts[:-1])
    positions = np.concatenate([batch.args_positions().astype(np.int64) + start
                                for batch, start in zip(batches, starts)])
    strings = pa.array(texts, pa.string())
    if len(positions) > 1 and not (np.diff(positions) > 0).all():  # never from our codec; kept correct anyway
        take = np.zeros(total, dtype=np.int32)
        take[positions] = np.arange(len(texts), dtype=np.int32)
        missing = np.ones(total, dtype=bool)
        missing[positions] = False
        return strings.take(pa.array(take, mask=missing))
    # In order: the texts' bytes stay where they are, and events without args get empty slots.
    lengths = np.zeros(total, dtype=np.int64)
    lengths[positions] = np.diff(np.frombuffer(strings.buffers()[1], np.int32, len(texts) + 1, strings.offset * 4))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    valid = np.zeros(total, dtype=bool)
    valid[positions] = True
    return pa.StringArray.from_buffers(total, pa.py_buffer(offsets), strings.buffers()[2],
                                       pa.array(valid).buffers()[1], total - len(texts))


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _rows_table(rows: list[dict], schema: pa.Schema) -> pa.Table | None:
    """The rows as Arrow columns of the table's declared types (only the columns the rows fill)."""
    if not rows:
        return None
    types = {MESSAGE_COLUMN: pa.int32(), **{f.name: f.type for f in schema}}
    return pa.table({n: pa.array([r[n] for r in rows], type=types[n]) for n in rows[0]})


def _fr_rows(envelopes: Iterable[tuple[int, Envelope]]) -> list[dict]:
    rows = []
    for i, e in envelopes:
        for entry in e.payload.entries:
            rows.append({MESSAGE_COLUMN: i, "run_id": e.run_id, "rank": e.rank, "snapshot_ns": e.payload.snapshot_ns,
                         **{name: entry[name] for name in FR_FIELDS}})
    return rows


def _group_rows(envelopes: Iterable[tuple[int, Envelope]]) -> list[dict]:
    return [
        {MESSAGE_COLUMN: i, "run_id": e.run_id, "rank": e.rank, "reported_ns": e.sent_at_ns, **group}
        for i, e in envelopes for group in e.payload.groups
    ]


def _heartbeat_rows(envelopes: Iterable[tuple[int, Envelope]]) -> list[dict]:
    rows = []
    for i, e in envelopes:
        fields = e.payload.fields
        rows.append({MESSAGE_COLUMN: i, "run_id": e.run_id, "rank": e.rank, "session_id": e.session_id, "sent_ns": e.sent_at_ns,
                     **{name: fields[name] for name in HEARTBEAT_COUNTERS},
                     "final": fields["final"], "collectives": _json(fields["collectives"]),
                     "collectives_read_ns": fields["collectives_read_ns"]})
    return rows


def _metadata_rows(envelopes: Iterable[tuple[int, Envelope]]) -> list[dict]:
    rows = []
    for i, e in envelopes:
        fields = dict(e.payload.fields)
        fields["metadata"] = _json(fields["metadata"])
        rows.append({MESSAGE_COLUMN: i, "run_id": e.run_id, "rank": e.rank, "world_size": e.world_size,
                     "session_id": e.session_id, "sent_ns": e.sent_at_ns, **fields})
    return rows


def project(envelopes: list[Envelope]) -> dict[str, pa.Table]:
    """Arrow tables keyed by DuckDB table name; tables with no rows are left out."""
    by_kind: dict[PayloadKind, list[tuple[int, Envelope]]] = {kind: [] for kind in PayloadKind}
    for index, envelope in enumerate(envelopes):
        by_kind[envelope.kind].append((index, envelope))
    tables = {
        "trace_events": _trace_table(by_kind[PayloadKind.TRACE_BATCH]),
        "fr_entries": _rows_table(_fr_rows(by_kind[PayloadKind.FR_BATCH]), _SCHEMAS["fr_entries"]),
        "process_groups": _rows_table(_group_rows(by_kind[PayloadKind.PG_CONFIG]), _SCHEMAS["process_groups"]),
        "heartbeats": _rows_table(_heartbeat_rows(by_kind[PayloadKind.HEARTBEAT]), _SCHEMAS["heartbeats"]),
        "rank_metadata": _rows_table(_metadata_rows(by_kind[PayloadKind.RANK_META]), _SCHEMAS["rank_metadata"]),
        "input_rejects": _rows_table([{MESSAGE_COLUMN: i, "run_id": e.run_id, "rank": e.rank, **row}
                                      for i, e in by_kind[PayloadKind.INPUT_REJECTS] for row in e.payload.rows],
                                     _SCHEMAS["input_rejects"]),
    }
    return {name: table for name, table in tables.items() if table is not None}
