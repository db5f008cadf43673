"""What the collective diagnosis reports: one vocabulary of faults, and the finding that carries one.

The same names are used live (the hang watch), offline (``rankstream diagnose``, ``analyze
collectives``), in JSON and in the docs. A finding names its culprits, or says why it cannot
(``culprit_reason``), and the evidence that decided it; the root cause comes first and lists the
symptoms it explains (ranks waiting for it, later mismatches it caused).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "KINDS", "MISMATCH_KINDS", "WAIT_KINDS", "blocks", "ranks_text", "verdict_of"]

#: Every fault the diagnosis can name, most specific first (the order breaks ties between findings).
KINDS = (
    "order_mismatch",       # a rank issued two groups' calls in the reverse of its peers' order: a deadlock
    "deadlock",             # ranks wait for each other in a cycle across groups
    "stuck_in_collective",  # a rank is still in collective #N that every peer completed
    "not_started",          # a rank enqueued #N, but its device never started it while its peers' did
    "stalled_collective",   # every member of a group is inside #N and none completed it; others wait for them
    "skipped_collective",   # a rank never issued collective #N that its peers issued
    "extra_collective",     # a rank issued a collective its peers never issued
    "type_mismatch",        # at #N the ranks issued different collectives
    "size_mismatch",        # same collective, different tensor sizes
    "dtype_mismatch",       # same collective, different dtypes
    "missing_dump",         # a rank left no Flight Recorder dump, and its peers wait for it
    "dead_rank",            # a rank died: live, its heartbeats stopped while its peers' go on; after
                            # the run, it ended without a word while its peers said how they ended
    "p2p_unmatched",        # a send without its receive (or the reverse) between two ranks
    "state_mismatch",       # ranks disagree on whether #N completed
    "straggler",            # a rank arrives last at its collectives, beyond the run's noise
)
MISMATCH_KINDS = frozenset({"extra_collective", "type_mismatch", "size_mismatch", "dtype_mismatch",
                            "state_mismatch"})
WAIT_KINDS = frozenset({"order_mismatch", "deadlock", "stuck_in_collective", "not_started", "stalled_collective",
                        "skipped_collective", "missing_dump", "dead_rank", "p2p_unmatched"})


@dataclass
class Finding:
    kind: str
    #: The ranks at fault; empty only when ``culprit_reason`` says why (a tie the evidence cannot break).
    culprit_ranks: list[int]
    group: str | None = None
    group_desc: str | None = None
    #: collective_seq_id, or p2p_seq_id for p2p_unmatched.
    seq: int | None = None
    #: When the dumps cannot tell which call of a stretch of identical calls it was: the stretch
    #: ``(first, last)``; ``seq`` is its first call.
    seq_range: tuple[int, int] | None = None
    #: What the group did at ``seq`` and what the culprits did (op, sizes, dtypes, state).
    expected: Any = None
    actual: Any = None
    #: Ranks blocked because of this finding (waiting in a collective that cannot complete).
    waiting_ranks: list[int] = field(default_factory=list)
    #: One line each: what decided the culprit.
    evidence: list[str] = field(default_factory=list)
    #: Summaries of the findings this one explains (consequences), root cause first only.
    explains: list[str] = field(default_factory=list)
    culprit_reason: str | None = None
    #: The culprit's Python stack at that entry, innermost first, where the Flight Recorder kept one.
    stack: list[dict] = field(default_factory=list)
    #: Whether the collective never completed (the hang point), as opposed to an older entry.
    in_flight: bool = False
    #: Named only because others wait for it, with nothing in its own entries to show the fault;
    #: a finding with direct evidence is preferred as the root cause.
    inferred: bool = False
    #: The group's members, which name it in the headline when torch describes it with nothing.
    group_ranks: list[int] | None = None

    @property
    def known_death(self) -> bool:
        """A rank seen to die (not a death inferred to follow from another finding): it leads."""
        return self.kind == "dead_rank" and not self.inferred

    def headline(self) -> str:
        """One line: who did what where, and who it blocks."""
        where = "" if self.group is None else (("in the group of " if self.group_ranks else "in group ")
                                                + describe_group(self.group, self.group_desc, self.group_ranks))
        if not self.culprit_ranks and self.kind in _DISAGREE_ON and isinstance(self.actual, dict):
            ops = sorted({value.get("op", "?") for value in self.actual.values() if isinstance(value, dict)})
            what = f"disagree on {_DISAGREE_ON[self.kind]} of #{self.seq} ({' / '.join(ops)})"
            reason = f"; culprit {self.culprit_reason}" if self.culprit_reason else ""
            return " ".join((ranks_text(list(self.actual)), what, where)) + reason
        what = _WHAT[self.kind](self)
        who = ranks_text(self.culprit_ranks) if self.culprit_ranks else self.culprit_reason or "no culprit"
        waiting = len(self.waiting_ranks)
        tail = f"; {waiting} " + ("rank waits" if waiting == 1 else "ranks wait") + " for it" if waiting else ""
        return " ".join(part for part in (who, what, where) if part) + tail

    def as_json(self) -> dict:
        return {"kind": self.kind, "culprit_ranks": self.culprit_ranks, "group": self.group,
                "group_desc": self.group_desc, "seq": self.seq, "seq_range": self.seq_range, "expected": self.expected, "actual": self.actual,
                "waiting_ranks": self.waiting_ranks, "in_flight": self.in_flight, "evidence": self.evidence,
                "explains": self.explains, "culprit_reason": self.culprit_reason, "stack": self.stack,
                "inferred": self.inferred, "group_ranks": self.group_ranks,
                "headline": self.headline()}


def ranks_text(ranks: list) -> str:
    """``rank 3`` or ``ranks 0, 1, 3``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


