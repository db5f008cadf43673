"""How each rank of a run ended, and which ranks died first.

A rank says how it ends: a clean close sends a final heartbeat, and a signal or an uncaught
exception leaves a ``process_exit`` event with its reason. A rank ended outright (SIGKILL, an
abort or a crash in native code, ``os._exit``) says nothing. When its peers said how they ended, a
silent rank is the one that died: launchers tear the others down because a worker failed
(torchrun sends them SIGTERM), and a peer blocked with it fails on its closed connection and says
so. Without that contrast (every rank silent: the whole job was killed at once) nobody is named.

When no rank is silent, a rank whose uncaught exception came first is the one that failed: its
peers' errors ("Connection closed by peer") follow it by at least its own flush. An exception
that only says a wait ended (a collective or the store timed out, a peer closed or reset the
connection) is a symptom, never the first failure: ranks left waiting by a peer that skipped a
call all raise gloo's or NCCL's timeout within microseconds of each other, and the first of them
is a victim. With only symptoms, the dumps decide. When the first
rank to end closed cleanly (it left the job early), the failures after it are its consequences:
nobody is named dead, and the dumps say what it left its peers waiting in. When the first end was
a signal and nobody is silent (a user's ``kill`` of one rank, a scheduler's), the errors of its
peers follow from it too, and the dumps decide. An exception or a signal leaves an exit record,
and atexit then still closes the producer: the record, not the goodbye, says how the rank ended.
A rank of the job never heard from (it died before its capture started) counts as silent when
the others did not all close cleanly.

The Flight Recorder alone cannot tell a crashed rank from one that skipped a call: both leave
their peers waiting in a call they never issued. Before this, a rank that exited at its first
call was reported as a hang, and a tie of two silent-looking ranks could name the victim.
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass, field

from rankstream.flows.diagnosis.findings import ranks_text
from rankstream.schemas.processes import process_alive

__all__ = ["RankEnd", "Endings", "rank_endings", "SILENT", "only_a_wait_ended"]

#: How a rank that left no word of its end is described.
SILENT = "without a word (killed, aborted in native code or exited at once)"

#: How long after its last heartbeat a rank that said nothing is taken to be gone (heartbeats come
#: about once a second).
QUIET_S = 5.0

#: What an exception says when it only reports that a wait ended: gloo's "Timed out waiting
#: 90000ms for recv operation", NCCL's watchdog "collective operation timeout", the store's
#: "Socket Timeout", "Connection closed by peer", "Connection reset by peer".
_WAIT_ENDED = re.compile(r"timed out|timeout|closed by peer|reset by peer|broken pipe|connection refused",
                         re.IGNORECASE)

#: Each rank of the job (its world size, whether or not it was ever heard from): its clean
#: goodbye, its first exit record and its last heartbeat.
ENDINGS_SQL = """
WITH heard AS (
    SELECT rank, true AS heard, arg_max(host, sent_ns) AS host, arg_max(pid, sent_ns) AS pid
    FROM rank_metadata WHERE run_id = $run GROUP BY rank
), ranks AS (
    SELECT rank, coalesce(heard, false) AS heard, host, pid FROM (
        SELECT unnest(range(coalesce(max(world_size), 0))) AS rank FROM rank_metadata WHERE run_id = $run
        UNION SELECT rank FROM heard
    ) LEFT JOIN heard USING (rank)
), beats AS (
    SELECT rank, bool_or(final) AS goodbye, max(sent_ns) AS last_ns FROM heartbeats WHERE run_id = $run GROUP BY rank
), exits AS (
    SELECT rank, arg_min(args, ts_ns) AS args, min(ts_ns) AS exit_ns FROM trace_events
    WHERE run_id = $run AND cat = 'rankstream' AND name = 'process_exit' GROUP BY rank
)
SELECT rank, heard, coalesce(goodbye, false), last_ns, args::VARCHAR, exit_ns, host, pid
FROM ranks LEFT JOIN beats USING (rank) LEFT JOIN exits USING (rank) ORDER BY rank
"""


#: The reason given for a rank that ``run`` ended (``--on-hang kill``, or a signal it passed on).
ENDED_BY_RUN = "the signal rankstream run sent or passed on"


@dataclass(frozen=True)
class RankEnd:
    rank: int
    #: "goodbye", "signal", "exception", "silent", "running" (heard from a moment ago) or "unheard"
    #: (a rank of the job never heard from: it died, or its capture never started).
    how: str
    #: The exit record's reason ("signal SIGTERM", "uncaught ValueError: ..."); None otherwise.
    reason: str | None
    #: When it ended: its exit record, else its last heartbeat (ns, on the rank's own clock: the
    #: ranks of one node share it; across nodes the first failure leads by its own flush).
    at_ns: int | None
    #: Where an uncaught exception was raised (innermost frame first), from its exit record.
    frames: list = field(default_factory=list, compare=False)


@dataclass(frozen=True)
class Endings:
    ends: list[RankEnd]
    #: The ranks that died first, and one line each saying how every rank ended.
    dead: frozenset[int]
    evidence: list[str]

    def described(self, rank: int) -> str:
        """How ``rank`` ended, as words after "ended"."""
        end = next((end for end in self.ends if end.rank == rank), None)
        if end is None or end.how in ("silent", "unheard"):
            return SILENT
        return f"on {end.reason}" if end.reason else "cleanly"


def rank_endings(database, run_id: str, *, now_ns: int, job_over: bool = False,
                 ended_here_ns: int | None = None, fatal: dict[int, str] | None = None) -> Endings:
    """How each rank of ``run_id`` ended, judged at ``now_ns``. A rank heard from within ``QUIET_S``
    may still be running and is not called silent, unless ``job_over`` (the job launched on this
    host ended: ``run`` after its job) and the rank ran on this host in a process that is gone.
    Ranks of other nodes go by ``QUIET_S``: their launch may still be running (probe 10 e02: the
    head named another node's live ranks dead). ``ended_here_ns``: when ``run`` ended the job
    (``--on-hang kill``, or a signal it passed on); a rank that was alive then and ended without a
    word was ended by it. ``fatal``: rank -> the fatal error it reported on its way out (a crash in
    native code, read by ``run`` from the ranks' ``faulthandler`` reports): a rank that left no
    other word ended on it, a failure of its own."""
    here = socket.gethostname()
    recent_ns = now_ns - int(QUIET_S * 1e9)
    ends = [_end(rank, heard, bool(goodbye), last_ns, args, exit_ns,
                 now_ns if job_over and host == here and pid is not None and not process_alive(pid) else recent_ns)
            for rank, heard, goodbye, last_ns, args, exit_ns, host, pid
            in database.fetchall(ENDINGS_SQL, {"run": run_id})]
    if ended_here_ns is not None:
        ends = [_ended_here(end, ended_here_ns) for end in ends]
    if fatal:
        ends = [RankEnd(end.rank, "exception", fatal[end.rank], end.at_ns)
                if end.rank in fatal and (end.how in ("silent", "unheard") or end.reason == ENDED_BY_RUN)
                else end for end in ends]
    return Endings(ends, *_who_died(ends))


#: A rank heard from this long before ``run`` ended the job was alive when it did (heartbeats go
#: every second, and the last may be lost with the process).
ALIVE_WITHIN_S = 5.0


def _ended_here(end: RankEnd, ended_here_ns: int) -> RankEnd:
    """A silent rank that was alive when ``run`` ended the job ended on that signal: a blocked rank
    cannot act on SIGTERM, and the SIGKILL after it leaves no word. Not a death to blame."""
    if end.how == "silent" and end.at_ns is not None and end.at_ns >= ended_here_ns - int(ALIVE_WITHIN_S * 1e9):
        return RankEnd(end.rank, "signal", ENDED_BY_RUN, ended_here_ns)
    return end


def _end(rank: int, heard: bool, goodbye: bool, last_ns: int | None, args: str | None, exit_ns: int | None,
         quiet_since_ns: int) -> RankEnd:
    if exit_ns is not None:  # before the goodbye: after an exception or a signal, atexit still closes
        reason, frames = _reason(args)
        return RankEnd(rank, "exception" if reason.startswith("uncaught") else "signal", reason, exit_ns, frames)
    if goodbye:
        return RankEnd(rank, "goodbye", None, last_ns)
    if not heard:
        return RankEnd(rank, "unheard", None, None)
    if last_ns is not None and last_ns > quiet_since_ns:
        return RankEnd(rank, "running", None, last_ns)
    return RankEnd(rank, "silent", None, last_ns)


def _reason(args: str | None) -> tuple[str, list]:
    """An exit record's reason, and the frames where its exception was raised (if it says)."""
    try:
        record = json.loads(args or "{}")
        reason, frames = record.get("reason"), record.get("frames")
    except (ValueError, AttributeError):  # a malformed record still says the rank ended
        reason, frames = None, None
    frames = frames if isinstance(frames, list) and all(isinstance(f, dict) for f in frames) else []
    return (str(reason) if reason else "an unknown cause"), frames


def _who_died(ends: list[RankEnd]) -> tuple[frozenset[int], list[str]]:
    spoke = [end for end in ends if end.how in ("goodbye", "signal", "exception")]
    failing = any(end.how in ("signal", "exception") for end in spoke)
    # a rank never heard from counts only when the others did not all close cleanly: its capture
    # may simply not have started (a node without rankstream) in a job that went well
    silent = [end.rank for end in ends if end.how == "silent" or (end.how == "unheard" and failing)]
    if not spoke or any(end.how == "running" for end in ends):
        return frozenset(), []
    if _began_with_a_goodbye(ends):
        return frozenset(), []  # a rank left cleanly first: what failed after it followed from it
    if not silent and min(spoke, key=lambda end: end.at_ns or 0).how == "signal":
        return frozenset(), []  # a signal came first (a user's kill, a scheduler): the dumps decide
    if silent:
        others = sorted({end.reason or "a clean close" for end in spoke})
        return frozenset(silent), [f"{ranks_text(silent)} ended {SILENT}, while {ranks_text([e.rank for e in spoke])} "
                                   f"said how they ended ({'; '.join(o[:120] for o in others)})"]
    failed = sorted((end for end in spoke if end.how == "exception"), key=lambda end: end.at_ns or 0)
    causes = [end for end in failed if not only_a_wait_ended(end.reason)]
    if not causes:
        return frozenset(), []  # every exception says only that a wait ended: the dumps say why
    first, rest = causes[0], [end.rank for end in failed if end is not causes[0]]
    return frozenset({first.rank}), [f"rank {first.rank} ended first on {first.reason[:300]}"
                                     + (f"; then {ranks_text(rest)} failed too" if rest else "")]


def only_a_wait_ended(reason: str | None) -> bool:
    """Whether an exit reason says only that a wait ended (a timeout, a peer's closed
    connection): the rank waited for is the cause, not the one that says so."""
    return bool(_WAIT_ENDED.search(reason or ""))


def _began_with_a_goodbye(ends: list[RankEnd]) -> bool:
    """Whether a clean close came before every other end. A silent rank died some time after its
    last heartbeat: up to ``QUIET_S`` later it may still have been alive when the other closed."""
    goodbyes = [end.at_ns for end in ends if end.how == "goodbye" and end.at_ns is not None]
    others = [(end.at_ns or 0) + (int(QUIET_S * 1e9) if end.how == "silent" else 0)
              for end in ends if end.how not in ("goodbye", "unheard")]
    return bool(goodbyes) and min(goodbyes) <= min(others, default=min(goodbyes))
