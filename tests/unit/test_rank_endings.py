"""A rank that died is named from how its peers said they ended (the stored run after the job).

The Flight Recorder alone shows a rank that died before a call as a rank that skipped it; its
peers' exit records (a signal from the launcher's teardown, an error on the dead rank's closed
connection) are what tell them apart (live probe: a rank that exited at its first call was
reported as a hang, and, when its peer's last entry was lost in the teardown, the peer was named).
"""

from __future__ import annotations

import json
import time

import duckdb
import pytest

from rankstream.consumers.query import Database
from rankstream.consumers.store import apply_schema
from rankstream.flows.diagnosis.report import diagnose_stored
from tests.diagnosis.storing import store_dumps

WORLD = ("0", "default_pg")
PAIR = ("1", "tp")
OTHER_PAIR = ("2", "tp")
GONE = time.time_ns() - 60 * 10**9  # long enough ago that nobody is still running


def _entry(record: int, group: tuple[str, str], seq: int, dtype: str = "Float", op: str = "all_reduce") -> dict:
    return {"record_id": record, "process_group": group, "collective_seq_id": seq, "p2p_seq_id": 0,
            "profiling_name": f"gloo:{op}", "input_sizes": [[8]], "output_sizes": [[8]],
            "input_dtypes": [dtype], "output_dtypes": [dtype], "state": "scheduled",
            "time_created_ns": 0, "time_discovered_started_ns": None, "time_discovered_completed_ns": None}


def _store(calls: dict[int, list[tuple[tuple[str, str], int]]], ends: dict[int, tuple[str, int] | None],
           ended_here_ns: int | None = None, fatal: dict[int, str] | None = None,
           stacks: dict[int, list[dict]] | None = None, raised_in: dict[int, list[dict]] | None = None):
    """A run of ``calls`` (rank -> its (group, seq) calls, in order) whose ranks ended as ``ends``
    says: rank -> ("goodbye", at), ("heartbeat", at), (exit reason, at) or None for a rank that
    said nothing; a rank of the job missing from ``ends`` was never heard from. An exit record is
    followed by a goodbye 0.1 s later, as atexit closes the producer after it."""
    con = duckdb.connect()
    apply_schema(con)
    pg_config = {WORLD[0]: {"name": WORLD[0], "desc": WORLD[1], "ranks": list(range(4))},
                 PAIR[0]: {"name": PAIR[0], "desc": PAIR[1], "ranks": [0, 1]},
                 OTHER_PAIR[0]: {"name": OTHER_PAIR[0], "desc": OTHER_PAIR[1], "ranks": [2, 3]}}
    store_dumps(con, {rank: {"entries": [_entry(i, *call) for i, call in enumerate(rank_calls)],
                             "pg_config": pg_config} for rank, rank_calls in calls.items()})
    for rank, end in ends.items():
        con.execute("INSERT INTO rank_metadata (run_id, rank, world_size, session_id, sent_ns) "
                    "VALUES ('run', ?, 4, 's', ?)", [rank, GONE - 10**11])
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) VALUES ('run', ?, 's', ?, ?)",
                    [rank, GONE - 10**10, False])
        if end is None:
            continue
        how, at = end
        if how in ("goodbye", "heartbeat"):
            con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) "
                        "VALUES ('run', ?, 's', ?, ?)", [rank, at, how == "goodbye"])
        else:
            con.execute("INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, args) "
                        "VALUES ('run', ?, 'process_exit', 'rankstream', 'i', ?, ?)",
                        [rank, at, json.dumps({"reason": how, "frames": (raised_in or {}).get(rank, [])})])
            con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) "
                        "VALUES ('run', ?, 's', ?, true)", [rank, at + 10**8])
    for rank, frames in (stacks or {}).items():  # as the tap publishes a rank's stack while nothing moves
        con.execute("INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, args) "
                    "VALUES ('run', ?, 'idle_outside_collectives', 'rankstream', 'i', ?, ?)",
                    [rank, GONE - 5 * 10**9, json.dumps({"groups": {}, "frames": frames})])
    return diagnose_stored(Database.over(con, "endings"), "run", ended_here_ns=ended_here_ns, fatal=fatal).diagnosis