#: The description torch gives a group created without one: it names no role.
PLACEHOLDER_DESC = "undefined"


def describe_group(name: str | None, desc: str | None, ranks: list[int] | None = None) -> str:
    """``tp (pg 3)``; a group torch describes with nothing, by its members when given:
    ``ranks 0, 1 (pg 2)``; else ``pg 3``."""
    if desc and desc not in (name, PLACEHOLDER_DESC):
        return f"{desc} (pg {name})"
    return f"{ranks_text(ranks)} (pg {name})" if ranks else f"pg {name}"


def _op(value: Any) -> str:
    return value.get("op", "?") if isinstance(value, dict) else str(value)


def _numbered(finding: Finding, value: Any) -> str:
    return f"{_op(value)} #{finding.seq}" if finding.seq is not None else _op(value)


def _roots(finding: Finding) -> str:
    """``, naming different roots (rank 0: 0, rank 2: 1)``, when their stacks say so."""
    roots = finding.actual.get("roots") if isinstance(finding.actual, dict) else None
    if roots:
        return ", naming different roots (" + ", ".join(f"rank {rank}: {root}" for rank, root in roots.items()) + ")"
    return ""


def _transfer(value: dict) -> str:
    """``send to rank 3``, ``recv from rank 1``."""
    return f"{_op(value)} {'to' if value.get('op') == 'send' else 'from'} rank {value.get('peer')}"


def _skipped(f: Finding) -> str:
    """A rank absent from a call: where it stalled, blocked or went, when known."""
    actual, call = f.actual if isinstance(f.actual, dict) else {}, _numbered(f, f.expected)
    if actual.get("stalled_at"):
        return f"never reached {call} (stalled at {actual['stalled_at']})"
    if actual.get("blocked_in"):
        return f"is blocked in {actual['blocked_in']} instead of {call}, waiting for a peer"
    if actual.get("left"):
        return f"left the job early: it ended cleanly instead of issuing {call}"
    return f"skipped {call}"


