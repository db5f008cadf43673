"""Process groups and their members, as far as the dumps tell.

NCCL dumps list every group's ranks in ``pg_config``. gloo dumps often do not (a placeholder, or
the default group only), so a group nobody listed is made of the ranks that logged entries in it,
except the default group, which holds every rank of the job. The job's size is the highest rank
anyone names, plus one: a rank that left no dump is still a member of the groups that list it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankstream.flows.diagnosis.entries import Entries
from rankstream.flows.diagnosis.findings import PLACEHOLDER_DESC, describe_group

__all__ = ["Group", "find_groups", "PLACEHOLDER_DESC"]


@dataclass(frozen=True)
class Group:
    code: int
    name: str
    desc: str | None
    #: Global ranks, sorted (a p2p op's group-local peer index is a position in this list).
    members: tuple[int, ...]
    #: Whether the dumps listed the members (otherwise they were inferred from the entries).
    listed: bool

    @property
    def role(self) -> str:
        """What the group is for, shared by the groups that play it on other ranks (tensor
        parallel, data parallel): its description, or, when it has none, only itself."""
        return self.desc if self.desc and self.desc != PLACEHOLDER_DESC else f"pg {self.name}"

    @property
    def label(self) -> str:
        """``tp (pg 3)``; a group torch describes with nothing, by its members: ``ranks 0, 1 (pg 2)``."""
        return describe_group(self.name, self.desc, list(self.members) if self.undescribed else None)

    @property
    def undescribed(self) -> bool:
        """Torch gave the group no description that says what it is (the default group's says it)."""
        return (self.desc in (None, PLACEHOLDER_DESC, self.name) and bool(self.members)
                and not _is_default(self.name, self.desc))


def _is_default(name: str, desc: str | None) -> bool:
    return desc == "default_pg" or (desc is None and name == "0")


def find_groups(entries: Entries, listed: dict[str, list[int]], dumped: list[int]) -> tuple[dict[int, Group], int]:
    """``{group code: Group}`` for every group with entries, and the job's world size.
    ``listed`` maps a group name to the ranks a dump listed for it."""
    world = max([max(dumped, default=-1)] + [max(r, default=-1) for r in listed.values()]) + 1
    groups = {}
    pairs = np.unique(entries.group.astype(np.int64) << 32 | entries.rank.astype(np.int64))
    logged_by: dict[int, list[int]] = {}
    for group, rank in zip((pairs >> 32).tolist(), (pairs & 0xFFFFFFFF).tolist()):
        logged_by.setdefault(group, []).append(rank)
    for code, (name, desc) in enumerate(entries.vocabulary.groups):
        logged = logged_by.get(code, [])
        if not logged and name not in listed:
            continue
        if listed.get(name):
            members, known = tuple(sorted(listed[name])), True
        elif _is_default(name, desc):
            members, known = tuple(range(world)), True
        else:
            members, known = tuple(logged), False
        groups[code] = Group(code, name, desc, members, known)
    absent = set(range(world)) - set(dumped)
    if absent:
        groups = {code: _completed(group, groups.values(), absent) for code, group in groups.items()}
    return groups, world


def _completed(group: Group, groups, absent: set[int]) -> Group:
    """An inferred group smaller than its siblings (same description) lacks a rank that left no
    dump: where the siblings' members all sit at the same offsets from their first rank, the
    missing ones are found at those offsets, provided exactly one placement uses only such ranks."""
    if group.listed:
        return group
    siblings = [g for g in groups if g.desc == group.desc and g.code != group.code and g.members]
    shapes = {tuple(m - g.members[0] for m in g.members) for g in siblings}
    if len(shapes) != 1:
        return group
    shape = shapes.pop()
    if len(shape) <= len(group.members):
        return group
    placements = []
    for anchor in {m - offset for m in group.members for offset in shape}:
        candidate = {anchor + offset for offset in shape}
        if set(group.members) <= candidate and candidate - set(group.members) <= absent:
            placements.append(candidate)
    if len(placements) != 1:
        return group
    return Group(group.code, group.name, group.desc, tuple(sorted(placements[0])), False)
