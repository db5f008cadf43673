"""The live watch judges a run only once the entries its ranks' heartbeats announce are stored:
heartbeats and Flight Recorder entries travel on different topics, and a partial view blames the
wrong rank."""

from __future__ import annotations

import json
import time

import duckdb

from rankstream.consumers.store import apply_schema
from rankstream.flows.hang_watch import watch_pass
from tests.diagnosis.fr_scenarios import scenarios
from tests.diagnosis.storing import store_case

CASE = next(c for c in scenarios() if c.name == "w8-tp2-dp4__skipped_collective__older__pickle__present")
CRASH = next(c for c in scenarios() if c.name == "w8-tp2-dp4__missing_dump__inflight__gloo__absent__tp")
SECOND = 10**9


def _claim(con, now: int, rank: int, beyond: int) -> None:
    """Rank ``rank`` progressed 7 s ago to ``beyond`` collectives past what is stored in each group."""
    stored = con.execute("SELECT pg_id::VARCHAR, max(collective_seq_id) FROM fr_entries WHERE run_id = 'run' "
                         "AND rank = ? GROUP BY ALL", [rank]).fetchall()
    con.execute("DELETE FROM heartbeats WHERE rank = ?", [rank])
    status = json.dumps({pg: {"last_enqueued": seq + beyond, "last_completed": seq} for pg, seq in stored})
    for sent in (now - 7 * SECOND, now - SECOND // 2):
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final, collectives) "
                    "VALUES ('run', ?, 's', ?, false, ?)", [rank, sent, status])


def _stored(now: int) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    apply_schema(con)
    store_case(con, CASE, now_ns=now)
    return con


def test_a_run_whose_announced_entries_are_not_stored_yet_is_not_judged():
    now = time.time_ns()
    con = _stored(now)
    _claim(con, now, rank=0, beyond=1)
    judged, found = watch_pass(con, now_ns=now)
    assert judged == set() and found == []


def test_the_same_run_is_judged_once_they_are():
    now = time.time_ns()
    con = _stored(now)
    _claim(con, now, rank=0, beyond=0)
    judged, found = watch_pass(con, now_ns=now)
    assert judged == {"run"}
    assert [f.culprit_ranks for _, f in found][:1] == [list(CASE.expected.culprits)]


