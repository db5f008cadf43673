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

from rankstream.flows.clocks import rank_offsets
from rankstream.flows.diagnosis.entries import UNEVEN, UNEVEN_OPS, Entries, Vocabulary, p2p_peers, parse_op, waited_us
from rankstream.flows.diagnosis.ring_progress import RingProgress, ring_progress

__all__ = ["StoredRun", "load_stored", "live_horizon", "ENTRIES_SQL"]

_PAIR_KEY_SQL = "coalesce(dtypes_key, hash(input_dtypes, output_dtypes))"
#: ``entries.dtypes_used`` in SQL: an uneven op's dtype key is the distinct dtypes it used.
_USED_SQL = "list_sort(list_distinct(list_concat(coalesce(input_dtypes, []), coalesce(output_dtypes, []))))"
#: Its key; the tag keeps it apart from a pair's key (DuckDB's ``hash(x, [])`` equals ``hash(x)``).
_USED_KEY_SQL = f"hash({_USED_SQL}, 'dtypes used')"

#: The entries judged: the run's last ``$tail`` records per rank (all when NULL), created no later
#: than ``$horizon`` (see ``live_horizon``). An entry sent again with a new state has a row per
#: state; the newest is kept in numpy (``_newest``), five times cheaper than a window here.
_RECENT = f"""
WITH tops AS (SELECT rank, max(record_id) AS top FROM fr_entries WHERE run_id = $run GROUP BY rank),
recent AS (
    SELECT f.rank, f.record_id, f.pg_name, f.pg_desc, f.collective_seq_id, f.p2p_seq_id, f.profiling_name,
           coalesce(f.sizes_key, hash(f.input_sizes, f.output_sizes)) AS shape, {_PAIR_KEY_SQL} AS dtype,
           f.state, f.time_created_ns, f.time_discovered_started_ns, f.time_discovered_completed_ns, f.snapshot_ns
    FROM fr_entries f JOIN tops USING (rank)
    WHERE f.run_id = $run AND ($tail IS NULL OR f.record_id > tops.top - $tail)
      AND ($horizon IS NULL OR coalesce(f.time_created_ns, 0) <= $horizon)
)
"""

ENTRIES_SQL = _RECENT + """
SELECT rank, pg_name, coalesce(pg_desc, '') AS pg_desc, coalesce(collective_seq_id, 0) AS seq,
       coalesce(p2p_seq_id, 0) AS p2p_seq, profiling_name, shape, dtype,
       CASE WHEN state = 'completed' OR time_discovered_completed_ns > 0 THEN 2
            WHEN state = 'started' OR time_discovered_started_ns > 0 THEN 1 ELSE 0 END::TINYINT AS state,
       coalesce(time_created_ns, 0) AS created, coalesce(time_discovered_completed_ns, 0) AS completed, record_id,
       snapshot_ns
FROM recent
"""

#: The ``dtypes_used`` keys of the entries of uneven ops (few: gathers, scatters, all_to_alls),
#: found by their profiling names, from the oldest record judged on; an entry's dtypes are the same
#: in each of its states.
USED_DTYPES_SQL = f"""
SELECT rank, record_id, any_value({_USED_KEY_SQL}) AS dtype FROM fr_entries
WHERE run_id = $run AND record_id >= $oldest AND profiling_name IN (SELECT unnest($names))
GROUP BY rank, record_id
"""

#: The text of one sizes or dtypes value, by its key (only the few a finding shows are looked up).
TEXT_SQL = {
    "shapes": "SELECT [input_sizes, output_sizes]::VARCHAR FROM fr_entries WHERE run_id = $run "
              "AND coalesce(sizes_key, hash(input_sizes, output_sizes)) = $key LIMIT 1",
    "dtypes": f"SELECT CASE WHEN {_PAIR_KEY_SQL} = $key THEN [input_dtypes, output_dtypes]::VARCHAR "
              f"ELSE {_USED_SQL}::VARCHAR END FROM fr_entries WHERE run_id = $run "
              f"AND ({_PAIR_KEY_SQL} = $key OR {_USED_KEY_SQL} = $key) LIMIT 1",
}

GROUPS_SQL = """
SELECT pg_name, any_value(ranks) AS ranks FROM process_groups
WHERE run_id = $run AND ranks IS NOT NULL AND len(ranks) > 0 GROUP BY pg_name
"""


class _Key:
    """A sizes or dtypes value known by its key; its text is looked up when a finding shows it."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


class StoredRun:
    """``clock_error_ns``: how far two ranks' creation times may still disagree once on one clock."""

    def __init__(self, entries: Entries, listed: dict[str, list[int]], dumped: list[int],
                 *, clock_error_ns: int = 0) -> None:
        self.entries, self.listed, self.dumped = entries, listed, dumped
        self.clock_error_ns = clock_error_ns


def _newest(table: pa.Table) -> pa.Table:
    """One row per (rank, record): its newest state."""
    if not table.num_rows:
        return table
    rank, record = table["rank"].to_numpy(), table["record_id"].to_numpy()
    order = np.lexsort((table["snapshot_ns"].to_numpy(), record, rank))
    rank, record = rank[order], record[order]
    last = np.r_[(rank[1:] != rank[:-1]) | (record[1:] != record[:-1]), True]
    return table if last.all() and (np.diff(order) > 0).all() else table.take(pa.array(order[last]))


