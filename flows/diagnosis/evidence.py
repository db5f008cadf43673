"""Breaking ties: who is wrong when no majority says so (every two-rank group, and even splits).

Three kinds of evidence, each a vote for one of the values the ranks issued:

* the group's own history: the calls it agreed on before repeat with a period, which predicts the
  call it should have issued here;
* its siblings: the other groups with the same description and size and no member in common (the
  other tensor-parallel pairs), which run the same step and agree among themselves on this
  sequence number;
* the ranks' own programs: a rank whose call differs from what its own earlier steps issued at
  this place, while its peer's matches its own, changed its program (``own_program``);
* the ranks' behaviour elsewhere: a rank that is the odd one out in another group is the likelier
  culprit here too.

A value that gets strictly the most votes is the expected one; otherwise the finding says the
culprit is undetermined between the ranks, and why.
"""

from __future__ import annotations

from collections import Counter

from rankstream.flows.diagnosis.groups import PLACEHOLDER_DESC
from rankstream.flows.diagnosis.matching import Disagreement, majority
from rankstream.flows.diagnosis.sequences import GroupSequences

__all__ = ["decide", "siblings_of"]


def siblings_of(seqs: GroupSequences, sequences: dict[int, GroupSequences]) -> list[GroupSequences]:
    """The groups that play this group's role on other ranks: the same description (a real one:
    torch's placeholder says nothing of the role), the same size and no member in common (two
    groups over the same ranks are two roles, such as two gradient buckets' groups)."""
    group = seqs.group
    if not group.desc or group.desc == PLACEHOLDER_DESC:
        return []
    members = set(group.members)
    return [other for other in sequences.values() if other.group.code != group.code
            and other.group.desc == group.desc and len(other.group.members) == len(group.members)
            and members.isdisjoint(other.group.members)]


def decide(d: Disagreement, seqs: GroupSequences, siblings: list[GroupSequences], *, suspects: set[int],
           describe, own: dict[int, int] | None = None) -> None:
    """Name ``d``'s culprits and expected value: the majority, or else the evidence. ``own``: rank
    -> the value its own earlier steps issued at this place (``own_program.call_in_program``)."""
    expected = majority(d.values)
    if expected is not None:
        d.expected = expected
        d.culprits = sorted(rank for rank, value in d.values.items() if value != expected)
        d.evidence.append(f"{len(d.values) - len(d.culprits)} of {len(d.values)} members issued "
                          f"{_short(describe(expected))}")
        return
    candidates = set(d.values.values())
    votes: Counter = Counter()
    predicted = seqs.predicted_before(d.seq)
    if predicted in candidates:
        votes[predicted] += 2
        d.evidence.append(f"the group's earlier calls repeat with a period that predicts "
                          f"{_short(describe(predicted))} at #{d.seq}")
    sibling_values = Counter(v for v in (majority(s.values_at(d.seq)) for s in siblings if s.values_at(d.seq))
                             if v is not None)
    if sibling_values:
        best, count = sibling_values.most_common(1)[0]
        if best in candidates and count * 2 > sum(sibling_values.values()):
            votes[best] += 2
            d.evidence.append(f"{count} sibling {seqs.group.desc or ''} groups issued {_short(describe(best))} "
                              f"at #{d.seq}")
    own = own or {}
    kept = {value for rank, value in d.values.items() if own.get(rank) == value}
    changed = sorted(rank for rank, value in d.values.items() if own.get(rank, value) != value)
    if len(kept) == 1 and changed:
        (value,) = kept
        votes[value] += 2
        d.evidence.append(f"rank(s) {changed} issued another call here than at this place of their own earlier "
                          f"steps; rank(s) {sorted(r for r, v in d.values.items() if v == value)} issued the same")
    for value in candidates:
        holders = {rank for rank, v in d.values.items() if v == value}
        if holders & suspects:
            for other in candidates - {value}:
                votes[other] += 1
            d.evidence.append(f"rank(s) {sorted(holders & suspects)} also deviate in another group")
    ranked = votes.most_common()
    if ranked and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
        d.expected = ranked[0][0]
        d.culprits = sorted(rank for rank, value in d.values.items() if value != d.expected)
        return
    d.undecided = (f"undetermined between ranks {', '.join(map(str, sorted(d.values)))}: no majority, and "
                   + ("the evidence is split" if ranked else
                      "neither the group's history, sibling groups, the ranks' own steps nor other groups favour one"))


def _short(described: dict) -> str:
    return described["op"]
