"""Live hang detection (``flows.hang_watch.detect``) on heartbeats and FR entries written by hand."""

import json

import duckdb
import pytest

from rankstream.flows.hang_watch import detect
from rankstream.schemas.tables import ddl

S = 10**9
NOW = 1_800_000_000 * S


def database(progress, ops, beat_every_s=1, beats=10, final=False):
    """Four-ish ranks heartbeating for ``beats`` seconds up to NOW; ``progress[rank] = (enqueued,
    completed)`` of group 0 throughout, ``ops[rank]`` the op of the rank's entry at its enqueued seq."""
    con = duckdb.connect()
    con.execute(ddl())
    for rank, (enqueued, completed) in progress.items():
        status = json.dumps({"0": {"last_enqueued": enqueued, "last_started": -1, "last_completed": completed}})
        for beat in range(beats):
            con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final, collectives) "
                        "VALUES ('r', ?, 's', ?, ?, ?)",
                        [rank, NOW - (beats - 1 - beat) * beat_every_s * S, final and beat == beats - 1, status])
        if rank in ops:
            con.execute("INSERT INTO fr_entries (run_id, rank, record_id, pg_name, pg_desc, collective_seq_id, "
                        "profiling_name, time_created_ns, state) VALUES ('r', ?, ?, '0', 'default_pg', ?, ?, ?, "
                        "'scheduled')", [rank, enqueued, enqueued, f"gloo:{ops[rank]}", NOW - 9 * S])
    return con


def kinds(findings):
    return [(f.kind, f.pg_name, f.seq, f.op, f.culprit_ranks, f.waiting_ranks) for f in findings]


def test_a_rank_behind_the_head_is_the_culprit_of_a_hang():
    con = database({0: (13, 12), 1: (13, 12), 2: (12, 12), 3: (13, 12)},
                   {0: "all_reduce", 1: "all_reduce", 2: "all_reduce", 3: "all_reduce"})
    [finding] = detect(con, now_ns=NOW)
    assert kinds([finding]) == [("hang", "0", 13, "all_reduce", [2], [0, 1, 3])]
    assert finding.detail["2"]["last_enqueued"] == 12 and finding.since_ns == NOW - 9 * S


def test_a_rank_that_issued_another_op_at_the_head_is_the_culprit_of_a_mismatch():
    """A rank that skipped the all-reduce is at the same sequence number, in its next op."""
    con = database({r: (13, 12) for r in range(4)}, {0: "all_reduce", 1: "all_reduce", 2: "broadcast", 3: "all_reduce"})
    [finding] = detect(con, now_ns=NOW)
    assert kinds([finding]) == [("mismatched_collective", "0", 13, "all_reduce", [2], [0, 1, 3])]
    assert finding.detail["2"]["op"] == "broadcast"


def test_a_tie_between_two_ops_names_no_culprit():
    con = database({0: (5, 4), 1: (5, 4)}, {0: "all_reduce", 1: "broadcast"})
    assert kinds(detect(con, now_ns=NOW)) == [("mismatched_collective", "0", 5, None, [], [0, 1])]


def test_every_member_in_the_same_op_that_never_completes_is_a_stuck_collective():
    con = database({r: (13, 12) for r in range(4)}, {r: "all_reduce" for r in range(4)})
    assert kinds(detect(con, now_ns=NOW)) == [("stuck_collective", "0", 13, "all_reduce", [], [0, 1, 2, 3])]


@pytest.mark.parametrize("stall_s", [5.0, 20.0])
def test_a_group_idle_after_its_last_collective_or_not_stalled_long_enough_is_not_hung(stall_s):
    done = database({r: (13, 13) for r in range(4)}, {r: "all_reduce" for r in range(4)})
    assert detect(done, now_ns=NOW, stall_s=stall_s) == []
    stuck = database({r: (13, 12) for r in range(4)}, {r: "all_reduce" for r in range(4)})
    assert len(detect(stuck, now_ns=NOW, stall_s=stall_s)) == (1 if stall_s < 9 else 0)


def test_a_finished_run_is_not_watched():
    con = database({r: (13, 12) for r in range(4)}, {r: "all_reduce" for r in range(4)}, final=True)
    assert detect(con, now_ns=NOW) == []