#: Each step is a pair call (pairs 0-1 and 2-3), then a world call. Rank 1 dies before its pair's
#: first call: rank 0 waits in the pair, ranks 2 and 3 in the world's second call.
STEP = [(WORLD, 1), (OTHER_PAIR, 1), (WORLD, 2)]
AT_FIRST_CALL = {0: [(WORLD, 1), (PAIR, 1)], 1: [(WORLD, 1)], 2: STEP, 3: STEP}
#: The same, with rank 0's entry of the pair lost in the teardown: ranks 0 and 1 look alike.
PEER_ENTRY_LOST = {0: [(WORLD, 1)], 1: [(WORLD, 1)], 2: STEP, 3: STEP}
TORN_DOWN = {0: ("uncaught RuntimeError: Connection closed by peer", GONE), 2: ("signal SIGTERM", GONE),
             3: ("signal SIGTERM", GONE)}


@pytest.mark.parametrize("calls", [AT_FIRST_CALL, PEER_ENTRY_LOST], ids=["at_first_call", "peer_entry_lost"])
def test_a_rank_that_died_without_a_word_while_its_peers_were_torn_down_is_the_crash(calls):
    result = _store(calls, {1: None, **TORN_DOWN})
    assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("crash", "dead_rank", [1])
    assert "ended without a word" in result.root.headline()
    assert "ranks 0, 2, 3 said how they ended" in result.root.evidence[0]
    assert not any("stalled outside collectives" in line for line in result.root.evidence)  # it died


def test_with_every_rank_silent_nobody_is_called_dead():
    """The whole job killed at once: no contrast, so the dumps alone decide (and cannot tell a
    crash from a skip)."""
    result = _store(AT_FIRST_CALL, {0: None, 1: None, 2: None, 3: None})
    assert (result.root.kind, result.root.culprit_ranks) == ("skipped_collective", [1])
    assert result.verdict == "hang"


def test_the_rank_whose_exception_came_first_is_the_crash_and_its_peers_errors_are_not():
    ends = {1: ("uncaught ValueError: bad batch", GONE), 0: ("uncaught RuntimeError: Connection closed by peer",
            GONE + 10**9), 2: ("signal SIGTERM", GONE), 3: ("signal SIGTERM", GONE)}
    result = _store(AT_FIRST_CALL, ends)
    assert (result.verdict, result.root.culprit_ranks) == ("crash", [1])
    assert "ended on uncaught ValueError: bad batch" in result.root.headline()


@pytest.mark.parametrize("timeout", [
    "uncaught RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
    "90000ms for recv operation to complete",
    "uncaught DistBackendError: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=14, "
    "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out"], ids=["gloo", "nccl"])
def test_peers_whose_waits_timed_out_are_no_crash_of_the_rank_that_kept_them_waiting(timeout):
    """Live probe 10 e08: rank 1 skipped the world call and slept; its three peers' waits ended in
    the process group's timeout, within microseconds of each other, and torchrun then signalled
    rank 1. The first timeout is a victim's: the skip stays the root cause."""
    calls = {1: [(WORLD, 1)], 0: [(WORLD, 1), (WORLD, 2)], 2: [(WORLD, 1), (WORLD, 2)], 3: [(WORLD, 1), (WORLD, 2)]}
    ends = {0: (timeout, GONE), 2: (timeout, GONE + 15_000), 3: (timeout, GONE + 9_000_000),
            1: ("signal SIGTERM", GONE + 4 * 10**9)}
    result = _store(calls, ends)
    assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("hang", "skipped_collective", [1])
    assert not any(finding.kind == "dead_rank" for finding in result.findings)


def test_a_real_failure_after_a_peers_timeout_is_still_the_crash():
    """A symptom's timestamp does not make it the cause: rank 1's ValueError is the first failure
    even when a peer's closed connection was recorded a moment earlier (clocks of two nodes)."""
    ends = {0: ("uncaught RuntimeError: Connection reset by peer", GONE), 1: ("uncaught ValueError: bad batch",
            GONE + 10**6), 2: ("signal SIGTERM", GONE + 10**9), 3: ("signal SIGTERM", GONE + 10**9)}
    result = _store(AT_FIRST_CALL, ends)
    assert (result.verdict, result.root.culprit_ranks) == ("crash", [1])
    assert "then rank 0 failed too" in result.root.evidence[0]


def test_a_rank_heard_from_a_moment_ago_may_still_be_running_and_nobody_is_called_dead():
    result = _store(AT_FIRST_CALL, {1: ("heartbeat", time.time_ns() - 10**9), **TORN_DOWN})
    assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("hang", "skipped_collective", [1])


