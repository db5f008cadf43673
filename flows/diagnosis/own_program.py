"""A rank's own program: what it issued at the same place of its earlier steps.

A step ends with the same collective every time (the optimizer's all_reduce, a barrier, the
step's last call of some group), so the stretches between two calls of such a *marker* are the
rank's periods. When every earlier period issued the same calls and transfers in the same order,
that pattern is the rank's program; the period that holds the place in question (up to the
marker's next call, which a host running ahead may have enqueued already) is the current one.
Two readings follow:

* what the rank should have issued at some place (``call_in_program``): where no majority decides
  between two ranks (a two-rank group), the rank whose call differs from its own prediction,
  against a peer whose call matches its own, is the one that changed its program;
* whether a rank waited for in a call reached it late or went past it (``passed_in_program``):
  before its own call of that number, or by now if it never issued it, it issued something its
  program has only after that place, such as the send and receive that follow a skipped
  tensor-parallel call in a pipeline stage (its later calls of the group are shifted by one). A
  rank that issued as many calls of that kind in the period as its program, only in another
  order, swapped two calls: that is left to the order finding.

Only a regular program predicts: a marker whose periods differ gives no reading, nor does one
whose current period already holds more calls of some kind than the pattern (an eval step or a
short batch between two of its calls: the step at hand is another kind of step).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from rankstream.flows.diagnosis.calls import Calls
from rankstream.flows.diagnosis.entries import Entries

__all__ = ["call_in_program", "passed_in_program", "in_issue_order", "entries_in_order"]


def in_issue_order(calls: Calls, rank: int) -> np.ndarray:
    """The rank's calls, in the order it issued them."""
    rows = np.flatnonzero(calls.rank == rank)
    return rows[np.argsort(calls.record[rows], kind="stable")]


def entries_in_order(entries: Entries, rank: int) -> np.ndarray:
    """The rank's entries, in the order it recorded them."""
    rows = np.flatnonzero(entries.rank == rank)
    return rows[np.argsort(entries.record[rows], kind="stable")]


def _programs(tokens: list[tuple], markers: dict[tuple, list[int]], *, at: int, from_start: bool):
    """Per marker that gives a regular program: (its pattern, start, end), where ``tokens[start:end]``
    is the period that holds position ``at`` (up to the marker's next call, or the end). A token is
    any hashable description of one call or transfer (a call's starts with "call"); ``markers``
    maps a kind to its positions in ``tokens``. Only periods that end before ``at`` make the
    pattern: the rank's host may have enqueued the marker that closes the faulty period already.
    ``from_start``: the rank's ring holds its first entry, so the stretch before a marker's first
    call is a period when no whole one is there."""
    for positions in markers.values():
        before = [p for p in positions if p < at]
        if not before:
            continue
        periods = list(zip(before[:-1], before[1:])) or ([(-1, before[0])] if from_start else [])
        patterns = {tuple(tokens[low + 1:high]) for low, high in periods}
        if len(patterns) != 1:
            continue
        pattern = patterns.pop()
        start, end = before[-1] + 1, next((p for p in positions if p > at), len(tokens))
        usual = Counter(t for t in pattern if t[0] == "call")
        if any(count > usual[token] for token, count in Counter(t for t in tokens[start:end] if t[0] == "call").items()):
            continue  # the current period is another kind of step
        yield pattern, start, end


def call_in_program(calls: Calls, rank: int, *, group: int, seq: int, from_start: bool) -> int | None:
    """The value (``Calls.value``) the rank's program has at the place of its call ``seq`` of
    ``group``, or None when no marker gives one answer."""
    rows = in_issue_order(calls, rank)
    in_group = calls.group[rows] == group
    here = np.flatnonzero(in_group & (calls.seq[rows] == seq))
    if not len(here):
        return None
    here = int(here[0])
    tokens = [("mine", value) if mine else ("call", g, op) for mine, value, g, op in zip(
        in_group[:here].tolist(), calls.value[rows[:here]].tolist(), calls.group[rows[:here]].tolist(),
        calls.op[rows[:here]].tolist())]
    markers: dict[tuple, list[int]] = {}
    for index, token in enumerate(tokens):
        if token[0] == "call":
            markers.setdefault(token, []).append(index)
    answers = set()
    for pattern, start, _ in _programs(tokens, markers, at=here, from_start=from_start):
        current = tokens[start:]
        mine = [token[1] for token in pattern if token[0] == "mine"]
        index = sum(token[0] == "mine" for token in current)
        if index < len(mine):
            answers.add(mine[index])
    return answers.pop() if len(answers) == 1 else None


def passed_in_program(entries: Entries, rank: int, *, group: int, seq: int, waiter: int, from_start: bool) -> bool:
    """Whether the rank, waited for by ``waiter`` in call ``seq`` of ``group``, skipped it by its
    own program: after its call ``seq - 1``, and before its own call ``seq`` if it issued one, it
    issued a call or transfer more often than its program has before its next call of that kind
    (group and op: a first step's init broadcasts are not the step's all_reduces). A rank that
    did issue call ``seq`` must also have issued fewer calls of that kind than its program in
    the whole period, closed by the marker's next call: the same number is a swap of two calls,
    for the order finding. Every marker that gives a reading must agree."""
    waited = _first_row(entries, waiter, group, seq)
    if waited is None:
        return False
    kind = ("call", group, int(entries.op[waited]))
    rows = entries_in_order(entries, rank)
    tokens, seen, last, cut = [], set(), None, None
    for p2p, g, op, number, peer in zip(entries.is_p2p[rows].tolist(), entries.group[rows].tolist(),
                                        entries.op[rows].tolist(), entries.seq[rows].tolist(),
                                        entries.peer[rows].tolist()):
        if p2p:
            tokens.append(("transfer", g, op, peer))
        elif (g, number) not in seen:  # a coalesced call is one call, however many entries
            seen.add((g, number))
            last = len(tokens) if (g, number) == (group, seq - 1) else last
            cut = len(tokens) if (g, number) == (group, seq) else cut
            tokens.append(("call", g, op))
    if last is None or (cut is None and max(number for (g, number) in seen if g == group) != seq - 1):
        return False
    markers: dict[tuple, list[int]] = {}
    for index, token in enumerate(tokens):
        if token[0] == "call" and token[1] != group:
            markers.setdefault(token, []).append(index)
    readings = []
    for pattern, start, end in _programs(tokens, markers, at=last, from_start=from_start):
        current = tokens[start:min(end, cut if cut is not None else end)]
        issued = current.count(kind)
        places = [i for i, token in enumerate(pattern) if token == kind]
        if issued >= len(places):
            continue  # the waited call is not in this period of its program
        allowed = Counter(pattern[:places[issued]])
        went = any(count > allowed[token] for token, count in Counter(current).items())
        if cut is not None:
            went = went and end < len(tokens) and tokens[start:end].count(kind) < len(places)
        readings.append(went)
    return bool(readings) and all(readings)


def _first_row(entries: Entries, rank: int, group: int, seq: int) -> int | None:
    """The rank's first entry of collective ``seq`` of ``group`` (a coalesced call has several)."""
    rows = np.flatnonzero((entries.rank == rank) & (entries.group == group) & (entries.seq == seq) & ~entries.is_p2p)
    return int(rows[np.argmin(entries.record[rows])]) if len(rows) else None
