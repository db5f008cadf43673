"""What every step of the diagnosis shares: the entries, their calls per group, the groups, which
ranks' entries never say whether they finished, and how to describe a call."""

from __future__ import annotations

from functools import cached_property
from typing import Callable

import numpy as np

from rankstream.flows.diagnosis.calls import Calls, collective_calls
from rankstream.flows.diagnosis.entries import Entries, fold_close_states
from rankstream.flows.diagnosis.groups import Group, find_groups
from rankstream.flows.diagnosis.p2p import Pairing, mark_batch_closes, pair_p2p
from rankstream.flows.diagnosis.published_stacks import BlockedCall, OutsideCommunication
from rankstream.flows.diagnosis.sequences import GroupSequences, split_by_group

__all__ = ["Run", "place_of"]


class Run:
    """What the steps share: the entries, their calls, the groups and how to describe a call."""

    def __init__(self, entries: Entries, listed: dict[str, list[int]], dumped: list[int], *,
                 places: Callable[[], dict] | None = None) -> None:
        """``places``: reads where the ranks' current live stacks show them (``published_stacks``)."""
        self.entries = entries
        self.groups, self.world = find_groups(entries, listed, dumped)
        self.dumped = set(dumped)
        fold_close_states(entries)
        mark_batch_closes(entries)
        self.calls: Calls = collective_calls(entries)
        self.sequences: dict[int, GroupSequences] = split_by_group(self.calls, self.groups)
        self.stateless = stateless_ranks(entries)
        self.p2p: Pairing = pair_p2p(entries)
        #: group code -> its role (``Group.role``): what sibling groups on other ranks share.
        self.roles = {code: group.role for code, group in self.groups.items()}
        self._places = places

    @cached_property
    def places(self) -> dict:
        """rank -> where its current live stack shows it (``published_stacks``); read only when a
        finding asks (a query of the run's trace events, which a live watch pass need not pay for
        otherwise)."""
        return self._places() if self._places else {}

    @cached_property
    def blocked_in(self) -> dict:
        """rank -> the ``torch.distributed`` call its current live stack shows it blocked in."""
        return {rank: place for rank, place in self.places.items() if isinstance(place, BlockedCall)}

    @cached_property
    def outside_communication(self) -> dict:
        """rank -> where its current live stack shows it in its own code, in no ``torch.distributed`` call."""
        return {rank: place for rank, place in self.places.items() if isinstance(place, OutsideCommunication)}

    def describe(self, value: int | None) -> dict | None:
        if value is None:
            return None
        op, shape, dtype = self.calls.unpack(value)
        vocab = self.entries.vocabulary
        return {"op": vocab.ops[op], "shape": vocab.text("shapes", shape), "dtype": vocab.text("dtypes", dtype)}

    def group(self, code: int) -> Group:
        return self.groups[code]

    def starts_at_first_entry(self, rank: int) -> bool:
        """Whether ``rank``'s ring still holds its first entry (record 0): it never wrapped, so its
        program is there from the start."""
        records = self.entries.record[self.entries.rank == rank]
        return bool(len(records)) and int(records.min()) == 0


def stateless_ranks(entries: Entries) -> set[int]:
    """Ranks whose entries never say whether they finished (gloo: all 'scheduled', no times). A
    rank whose ring holds only entries its device has not started is not one when its oldest
    entry is a collective whose previous call its peers completed: collectives complete together,
    so it finished that call too, and its ring starts at the call where its device stopped."""
    progressed = entries.state > 0
    quiet = set(np.unique(entries.rank).tolist()) - set(np.unique(entries.rank[progressed]).tolist())
    if not quiet or not progressed.any():
        return quiet
    order = np.lexsort((entries.record, entries.rank))
    starts = order[np.flatnonzero(np.r_[True, entries.rank[order][1:] != entries.rank[order][:-1]])]
    firsts = starts[np.isin(entries.rank[starts], list(quiet)) & ~entries.is_p2p[starts] & (entries.seq[starts] > 1)]
    done = entries.state >= 2
    completed = entries.group[done].astype(np.int64) << 32 | entries.seq[done].astype(np.int64)
    previous = entries.group[firsts].astype(np.int64) << 32 | (entries.seq[firsts].astype(np.int64) - 1)
    return quiet - set(entries.rank[firsts[np.isin(previous, completed)]].tolist())


def place_of(run: Run, position) -> str:
    """A position as words: ``#N of tp (pg 3)``, or ``p2p #N of ...``."""
    group = run.group(position.group).label
    return f"p2p #{-position.seq} of {group}" if position.seq < 0 else f"#{position.seq} of {group}"