def test_a_death_that_no_call_shows_is_still_the_root_cause():
    """Every rank reached the same calls; rank 3 was killed between them and the others said
    goodbye: nothing in the dumps points at it, its silence does."""
    calls = {rank: [(WORLD, 1), (WORLD, 2)] for rank in range(4)}
    result = _store(calls, {0: ("goodbye", GONE), 1: ("goodbye", GONE), 2: ("goodbye", GONE), 3: None})
    assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("crash", "dead_rank", [3])


@pytest.mark.parametrize("then", ["uncaught RuntimeError: Connection closed by peer", None])
def test_failures_after_a_rank_left_cleanly_are_its_consequences_not_a_crash(then):
    """Rank 1 closed cleanly before its last calls; its peer failed on the closed connection (or
    was aborted by gloo, silently, a heartbeat after): the clean exit came first, so the dumps
    decide."""
    ends = {1: ("goodbye", GONE), 0: (then or "heartbeat", GONE + 10**9), 2: ("signal SIGTERM", GONE + 10**9),
            3: ("signal SIGTERM", GONE + 10**9)}
    result = _store(AT_FIRST_CALL, ends)
    assert (result.root.kind, result.root.culprit_ranks) == ("skipped_collective", [1]), result.root.headline()
    # it did not skip the call and go on: it left the job (probe 12: a rank with a shorter shard)
    assert result.root.headline().startswith("rank 1 left the job early: it ended cleanly instead of issuing "
                                             "all_reduce #1 in group tp (pg 1)"), result.root.headline()
    assert not any("nothing shows where" in line for line in result.root.evidence)
    assert result.root.evidence[0] == "rank 1 closed cleanly (its last heartbeat says goodbye) instead of issuing the call"


def test_a_signal_to_one_rank_first_is_no_crash_of_the_peer_that_failed_on_it():
    """A user's kill of rank 1 (SIGTERM, said), then its peer's error on the closed connection:
    the peer is no culprit, and the dumps decide."""
    ends = {1: ("signal SIGTERM", GONE), 0: ("uncaught RuntimeError: Connection closed by peer", GONE + 10**8),
            2: ("signal SIGTERM", GONE + 10**9), 3: ("signal SIGTERM", GONE + 10**9)}
    result = _store(AT_FIRST_CALL, ends)
    assert result.verdict != "crash" and result.root.culprit_ranks == [1]


def test_a_rank_that_died_before_rankstream_heard_from_it_is_the_crash_even_with_no_entries():
    """Rank 1 exited right after joining; rank 0 blocked in its first call until torchrun's
    SIGTERM, before any entry reached the bus."""
    result = _store({0: [], 2: [], 3: []}, {0: ("signal SIGTERM", GONE), 2: ("signal SIGTERM", GONE),
                                           3: ("signal SIGTERM", GONE)})
    assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("crash", "dead_rank", [1])


def test_a_rank_never_heard_from_in_a_job_that_went_well_is_not_dead():
    """Its capture never started (a node without rankstream); everyone heard from closed cleanly."""
    calls = {rank: [(WORLD, 1), (WORLD, 2)] for rank in range(4)}
    result = _store(calls, {0: ("goodbye", GONE), 1: ("goodbye", GONE), 2: ("goodbye", GONE)})
    assert result.verdict == "healthy"


def test_ranks_that_died_at_once_lead_as_one_finding_naming_them_all():
    """Ranks 1 and 3 die at once, each before a call its peers wait in: one finding each, and the
    root names both (it named the one whose finding came first)."""
    calls = {0: [(WORLD, 1), (PAIR, 1)], 1: [(WORLD, 1)], 2: [(WORLD, 1), (OTHER_PAIR, 1)], 3: [(WORLD, 1)]}
    result = _store(calls, {1: None, 3: None, 0: ("signal SIGTERM", GONE), 2: ("signal SIGTERM", GONE)})
    assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("crash", "dead_rank", [1, 3])
    assert sorted(f.culprit_ranks[0] for f in result.findings[1:] if f.kind == "dead_rank") == [1, 3]


def test_a_job_whose_ranks_all_ended_cleanly_or_on_a_signal_has_no_dead_rank():
    calls = {rank: [(WORLD, 1), (WORLD, 2)] for rank in range(4)}
    result = _store(calls, {0: ("goodbye", GONE), 1: ("signal SIGINT", GONE), 2: ("goodbye", GONE),
                            3: ("signal SIGINT", GONE)})
    assert result.verdict == "healthy"



