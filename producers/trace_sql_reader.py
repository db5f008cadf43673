"""DuckDB's JSON reader as a fast path for plain trace arrays, for ``rankstream merge``.

The importer's reader (``trace_reader`` with ``trace_columns``) parses every event into a Python
dict and then builds columns: about 1.6 s per 36 MB file here, and as long again to insert the rows.
The commonest input of ``rankstream merge``, Composer's per-rank traces, is a plain JSON array of
events with the usual field types, and for such a file DuckDB's C++ reader inserts the same
``trace_events`` rows in about 0.4 s. It takes a file only when it gives exactly the importer's
rows (args are the same JSON, spelled by DuckDB: ``1e100`` where Python writes ``1e+100``; args
nested deeper than Python's recursion limit, which the importer refuses, it reads). Anything else
it declines, inserting nothing, and the caller reads the file with the importer's reader, which
also names the problem of a bad file. Declined:

* gzip files, JSON objects (Kineto's ``{"traceEvents": ...}``, whose metadata the importer reads),
  arrays never closed, files with no rank in their name and none given;
* a ``null`` token anywhere: DuckDB reads a null like a missing key, the importer does not (a
  missing name is ``""``, a null one ``"None"``);
* an event whose phase is not a Chrome phase (so also ``{}`` padding), whose ts or dur is not a
  number or is out of the int64 range in ns, whose dur is negative, whose pid or tid is not an
  integer, whose name or cat is not a string, whose args are neither an object nor an array, or a
  flow event whose id is not an integer;
* any ``ProfilerStep#`` event: giving events their steps is left to the importer.

Each declined check raises inside the INSERT, so the statement's rows are rolled back together.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from rankstream.producers.import_trace import CHROME_PHASES, TraceFile, rank_in_name
from rankstream.producers.trace_reader import EDGE_BYTES, read_metadata

__all__ = ["insert_array_trace"]

_NULL_TOKEN = re.compile(rb"[\[:,]\s*null\b")


def _ns(column: str) -> str:
    """Microseconds to ns as the importer computes them: integers exactly, floats truncated."""
    return (f"CASE {column}_type WHEN 'DOUBLE' THEN trunc({column}::DOUBLE * 1000)::BIGINT "
            f"ELSE {column}::BIGINT * 1000 END")


_PHASES = "".join(sorted(CHROME_PHASES))
_INTEGER = "'-?[0-9]+'"

#: One file's events into ``trace_events``. A value the importer would treat differently raises
#: (``error``), which rolls the whole statement back. The checks look at the JSON text DuckDB keeps
#: for each value (a string starts with a quote, an integer is digits), which is cheaper than
#: asking ``json_type`` for each.
_INSERT_SQL = f"""
INSERT INTO trace_events BY NAME
WITH raw AS (
    SELECT *, json_type(ts) AS ts_type, json_type(dur) AS dur_type,
           CASE WHEN json_type(args, '$.correlation') IS NOT NULL THEN args->'$.correlation'
                ELSE args->'$."External id"' END AS correlation
    FROM read_json($path, format = 'array', columns = {{name: 'JSON', cat: 'JSON', ph: 'VARCHAR', ts: 'JSON',
                   dur: 'JSON', pid: 'JSON', tid: 'JSON', id: 'JSON', args: 'JSON'}})
)
SELECT $run AS run_id, $rank AS rank, coalesce(name->>'$', '') AS name, coalesce(cat->>'$', '') AS cat,
       CASE WHEN length(coalesce(ph, '')) <> 1 OR NOT contains('{_PHASES}', ph)
                 OR left(name, 1) <> '"' OR left(cat, 1) <> '"' OR starts_with(name, '"ProfilerStep#')
                 OR ts_type NOT IN ('BIGINT', 'UBIGINT', 'DOUBLE') OR dur_type NOT IN ('BIGINT', 'UBIGINT', 'DOUBLE')
                 OR left(dur, 1) = '-' OR NOT regexp_full_match(pid, {_INTEGER}) OR NOT regexp_full_match(tid, {_INTEGER})
                 OR left(args, 1) NOT IN ('{{', '[') OR (ph IN ('s', 't', 'f') AND NOT regexp_full_match(id, {_INTEGER}))
            THEN error('declined') ELSE ph END AS ph,
       coalesce({_ns('ts')}, 0) AS ts_ns, coalesce({_ns('dur')}, 0) AS dur_ns,
       coalesce(pid::BIGINT, 0) AS pid, coalesce(tid::BIGINT, 0) AS tid,
       CASE WHEN ph IN ('s', 't', 'f') THEN id::BIGINT END AS flow_id,
       CASE json_type(correlation) WHEN 'BOOLEAN' THEN correlation::BOOLEAN::BIGINT
            WHEN 'BIGINT' THEN correlation::BIGINT WHEN 'UBIGINT' THEN correlation::BIGINT END AS correlation_id,
       CASE WHEN args::VARCHAR NOT IN ('{{}}', '[]') THEN args::VARCHAR END AS args