def _unmatched(f: Finding) -> str:
    """A transfer without its counterpart: numbered (NCCL's entries), or read from stacks (gloo)."""
    actual = f.actual if isinstance(f.actual, dict) else {}
    if f.seq is not None:
        return f"never posted its side of {_op(f.expected)} (p2p #{f.seq})"
    if "receives_from" in actual:
        return f"sent to rank {actual['peer']}, which receives from rank {actual['receives_from']}"
    if "stalled_at" in actual:
        return f"never posted its {_transfer(f.expected)} (stalled at {actual['stalled_at']})"
    return f"never posted its {_transfer(f.expected)}"


def _call(finding: Finding) -> str:
    """A call as words: ``all_reduce #7``, or ``send to rank 3 (p2p #4)``."""
    value = finding.actual
    if isinstance(value, dict) and "peer" in value:
        return f"{_transfer(value)} (p2p #{finding.seq})"
    return _numbered(finding, value)


#: What the ranks of a mismatch without a culprit disagree on.
_DISAGREE_ON = {"type_mismatch": "the collective", "size_mismatch": "the tensor sizes",
                "dtype_mismatch": "the dtypes"}

#: Whose order an order_mismatch reverses, unless the finding says (``expected["order_of"]``).
_PEERS = "its peers'"

_WHAT = {
    "deadlock": lambda f: "wait for each other (deadlock)",
    "order_mismatch": lambda f: f"issued {f.actual['call']} before {_numbered(f, f.expected)}, the reverse of "
                                f"{f.expected.get('order_of', _PEERS)} order (deadlock)",
    "stuck_in_collective": lambda f: (f"are stuck in {_numbered(f, f.actual)}, which their peers completed"
                                      if len(f.culprit_ranks) > 1 else
                                      f"is stuck in {_numbered(f, f.actual)}, which its peers completed")
                                     + _roots(f),
    "not_started": lambda f: f"enqueued {_call(f)} but never started it on the device",
    "stalled_collective": lambda f: f"are all inside {_numbered(f, f.actual)}, which never completes",
    "skipped_collective": lambda f: _skipped(f),
    "extra_collective": lambda f: f"issued an extra {_numbered(f, f.actual)}",
    "type_mismatch": lambda f: f"issued {_op(f.actual)} where its peers issued {_numbered(f, f.expected)}",
    "size_mismatch": lambda f: f"used other tensor sizes in {_numbered(f, f.expected)}",
    "dtype_mismatch": lambda f: f"used another dtype in {_numbered(f, f.expected)}",
    "missing_dump": lambda f: f"left no dump; {'their' if len(f.culprit_ranks) > 1 else 'its'} peers wait in "
                              f"{_numbered(f, f.expected)}",
    "dead_rank": lambda f: (f"ended {f.actual['ended']}" if isinstance(f.actual, dict) and f.actual.get("ended")
                            else "stopped sending heartbeats")
                           + (f"; its peers wait in {_numbered(f, f.expected)}" if f.expected else ""),
    "p2p_unmatched": lambda f: _unmatched(f),
    "state_mismatch": lambda f: f"went on without completing {_numbered(f, f.expected)}, which its peers completed",
    "straggler": lambda f: "arrives last at its collectives",
}


def blocks(finding: Finding) -> bool:
    """Whether the finding holds ranks up: they wait for it, it never completed, or it is a
    deadlock, a dead rank or a stuck collective."""
    return bool(finding.waiting_ranks or finding.in_flight
                or finding.kind in ("order_mismatch", "deadlock", "dead_rank", "stuck_in_collective"))


def verdict_of(findings: list[Finding]) -> str:
    """healthy, crash (a rank died), hang (ranks are blocked), desync (ranks disagree but none is
    blocked) or straggler."""
    if not findings:
        return "healthy"
    root = findings[0]
    if root.kind == "straggler":
        return "straggler"
    if root.kind == "dead_rank":
        return "crash"
    return "hang" if blocks(root) else "desync"