def test_after_the_job_here_ended_only_this_hosts_gone_processes_are_over():
    """``run`` judges its run when its own job ended; another node's ranks may still be running
    (live probe 10 e02: the head named a second node's live ranks dead). A rank of this host whose
    process is gone is over however recently it was heard from; one of another host heard a moment
    ago is still running, and nobody is named dead while it may be."""
    import os
    import socket
    import subprocess
    import sys

    from rankstream.flows.diagnosis.exits import rank_endings

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    con = duckdb.connect()
    apply_schema(con)
    now = time.time_ns()
    where = {0: (socket.gethostname(), gone.pid), 1: (socket.gethostname(), os.getpid()), 2: ("node-b", 4242)}
    for rank, (host, pid) in where.items():
        con.execute("INSERT INTO rank_metadata (run_id, rank, world_size, session_id, sent_ns, host, pid) "
                    "VALUES ('run', ?, 3, 's', ?, ?, ?)", [rank, now - 10**10, host, pid])
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) VALUES ('run', ?, 's', ?, false)",
                    [rank, now - 10**9])
    database = Database.over(con, "endings")
    hows = {end.rank: end.how for end in rank_endings(database, "run", now_ns=now, job_over=True).ends}
    assert hows == {0: "silent", 1: "running", 2: "running"}
    assert {end.how for end in rank_endings(database, "run", now_ns=now).ends} == {"running"}


@pytest.mark.parametrize("silent_for_s", [1, 30])
def test_a_rank_that_run_ended_itself_is_no_crash_but_one_silent_long_before_is(silent_for_s):
    """``run --on-hang kill``: rank 1 stalled before the pair's call and was killed with the job;
    blocked in a sleep, it left no word, while its peers said they got the signal. It was alive
    when the job was ended (heard from a second before): the hang is the root cause, not its
    death. A rank silent for 30 s before the kill had died before it."""
    kill = GONE + silent_for_s * 10**9
    ends = {1: ("heartbeat", GONE), 0: ("signal SIGTERM", kill + 10**8), 2: ("signal SIGTERM", kill + 10**8),
            3: ("signal SIGTERM", kill + 10**8)}
    result = _store(AT_FIRST_CALL, ends, ended_here_ns=kill)
    if silent_for_s == 1:
        assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("hang", "skipped_collective", [1])
        assert not any(finding.kind == "dead_rank" for finding in result.findings)
    else:
        assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("crash", "dead_rank", [1])
    assert _store(AT_FIRST_CALL, ends).root.kind == "dead_rank"  # without knowing of the kill: a death


def test_a_rank_gloo_aborted_for_a_peer_s_mismatched_data_is_the_mismatch_s_victim_not_the_root():
    """Live probe: rank 3 all-reduced float64 where its peers used float32; gloo aborted rank 2,
    which received it, before any of its entries reached the bus. Rank 2 ended without a word, but
    the ranks that left data show the mismatch at the very call they wait in: that is the cause."""
    first = [(WORLD, 1)]
    calls = {0: first + [(WORLD, 2)], 1: first + [(WORLD, 2)], 3: first + [(WORLD, 2, "Double")]}
    read_error = ("uncaught RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:193", GONE)
    result = _store(calls, {2: None, 0: read_error, 1: read_error, 3: ("signal SIGTERM", GONE + 10**8)})
    assert (result.root.kind, result.root.culprit_ranks) == ("dtype_mismatch", [3])
    dead = next(finding for finding in result.findings if finding.kind == "dead_rank")
    assert dead.culprit_ranks == [2] and "this death follows from that mismatch" in dead.evidence[-1]


