"""A run's stored Flight Recorder entries (live or imported) as the diagnosis's columns.

The newest state of each entry (``fr_entries_latest``) is read with its text fields reduced to
codes in SQL: sizes and dtypes as hashes (their text is fetched once per distinct value), group
and op names as Arrow dictionaries. So a pass over millions of entries moves integers only, and
the same engine judges a directory of dumps and a run in the database.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rankstream.flows.diagnosis.entries import UNEVEN, UNEVEN_OPS, Entries, Vocabulary, parse_op

__all__ = ["StoredRun", "load_stored", "ENTRIES_SQL"]

_UNEVEN_SQL = ", ".join(f"'{op}'" for op in sorted(UNEVEN_OPS))
_OP_SQL = "split_part(split_part(profiling_name, ':', 2), ' ', 1)"

ENTRIES_SQL = f"""
SELECT rank, pg_name, coalesce(pg_desc, '') AS pg_desc, coalesce(collective_seq_id, 0) AS seq,
       coalesce(p2p_seq_id, 0) AS p2p_seq, profiling_name,
       CASE WHEN {_OP_SQL} IN ({_UNEVEN_SQL}) THEN 0 ELSE hash(input_sizes, output_sizes) END AS shape,
       hash(input_dtypes, output_dtypes) AS dtype,
       CASE state WHEN 'completed' THEN 2 WHEN 'started' THEN 1 ELSE 0 END::TINYINT AS state,
       coalesce(time_created_ns, 0) AS created, coalesce(time_discovered_started_ns, 0) AS started,
       coalesce(time_discovered_completed_ns, 0) AS completed, record_id
FROM fr_entries_latest WHERE run_id = $run
  AND ($horizon IS NULL OR coalesce(time_created_ns, 0) <= $horizon)
"""

#: While a run goes on, each rank's ring is read every few seconds, at its own moments: the entries
#: created after the oldest of the live ranks' latest reads are not comparable across ranks yet.
#: (A dead rank's last read is as far as its data will ever go: it sets no horizon.)
HORIZON_SQL = """
SELECT min(last_read) FROM (SELECT max(snapshot_ns) AS last_read FROM fr_entries
                            WHERE run_id = $run AND NOT list_contains($dead, rank) GROUP BY rank)
"""

TEXTS_SQL = """
SELECT hash(input_sizes, output_sizes) AS shape, any_value([input_sizes, output_sizes])::VARCHAR AS shape_text,
       hash(input_dtypes, output_dtypes) AS dtype, any_value([input_dtypes, output_dtypes])::VARCHAR AS dtype_text
FROM fr_entries_latest WHERE run_id = $run GROUP BY ALL
"""

GROUPS_SQL = """
SELECT pg_name, any_value(ranks) AS ranks FROM process_groups
WHERE run_id = $run AND ranks IS NOT NULL AND len(ranks) > 0 GROUP BY pg_name
"""


class StoredRun:
    def __init__(self, entries: Entries, listed: dict[str, list[int]], dumped: list[int]) -> None:
        self.entries, self.listed, self.dumped = entries, listed, dumped


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    encoded = pc.dictionary_encode(column).combine_chunks()
    return encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary.to_pylist()


def load_stored(database, run_id: str, *, live: bool = False, dead: set[int] = frozenset()) -> StoredRun:
    """The run's entries, the groups its ranks listed and the ranks that sent any. ``live``: only
    the entries every live rank's latest ring read covers (see ``HORIZON_SQL``)."""
    horizon = database.fetchall(HORIZON_SQL, {"run": run_id, "dead": sorted(dead)})[0][0] if live else None
    table = database.arrow(ENTRIES_SQL, {"run": run_id, "horizon": horizon})
    listed = {name: sorted(ranks) for name, ranks in database.fetchall(GROUPS_SQL, {"run": run_id})}
    vocabulary = Vocabulary()
    n = table.num_rows
    names, name_text = _codes(table["pg_name"])
    descs = table["pg_desc"].to_pylist() if n else []
    pairs = {}
    for i, code in enumerate(names.tolist()):
        pairs.setdefault(code, descs[i] or None)
    group_codes = vocabulary.codes("groups", [(name_text[c], pairs[c]) for c in range(len(name_text))])
    profiling, profiling_text = _codes(table["profiling_name"])
    parsed = [parse_op(name) for name in profiling_text]
    op_codes = vocabulary.codes("ops", [op for op, _, _ in parsed])
    ranks = table["rank"].to_numpy().astype(np.int32)
    is_p2p = np.array([op in ("send", "recv") for op, _, _ in parsed], dtype=bool)[profiling] if n else \
        np.zeros(0, dtype=bool)
    peer = np.full(n, -1, dtype=np.int32)
    for row in np.flatnonzero(is_p2p).tolist():
        op, src, dst = parsed[profiling[row]]
        members = listed.get(name_text[names[row]]) or []
        local = dst if op == "send" else src
        peer[row] = members[local] if 0 <= local < len(members) else local
    shapes, shape_index = np.unique(table["shape"].to_numpy(), return_inverse=True)
    dtypes, dtype_index = np.unique(table["dtype"].to_numpy(), return_inverse=True)
    texts = database.arrow(TEXTS_SQL, {"run": run_id}).to_pylist() if n else []
    shape_text = {row["shape"]: row["shape_text"] for row in texts} | {0: UNEVEN}
    dtype_text = {row["dtype"]: row["dtype_text"] for row in texts}
    vocabulary.shapes = [shape_text.get(int(h), str(h)) for h in shapes.tolist()]
    vocabulary.dtypes = [dtype_text.get(int(h), str(h)) for h in dtypes.tolist()]
    entries = Entries(
        rank=ranks, group=group_codes[names] if n else np.zeros(0, np.int32),
        seq=table["seq"].to_numpy(), p2p_seq=table["p2p_seq"].to_numpy(), is_p2p=is_p2p,
        op=op_codes[profiling] if n else np.zeros(0, np.int32), peer=peer,
        shape=shape_index.reshape(-1).astype(np.int32), dtype=dtype_index.reshape(-1).astype(np.int32),
        state=table["state"].to_numpy(), created=table["created"].to_numpy(),
        started=table["started"].to_numpy(), completed=table["completed"].to_numpy(),
        record=table["record_id"].to_numpy(), vocabulary=vocabulary)
    return StoredRun(entries, listed, np.unique(ranks).tolist())