def test_a_rank_whose_entries_never_come_holds_the_run_back_only_for_a_while():
    now = time.time_ns()
    con = _stored(now)
    _claim(con, now - 12 * SECOND, rank=0, beyond=1)  # stopped 19 s ago: past 3 x stall_s
    con.execute("UPDATE heartbeats SET sent_ns = ? WHERE rank = 0 AND sent_ns = ?",
                [now - SECOND, now - 12 * SECOND - SECOND // 2])  # still heartbeating
    judged, _ = watch_pass(con, now_ns=now)
    assert judged == {"run"}


def test_a_run_that_ended_cleanly_is_judged_for_disagreements_only():
    now = time.time_ns()
    con = _stored(now)
    con.execute("UPDATE heartbeats SET final = true")
    judged, found = watch_pass(con, now_ns=now)
    assert judged == {"run"} and found == []  # the skipped call is a wait: nobody waits after a clean end


def test_a_run_with_a_rank_whose_tap_has_not_reported_yet_is_not_judged():
    now = time.time_ns()
    con = _stored(now)
    con.execute("DELETE FROM heartbeats WHERE rank = 0")
    for sent in (now - 7 * SECOND, now - SECOND // 2):  # heartbeats, but no progress of any group yet
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) VALUES ('run', 0, 's', ?, false)",
                    [sent])
    judged, found = watch_pass(con, now_ns=now)
    assert judged == set() and found == []


def _moving(con, now: int) -> None:
    """Every rank's groups changed in its last heartbeat (0.5 s ago): the whole run is progressing."""
    for (rank,) in con.execute("SELECT DISTINCT rank FROM heartbeats").fetchall():
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final, collectives) "
                    "VALUES ('run', ?, 's', ?, false, ?)", [rank, now - SECOND // 2, json.dumps({"0": {"last": 2}})])


def test_a_run_that_is_progressing_is_judged_less_often_and_a_stalled_one_every_pass():
    now = time.time_ns()
    con = _stored(now)
    last_judged: dict[str, int] = {}
    assert watch_pass(con, now_ns=now, last_judged=last_judged)[0] == {"run"}  # stalled for a minute
    assert watch_pass(con, now_ns=now + 2 * SECOND, last_judged=last_judged)[0] == {"run"}
    _moving(con, now + 4 * SECOND)
    assert watch_pass(con, now_ns=now + 4 * SECOND, last_judged=last_judged)[0] == set()  # judged 2 s ago
    _moving(con, now + 13 * SECOND)
    assert watch_pass(con, now_ns=now + 13 * SECOND, last_judged=last_judged)[0] == {"run"}  # 10 s since


def _blocked_ranks_dumped_long_ago(con, now: int, *, read_ns: int | None) -> None:
    """Each rank's tap dumped its ring right after its own last call and never again (nothing
    changed since: it is blocked), while its heartbeats, read at ``read_ns``, claim just what is
    stored."""
    for rank, last_created in con.execute("SELECT rank, max(time_created_ns) FROM fr_entries GROUP BY rank").fetchall():
        con.execute("UPDATE fr_entries SET snapshot_ns = ? WHERE rank = ?", [last_created + 1000, rank])
        _claim(con, now, rank=rank, beyond=0)
        con.execute("UPDATE heartbeats SET collectives_read_ns = ? WHERE rank = ?", [read_ns, rank])


def test_a_rank_blocked_since_its_last_dump_is_judged_on_its_peers_later_calls():
    """The first rank to block dumped its ring before its peers made their last calls; its
    heartbeats say nothing changed since. Judged only up to that dump, the peers' last calls are
    left out and they are blamed for them (seen live in a cross-group hang on a loaded machine)."""
    now = time.time_ns()
    con = _stored(now)
    _blocked_ranks_dumped_long_ago(con, now, read_ns=now - SECOND)
    judged, found = watch_pass(con, now_ns=now)
    assert judged == {"run"}
    assert [f.culprit_ranks for _, f in found] == [list(CASE.expected.culprits)]


def test_without_a_read_time_the_horizon_is_the_earliest_dump():
    """Heartbeats of an older producer carry no read time: entries past the earliest live rank's
    last dump are not compared (what that rank did after it is unknown)."""
    now = time.time_ns()
    con = _stored(now)
    _blocked_ranks_dumped_long_ago(con, now, read_ns=None)
    first_dump = con.execute("SELECT min(snapshot_ns) FROM fr_entries").fetchall()[0][0]
    from rankstream.consumers.query import Database
    from rankstream.flows.diagnosis.stored import live_horizon

    assert live_horizon(Database.over(con, "test"), "run", set()) == first_dump


def test_a_dead_rank_is_named_without_waiting_for_its_peers_goodbyes_to_age():
    """A rank killed mid-job stops heartbeating; gloo then fails its peers, whose last heartbeats
    (their goodbyes, with the aborted call now marked completed) come a few seconds later. Those
    ranks have ended: nothing of theirs can still move, so the death is named as soon as it is seen,
    not once their goodbyes are ``stall_s`` old (seen live: the finding came 10-12 s after the kill)."""
    now = time.time_ns()
    con = duckdb.connect()
    apply_schema(con)
    store_case(con, CRASH, now_ns=now)
    (culprit,) = CRASH.expected.culprits
    con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) VALUES ('run', ?, 's', ?, false)",
                [culprit, now - 6 * SECOND])  # its last heartbeat
    for (rank,) in con.execute("SELECT DISTINCT rank FROM fr_entries WHERE rank <> ?", [culprit]).fetchall():
        _claim(con, now, rank=rank, beyond=0)
        goodbye = {pg: {**seqs, "last_completed": seqs["last_enqueued"] + 1} for pg, seqs in json.loads(
            con.execute("SELECT collectives FROM heartbeats WHERE rank = ? LIMIT 1", [rank]).fetchall()[0][0]).items()}
        con.execute("UPDATE heartbeats SET final = true, collectives = ? WHERE rank = ? AND sent_ns = ?",
                    [json.dumps(goodbye), rank, now - SECOND // 2])
    judged, found = watch_pass(con, now_ns=now)
    assert judged == {"run"}
    assert [(f.kind, f.culprit_ranks) for _, f in found][:1] == [("dead_rank", [culprit])]


def test_a_run_whose_ranks_all_fell_silent_at_once_is_no_longer_judged():
    """``run --on-hang kill`` (or a scheduler) ends every rank at once: their final snapshots show
    calls torn down mid-way, and judged with every rank dead, a pass recorded a deadlock of all of
    them after the real finding. No rank outlives the others: there is nothing live to judge."""
    now = time.time_ns()
    con = _stored(now)
    _claim(con, now, rank=0, beyond=0)
    assert watch_pass(con, now_ns=now)[0] == {"run"}
    con.execute("UPDATE heartbeats SET sent_ns = sent_ns - ?", [10 * SECOND])  # nobody heard from for 10 s
    assert watch_pass(con, now_ns=now) == (set(), [])