def _with_used_dtypes(database, run_id: str, names: list[str], table: pa.Table, uneven: np.ndarray,
                      keys: np.ndarray) -> np.ndarray:
    """``keys`` with the rows of uneven ops keyed by the dtypes they used (``USED_DTYPES_SQL``)."""
    rows = np.flatnonzero(uneven)
    ranks, records = table["rank"].to_numpy()[rows].tolist(), table["record_id"].to_numpy()[rows].tolist()
    used = database.arrow(USED_DTYPES_SQL, {"run": run_id, "names": names, "oldest": min(records)})
    where = {(rank, record): key for rank, record, key in zip(
        used["rank"].to_pylist(), used["record_id"].to_pylist(), used["dtype"].to_pylist())}
    keys = keys.copy()
    keys[rows] = [where.get(pair, key) for pair, key in zip(zip(ranks, records), keys[rows].tolist())]
    return keys


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    encoded = pc.dictionary_encode(column).combine_chunks()
    return encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary.to_pylist()


def live_horizon(database, run_id: str, dead: set[int], *, progress: RingProgress | None = None) -> int | None:
    """While a run goes on, each rank's ring is known at its own moments: the entries created after
    the earliest of the live ranks' moments are not comparable across ranks yet (see
    ``ring_progress``; ``progress``: already read by the caller). A dead rank's data is as far as it
    will ever go: it sets no horizon."""
    progress = progress or ring_progress(database, run_id)
    known = [t for rank, t in progress.known_until.items() if rank not in dead]
    return min(known) if known else None


def load_stored(database, run_id: str, *, live: bool = False, dead: set[int] = frozenset(),
                tail: int | None = None, progress: RingProgress | None = None) -> StoredRun:
    """The run's entries, the groups its ranks listed and the ranks that sent any. ``live``: only
    the entries every live rank's ring is known to cover (see ``live_horizon``); ``tail``: only
    each rank's last ``tail`` records (the live watch judges what is new; an older fault was judged
    when it was new); ``progress``: the run's ``ring_progress``, when the caller has it."""
    horizon = live_horizon(database, run_id, dead, progress=progress) if live else None
    values = {"run": run_id, "horizon": horizon, "tail": tail}
    table = _newest(database.arrow(ENTRIES_SQL, values))
    listed = {name: sorted(ranks) for name, ranks in database.fetchall(GROUPS_SQL, {"run": run_id})}
    vocabulary = Vocabulary()
    n = table.num_rows
    names, name_text = _codes(table["pg_name"])
    present, first = np.unique(names, return_index=True)
    descs = dict(zip(present.tolist(), table["pg_desc"].take(pa.array(first)).to_pylist())) if n else {}
    group_codes = vocabulary.codes("groups", [(name_text[c], descs.get(c) or None) for c in range(len(name_text))])
    profiling, profiling_text = _codes(table["profiling_name"])
    parsed = [parse_op(name) for name in profiling_text]
    op_codes = vocabulary.codes("ops", [op for op, _, _ in parsed])
    ranks = table["rank"].to_numpy().astype(np.int32)
    is_p2p, peer = p2p_peers(parsed, profiling, names, group_text=name_text, members=listed)
    shape_keys, dtype_keys = table["shape"].to_numpy(), table["dtype"].to_numpy()
    uneven_names = [name for name, (op, _, _) in zip(profiling_text, parsed) if op in UNEVEN_OPS]
    if uneven_names:
        uneven = np.isin(profiling, [i for i, (op, _, _) in enumerate(parsed) if op in UNEVEN_OPS])
        shape_keys = np.where(uneven, 0, shape_keys)  # their sizes differ by design
        dtype_keys = _with_used_dtypes(database, run_id, uneven_names, table, uneven, dtype_keys)
    shapes, shape_index = np.unique(shape_keys, return_inverse=True)
    dtypes, dtype_index = np.unique(dtype_keys, return_inverse=True)
    vocabulary.shapes = [UNEVEN if h == 0 else _Key(int(h)) for h in shapes.tolist()]
    vocabulary.dtypes = [_Key(int(h)) for h in dtypes.tolist()]
    vocabulary.resolver = lambda kind, key: (database.fetchall(TEXT_SQL[kind], {"run": run_id, "key": key.value})
                                             or [[None]])[0][0] or "?"
    offsets, clock_error_ns = rank_offsets(database, run_id)
    created = table["created"].to_numpy().copy()
    waited = waited_us(created, table["completed"].to_numpy())  # each rank's own clock, before any shift
    if offsets and n:
        shift = np.array([offsets.get(int(r), 0) for r in range(int(ranks.max()) + 1)], dtype=np.int64)
        created[created > 0] -= shift[ranks[created > 0]]
    entries = Entries(
        rank=ranks, group=group_codes[names] if n else np.zeros(0, np.int32),
        seq=table["seq"].to_numpy(), p2p_seq=table["p2p_seq"].to_numpy(), is_p2p=is_p2p,
        op=op_codes[profiling] if n else np.zeros(0, np.int32), peer=peer,
        shape=shape_index.reshape(-1).astype(np.int32), dtype=dtype_index.reshape(-1).astype(np.int32),
        state=table["state"].to_numpy(), created=created, waited=waited, record=table["record_id"].to_numpy(),
        vocabulary=vocabulary)
    return StoredRun(entries, listed, np.unique(ranks).tolist(), clock_error_ns=clock_error_ns)