def test_a_rank_that_reported_a_fatal_error_ended_on_it_rather_than_without_a_word(tmp_path):
    """A crash in native code leaves no exit record; under ``run`` the rank's faulthandler report
    says what it was and where (probe 12: a SIGSEGV and gloo's abort read "without a word")."""
    from rankstream.flows.diagnosis.loader import fatal_reports

    (tmp_path / "fatal_rank1.txt").write_text(
        "Fatal Python error: Segmentation fault\n\nThread 0x00007f79d047f6c0 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 982 in run\n\n'
        "Current thread 0x00007f79d1213b80 (most recent call first):\n"
        '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
        '  File "/job/train.py", line 14 in main\n  File "/job/train.py", line 30 in <module>')
    (tmp_path / "fatal_rank0.txt").write_text("")  # a rank that did not crash
    fatal = fatal_reports(tmp_path)
    assert fatal == {1: "fatal error: Segmentation fault in __init__.py:519 in string_at, from train.py:14"}
    result = _store(AT_FIRST_CALL, {1: None, **TORN_DOWN}, fatal=fatal)
    assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("crash", "dead_rank", [1])
    assert result.root.headline().startswith(
        "rank 1 ended on fatal error: Segmentation fault in __init__.py:519 in string_at, from train.py:14"), \
        result.root.headline()
    # gloo aborts from a thread of its own: no Python thread is current, and the main one says where
    (tmp_path / "fatal_rank1.txt").write_text(
        "Fatal Python error: Aborted\n\nThread 0x00007f698effd6c0 (most recent call first):\n"
        '  File "/usr/lib/python3.11/selectors.py", line 468 in select\n\n'
        "Thread 0x00007f69ccab4b80 (most recent call first):\n"
        '  File "/venv/torch/distributed/distributed_c10d.py", line 2950 in all_reduce\n'
        '  File "/job/train.py", line 18 in main\n  File "/job/train.py", line 31 in <module>\n\n'
        "Extension modules: numpy (total: 1)\n")
    assert fatal_reports(tmp_path) == {1: "fatal error: Aborted in all_reduce (distributed_c10d.py:2950, from "
                                          "train.py:18)"}
    # a report of a rank that said how it ended changes nothing
    result = _store(AT_FIRST_CALL, {1: None, **TORN_DOWN}, fatal={2: "fatal error: Aborted"})
    assert result.root.culprit_ranks == [1] and "without a word" in result.root.headline()


def test_a_peer_gloo_aborted_for_the_next_call_s_data_of_a_rank_that_skipped_is_its_victim():
    """Rank 0 skipped a call of its pair and went on to the next one, whose data gloo found
    mismatched in rank 1's call: gloo aborted rank 1, whose last entries were lost. The skip
    leads; the death follows from it (probe 12, job34: the victim was named the crash)."""
    dtypes = ["Float", "Double", "Half"]
    pair = [(PAIR, seq, dtypes[(seq - 1) % 3]) for seq in range(1, 31)]
    calls = {0: pair + [(PAIR, 31, dtypes[31 % 3])], 1: pair[:24],
             2: [(OTHER_PAIR, seq) for seq in range(1, 31)], 3: [(OTHER_PAIR, seq) for seq in range(1, 31)]}
    ends = {1: None, 0: ("uncaught RuntimeError: Connection closed by peer", GONE),
            2: ("signal SIGTERM", GONE), 3: ("signal SIGTERM", GONE)}
    result = _store(calls, ends)
    assert (result.root.kind, result.root.culprit_ranks, result.root.seq) == ("skipped_collective", [0], 31), \
        result.root.headline()
    death = next(f for f in result.findings if f.kind == "dead_rank")
    assert death.culprit_ranks == [1] and death.inferred


def _last_barrier(group: tuple[str, str], members: list[int], left: int, steps: int = 40) -> dict:
    """``steps`` all_reduces of ``group``, then a barrier that every member but ``left`` issued."""
    calls = {rank: [(WORLD, seq) for seq in range(1, steps + 1)] for rank in range(4)}
    for rank in members:
        if group != WORLD:
            calls[rank] = calls[rank] + [(group, seq) for seq in range(1, steps + 1)]
        if rank != left:
            calls[rank].append((group, steps + 1, "Float", "barrier"))
    return calls


def test_ranks_waiting_in_a_last_barrier_a_rank_left_before_did_not_issue_an_extra_one():
    """Live probe 14: rank 1 returned from main early and closed cleanly; ranks 0 and 2 then waited
    in a final barrier, and rank 0 was named for "an extra barrier". Three ranks against one: the
    one that left is the odd one."""
    ends = {1: ("goodbye", GONE), 0: ("signal SIGTERM", GONE + 10**9), 2: ("signal SIGTERM", GONE + 10**9),
            3: ("signal SIGTERM", GONE + 10**9)}
    result = _store(_last_barrier(WORLD, [0, 1, 2, 3], left=1), ends)
    assert (result.root.kind, result.root.culprit_ranks, result.root.waiting_ranks) == \
        ("skipped_collective", [1], [0, 2, 3]), [f.headline() for f in result.findings]
    assert result.root.headline().startswith("rank 1 left the job early: it ended cleanly instead of issuing "
                                             "barrier #41 in group default_pg (pg 0)"), result.root.headline()
    assert not any(f.kind == "extra_collective" for f in result.findings), [f.headline() for f in result.findings]


