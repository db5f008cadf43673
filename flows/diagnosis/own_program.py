"""A rank's own program: what it issued at the same place of its earlier steps.

A step ends with the same collective every time (the optimizer's all_reduce, a barrier, the
step's last call of some group), so the stretches between two calls of such a *marker* are the
rank's periods. When every earlier period issued the same calls of a group, in the same order,
the call at some index of the current period is predicted by the call at that index of the
earlier ones. Where no majority decides between two ranks (a two-rank group), the rank whose
call differs from its own prediction, against a peer whose call matches its own, is the one that
changed: it skipped a call, or issued one of another size, and the calls after it shifted.

Only a regular program predicts: when the periods of some marker differ (an eval step, a short
last batch, init calls in the first step), no prediction is made, since the step at hand may be
another kind of step too.
"""

from __future__ import annotations

import numpy as np

from rankstream.flows.diagnosis.calls import Calls

__all__ = ["call_in_program", "in_issue_order"]


def in_issue_order(calls: Calls, rank: int) -> np.ndarray:
    """The rank's calls, in the order it issued them."""
    rows = np.flatnonzero(calls.rank == rank)
    return rows[np.argsort(calls.record[rows], kind="stable")]


def call_in_program(calls: Calls, rank: int, *, group: int, seq: int, from_start: bool) -> int | None:
    """The value (``Calls.value``) the rank's earlier periods issued at the place of its call
    ``seq`` of ``group``, or None when no marker gives one answer. ``from_start``: the rank's ring
    holds its first entry, so the stretch before its first marker counts as a period when no
    whole period is there."""
    rows = in_issue_order(calls, rank)
    in_group = calls.group[rows] == group
    here = np.flatnonzero(in_group & (calls.seq[rows] == seq))
    if not len(here):
        return None
    here = int(here[0])
    values = calls.value[rows].tolist()
    markers: dict[tuple[int, int], list[int]] = {}  # (group, op) of another group -> positions
    for index in np.flatnonzero(~in_group[:here]).tolist():
        markers.setdefault((int(calls.group[rows[index]]), int(calls.op[rows[index]])), []).append(index)
    answers = set()
    for positions in markers.values():
        periods = list(zip(positions[:-1], positions[1:])) or ([(-1, positions[0])] if from_start else [])
        patterns = {tuple(values[i] for i in range(low + 1, high) if in_group[i]) for low, high in periods}
        if len(patterns) > 1:
            return None  # its steps differ (an eval step, a short batch): no step predicts this one
        if not patterns:
            continue
        pattern = patterns.pop()
        index = int(in_group[positions[-1] + 1:here].sum())
        if index < len(pattern):
            answers.add(pattern[index])
    return answers.pop() if len(answers) == 1 else None
