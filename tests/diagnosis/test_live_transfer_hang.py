"""Live, a hang of transfers alone is found from the ranks' stacks once nothing moves: neither a
collective nor a point-to-point call (gloo records neither send nor recv in the Flight Recorder, so
the heartbeats' transfer count is the pipeline's only sign of progress)."""

from __future__ import annotations

import json
import time

import duckdb

from rankstream.consumers.store import apply_schema
from rankstream.flows.hang_watch import watch_pass

SECOND = 10**9
C10D = "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"
PROGRESS = {"0": {"last_enqueued": -1, "last_started": -1, "last_completed": -1}}


def _recv_from(peer: int) -> list[dict]:
    return [{"name": "recv", "filename": C10D, "line": 2799, "args": {"src": peer}},
            {"name": "<module>", "filename": "/job/pipe.py", "line": 40}]


def _pipeline(*, transfers_moving: bool, stacks_age_s: float = 8.0) -> tuple[duckdb.DuckDBPyConnection, int]:
    """Three stages heartbeating for 10 s: stage 0 in its own code, 1 and 2 blocked in ``recv``."""
    con = duckdb.connect()
    apply_schema(con)
    now = time.time_ns()
    for rank in range(3):
        for age in range(10, 0, -1):
            con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final, collectives, transfers) "
                        "VALUES ('pipe', ?, 's', ?, false, ?, ?)",
                        [rank, now - age * SECOND, json.dumps(PROGRESS), 100 + (10 - age if transfers_moving else 0)])
    stacks = {0: [{"name": "<module>", "filename": "/job/pipe.py", "line": 33}], 1: _recv_from(0), 2: _recv_from(1)}
    for rank, frames in stacks.items():
        con.execute("INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, args) "
                    "VALUES ('pipe', ?, 'idle_outside_collectives', 'rankstream', 'i', ?, ?)",
                    [rank, now - int(stacks_age_s * SECOND), json.dumps({"groups": PROGRESS, "frames": frames})])
    return con, now


def test_a_pipeline_whose_transfers_stopped_is_named_live_from_its_stacks():
    con, now = _pipeline(transfers_moving=False)
    judged, found = watch_pass(con, now_ns=now)
    assert judged == {"pipe"}
    [(run, finding)] = found
    assert (run, finding.kind, finding.culprit_ranks, finding.waiting_ranks) == ("pipe", "p2p_unmatched", [0], [1, 2])
    assert finding.headline().startswith("rank 0 never posted its send to rank 1 (stalled at pipe.py:33 in <module>)")


def test_a_pipeline_whose_transfers_move_is_not_judged_a_hang():
    con, now = _pipeline(transfers_moving=True)
    assert watch_pass(con, now_ns=now)[1] == []


def test_stacks_that_still_move_are_no_hang_even_when_nothing_counts_transfers():
    """A job that calls ``send`` by a name imported before the wrapping is not counted: its stacks,
    published again whenever a rank's place changes, still show it moving."""
    con, now = _pipeline(transfers_moving=False, stacks_age_s=1.0)
    assert watch_pass(con, now_ns=now)[1] == []


def test_stages_waiting_on_requests_are_followed_to_the_peers_they_posted_to():
    """isend/irecv and batch_isend_irecv block in a request's ``wait()``, which names no peer: the
    tap publishes what the rank's last such call posted, and the chain is followed through it."""
    con, now = _pipeline(transfers_moving=False)
    waiting = [{"name": "main", "filename": "/job/pipe.py", "line": 19, "waits_on_request": True},
               {"name": "<module>", "filename": "/job/pipe.py", "line": 28}]
    con.execute("DELETE FROM trace_events WHERE rank IN (1, 2)")
    for rank in (1, 2):
        con.execute("INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, args) "
                    "VALUES ('pipe', ?, 'idle_outside_collectives', 'rankstream', 'i', ?, ?)",
                    [rank, now - 8 * SECOND, json.dumps({"groups": PROGRESS, "frames": waiting,
                                                         "posted": [["recv", rank - 1], ["send", rank + 1]]})])
    [(_, finding)] = watch_pass(con, now_ns=now)[1]
    assert (finding.culprit_ranks, finding.waiting_ranks) == ([0], [1, 2])
    assert finding.headline().startswith("rank 0 never posted its send to rank 1 (stalled at pipe.py:33 in <module>)")