def test_in_a_pair_the_departure_leads_and_the_extra_call_stays_as_the_other_reading():
    ends = {1: ("goodbye", GONE), 0: ("signal SIGTERM", GONE + 10**9), 2: ("goodbye", GONE + 10**9),
            3: ("goodbye", GONE + 10**9)}
    result = _store(_last_barrier(PAIR, [0, 1], left=1), ends)
    kinds = [(f.kind, f.culprit_ranks) for f in result.findings]
    assert kinds[0] == ("skipped_collective", [1]) and ("extra_collective", [0]) in kinds[1:], kinds


def test_a_stored_run_with_coalesced_calls_is_diagnosed():
    """Entries sharing one call number (a coalesced call) joined their shapes as text, but a stored
    run's shapes are keys resolved on demand: the diagnosis failed with a TypeError."""
    calls = {rank: [(WORLD, 1), (WORLD, 1), (WORLD, 2)] for rank in range(4)}
    calls[3] = calls[3][:2]
    result = _store(calls, {rank: ("goodbye", GONE) for rank in range(3)} | {3: ("signal SIGTERM", GONE + 10**9)})
    assert result.root is not None and result.root.culprit_ranks == [3], [f.headline() for f in result.findings]


MONITORED_BARRIER = [{"name": "monitored_barrier", "line": 5435,
                      "filename": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"},
                     {"name": "main", "filename": "/job/save.py", "line": 15}]
FAILED_BARRIER = "uncaught RuntimeError: [Rank 0]: Rank 3 failed to pass monitoredBarrier in 20000 ms"


def test_ranks_that_fail_in_a_call_the_recorder_does_not_show_after_one_left_name_the_one_that_left():
    """Live probe 14: rank 3 returned early and closed; the others failed in gloo's
    ``monitored_barrier`` (sends and receives: no entry), and the job, which exited 1, was "healthy"."""
    calls = {rank: [(WORLD, 1), (WORLD, 2)] for rank in range(4)}
    ends = {3: ("goodbye", GONE), **{rank: (FAILED_BARRIER, GONE + 20 * 10**9) for rank in range(3)}}
    result = _store(calls, ends, stacks={rank: MONITORED_BARRIER for rank in range(3)})
    assert (result.root.kind, result.root.culprit_ranks, result.root.waiting_ranks) == \
        ("skipped_collective", [3], [0, 1, 2])
    assert result.root.headline() == ("rank 3 left the job early: it ended cleanly instead of issuing "
                                      "monitored_barrier; 3 ranks wait for it")


def test_where_the_failed_ranks_raised_names_the_one_that_left_when_no_stack_was_published():
    """The barrier failed at once when rank 3's connection closed, before the tap published any
    stack: the exit records say where each exception was raised."""
    calls = {rank: [(WORLD, 1), (WORLD, 2)] for rank in range(4)}
    ends = {3: ("goodbye", GONE), **{rank: (FAILED_BARRIER, GONE + 10**8) for rank in range(3)}}
    result = _store(calls, ends, raised_in={rank: MONITORED_BARRIER for rank in range(3)})
    assert (result.root.kind, result.root.culprit_ranks) == ("skipped_collective", [3]), result.root.headline()
    assert "rank 0 was in monitored_barrier (distributed_c10d.py:5435, from save.py:15)" in result.root.evidence


def test_ranks_that_failed_with_no_call_to_show_why_are_no_healthy_job():
    """Rank 3 closed first (its share was done), then rank 1 failed on its own: no stack shows the
    failed rank inside a call, so its error leads."""
    calls = {rank: [(WORLD, 1), (WORLD, 2)] for rank in range(4)}
    ends = {3: ("goodbye", GONE), 1: ("uncaught OSError: disk full", GONE + 10**9),
            0: ("signal SIGTERM", GONE + 2 * 10**9), 2: ("signal SIGTERM", GONE + 2 * 10**9)}
    result = _store(calls, ends)
    assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("crash", "dead_rank", [1])
    assert result.root.headline().startswith("rank 1 ended on uncaught OSError: disk full")
