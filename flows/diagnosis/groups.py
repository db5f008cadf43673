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

__all__ = ["Group", "find_groups"]


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
    def label(self) -> str:
        return f"{self.desc} (pg {self.name})" if self.desc and self.desc != self.name else f"pg {self.name}"


def _is_default(name: str, desc: str | None) -> bool:
    return desc == "default_pg" or (desc is None and name == "0")


def find_groups(entries: Entries, listed: dict[str, list[int]], dumped: list[int]) -> tuple[dict[int, Group], int]:
    """``{group code: Group}`` for every group with entries, and the job's world size.
    ``listed`` maps a group name to the ranks a dump listed for it."""
    world = max([max(dumped, default=-1)] + [max(r, default=-1) for r in listed.values()]) + 1
    groups = {}
    for code, (name, desc) in enumerate(entries.vocabulary.groups):
        logged = np.unique(entries.rank[entries.group == code]).tolist()
        if not logged and name not in listed:
            continue
        if listed.get(name):
            members, known = tuple(sorted(listed[name])), True
        elif _is_default(name, desc):
            members, known = tuple(range(world)), True
        else:
            members, known = tuple(logged), False
        groups[code] = Group(code, name, desc, members, known)
    return groups, world
