"""Matching: where the members of a group first disagree about a collective, and who is at fault.

Calls are compared at each sequence number, whatever their state, so a mismatch at the newest
(still running) entry is found too. Only the first disagreement of each group is judged: later
ones are its consequences. The culprits are the ranks that deviate from a strict majority. When
there is none (a tie, as in every two-rank group), evidence decides (``evidence.py``). A culprit's
deviation is then classified: a skipped collective (its calls are the group's shifted by one), an
extra one (shifted the other way), or a type, size or dtype mismatch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


from rankstream.flows.diagnosis.calls import Calls
from rankstream.flows.diagnosis.groups import Group
from rankstream.flows.diagnosis.sequences import GroupSequences

__all__ = ["Disagreement", "first_disagreements", "classify"]

#: How many following calls decide whether a rank is shifted by one (skipped or extra).
_WINDOW = 6


@dataclass
class Disagreement:
    group: Group
    seq: int
    #: rank -> the (op, shape, dtype) value it issued at ``seq``, for the ranks that have an entry.
    values: dict[int, int]
    culprits: list[int] = field(default_factory=list)
    expected: int | None = None
    evidence: list[str] = field(default_factory=list)
    #: Why no culprit could be named (the evidence was symmetric), if so.
    undecided: str | None = None
    kind: str = "type_mismatch"


def first_disagreements(calls: Calls, sequences: dict[int, GroupSequences]) -> list[Disagreement]:
    """The first sequence number of each group at which the members' calls differ."""
    found = []
    for code, seqs in sequences.items():
        seq = seqs.first_disagreement()
        if seq is not None:
            found.append(Disagreement(seqs.group, seq, seqs.values_at(seq)))
    return found


def majority(values: dict[int, int]) -> int | None:
    """The value more than half of the ranks issued, if any."""
    counts = Counter(values.values())
    value, votes = counts.most_common(1)[0]
    return value if votes * 2 > len(values) else None


def classify(d: Disagreement, seqs: GroupSequences, unpack, *, blocked: bool = True) -> None:
    """Set ``d.kind`` from how the culprits' calls compare with the group's (``d.expected``);
    ``unpack`` gives a value's (op, shape, dtype) codes.
    ``blocked``: the group is stuck at ``d.seq`` (a hang), so how far each rank got is evidence."""
    if not d.culprits or d.expected is None:
        d.kind = _kind_of_difference(d, unpack)
        return
    culprit = d.culprits[0]
    own = seqs.calls_of(culprit)
    group = seqs.consensus(exclude=set(d.culprits))
    skipped = extra = aligned = 0
    for i in range(_WINDOW):
        mine, mine_next = own.get(d.seq + i), own.get(d.seq + i + 1)
        theirs, theirs_next = seqs.predicted(group, d.seq + i), seqs.predicted(group, d.seq + i + 1)
        skipped += mine is not None and mine == theirs_next
        extra += mine_next is not None and mine_next == theirs
        aligned += mine_next is not None and mine_next == theirs_next  # the same calls of its, unshifted
    # In a hang, a rank that skipped a call ends one short of its peers, one with an extra call one
    # ahead: that decides when its calls fit a shift no better than no shift (alike calls). In a job
    # that goes on, how far each rank got is only where its latest entries happened to be.
    last = seqs.last_seq()
    peers = sorted(last[r] for r in last if r not in d.culprits)
    lead = last.get(culprit, 0) - peers[len(peers) // 2] if peers and blocked else 0
    if lead < 0 and skipped and skipped >= max(extra, aligned):
        skipped = max(extra, aligned) + 2
    elif lead > 0 and extra and extra >= max(skipped, aligned):
        extra = max(skipped, aligned) + 2
    # One matching call can be chance (a pattern of two ops fits any shift); two are a shift.
    if skipped > max(extra, aligned) and skipped >= 2:
        d.kind = "skipped_collective"
        d.evidence.append(f"rank {culprit}'s calls from #{d.seq} on are the group's shifted by one "
                          f"({skipped} of the next match the group's following call)")
    elif extra > max(skipped, aligned) and extra >= 2:
        d.kind = "extra_collective"
        d.evidence.append(f"rank {culprit}'s calls after #{d.seq} are the group's from #{d.seq} ({extra} match)")
    else:
        d.kind = _kind_of_difference(d, unpack)


def _kind_of_difference(d: Disagreement, unpack) -> str:
    """What differs between the calls, from their (op, shape, dtype) codes."""
    ops, shapes, _ = zip(*(unpack(v) for v in d.values.values()))
    if len(set(ops)) > 1:
        return "type_mismatch"
    if len(set(shapes)) > 1:
        return "size_mismatch"
    return "dtype_mismatch"
