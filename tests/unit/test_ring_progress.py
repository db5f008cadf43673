"""What the heartbeats claim against what is stored: a rank is "in flight" only when it claims a call
whose entry has not arrived. The claims' numbering is the backend's (checked on torch 2.13: gloo
claims the op_id of its last recorded call, and op_id also counts the send/recv gloo never records)."""

from __future__ import annotations

import json

import duckdb
import pytest

from rankstream.consumers.query import Database
from rankstream.consumers.store import apply_schema
from rankstream.flows.diagnosis.ring_progress import ring_progress

#: A gloo rank's ring: all_reduce, send, recv (not recorded), all_reduce: (collective_seq_id, op_id).
GLOO_CALLS = [(1, 1), (2, 4)]


def _database(backend: str, calls, claimed: int) -> Database:
    con = duckdb.connect()
    apply_schema(con)
    for record_id, (seq, op_id) in enumerate(calls):
        con.execute("INSERT INTO fr_entries (run_id, rank, snapshot_ns, record_id, pg_id, profiling_name, "
                    "collective_seq_id, op_id) VALUES ('run', 0, 100, ?, 0, ?, ?, ?)",
                    [record_id, f"{backend}:all_reduce", seq, op_id])
    status = {"0": {"last_enqueued": claimed, "last_completed": claimed}}
    con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final, collectives, collectives_read_ns) "
                "VALUES ('run', 0, 's', 200, false, ?, 150)", [json.dumps(status)])
    return Database.over(con, "test")


@pytest.mark.parametrize("backend, claimed, in_flight", [
    ("gloo", 4, False),   # the op_id of the last stored call: all stored, though p2p came between
    ("gloo", 5, True),    # a call after it
    ("nccl", 2, False),   # the collective sequence number of the last stored call
    ("nccl", 3, True),
])
def test_a_rank_is_in_flight_only_when_it_claims_a_call_not_stored(backend, claimed, in_flight):
    progress = ring_progress(_database(backend, GLOO_CALLS, claimed), "run")
    assert (0 in progress.in_flight) is in_flight
    assert progress.known_until[0] == (100 if in_flight else 150)  # complete up to the read when all is stored