FROM raw
"""


def _plain_array(path: Path) -> bool:
    """A terminated JSON array with no null token and none of Kineto's top-level metadata."""
    if path.name.endswith(".gz"):
        return False
    try:
        with open(path, "rb") as handle:
            head = handle.read(EDGE_BYTES)
            handle.seek(max(0, path.stat().st_size - EDGE_BYTES))
            tail = handle.read(EDGE_BYTES)
            if not (head.lstrip()[:1] == b"[" and tail.rstrip()[-1:] == b"]"):
                return False
            handle.seek(0)
            if _may_hold_null_token(handle):
                return False
    except OSError:  # unreadable: the importer's reader will say why
        return False
    return read_metadata(head, tail) == (0, None)


#: Bytes read at a time when looking for null tokens.
_SCAN_BYTES = 8 << 20
#: Past this many bytes carried from one block to the next, a file is left to the importer's reader.
_MAX_CARRY = 1 << 20
#: What may stand between a null token's delimiter and a block's end: blanks and part of "null".
_TOKEN_TAIL = frozenset(b" \t\r\nnul")


def _may_hold_null_token(handle) -> bool:
    """Whether the file may hold a JSON ``null`` token, read a block at a time. Mapping the file
    instead made its pages count in the process's memory, nearly doubling the peak when two large
    files are read at once. A block carries its end over to the next from the last byte that
    could begin a token cut in two (a delimiter followed only by blanks and part of ``null``)."""
    carry = b""
    while block := handle.read(_SCAN_BYTES):
        text = carry + block
        if b"null" in text and _NULL_TOKEN.search(text):
            return True
        start = len(text)
        while start and text[start - 1] in _TOKEN_TAIL:
            start -= 1
        if len(text) - start > _MAX_CARRY:  # a megabyte of blanks: not worth the fast path
            return True
        carry = text[max(0, start - 1):]
    return False


def insert_array_trace(connection: duckdb.DuckDBPyConnection, path: Path, run_id: str,
                       *, rank: int | None = None) -> TraceFile | None:
    """Insert ``path``'s events as ``run_id``'s rows for ``rank`` (else the rank in the file name)
    and say what was read; None, with nothing inserted, for a file the importer must read."""
    rank = rank if rank is not None else rank_in_name(path)
    if rank is None or not _plain_array(path):
        return None
    try:
        connection.execute("BEGIN")
        events = connection.execute(_INSERT_SQL, {"path": str(path), "run": run_id, "rank": rank}).fetchone()[0]
        if not events:
            raise duckdb.InvalidInputException("no events")
        connection.execute("COMMIT")
    except duckdb.Error:
        connection.execute("ROLLBACK")
        return None
    return TraceFile(path=path, events=events, rank=rank, pids=set())
