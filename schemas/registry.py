"""Which payload class reads which kind, at which version, and how older versions upcast.

To change a payload layout: bump its entry in ``CURRENT_VERSIONS``, add an
``UPCASTERS[(kind, old_version)]`` function that turns the old wire map into the next version's,
and add a test that decodes a stored message of the old version.
"""

from __future__ import annotations

from typing import Any, Callable

from rankstream.schemas import trace
from rankstream.schemas.envelope import PayloadKind
from rankstream.schemas.fields import PayloadError
from rankstream.schemas.records import FrBatch, Heartbeat, InputRejects, PgConfig, RankMeta
from rankstream.schemas.trace import TraceBatch

__all__ = ["PAYLOAD_TYPES", "CURRENT_VERSIONS", "UPCASTERS", "read_payload"]

PAYLOAD_TYPES = {
    PayloadKind.TRACE_BATCH: TraceBatch,
    PayloadKind.FR_BATCH: FrBatch,
    PayloadKind.PG_CONFIG: PgConfig,
    PayloadKind.RANK_META: RankMeta,
    PayloadKind.HEARTBEAT: Heartbeat,
    PayloadKind.INPUT_REJECTS: InputRejects,
}

CURRENT_VERSIONS = {
    PayloadKind.TRACE_BATCH: 2,
    PayloadKind.FR_BATCH: 1,
    PayloadKind.PG_CONFIG: 1,
    PayloadKind.RANK_META: 1,
    PayloadKind.HEARTBEAT: 1,
    PayloadKind.INPUT_REJECTS: 1,
}

UPCASTERS: dict[tuple[PayloadKind, int], Callable[[Any], Any]] = {
    (PayloadKind.TRACE_BATCH, 1): trace.upcast_v1,
}


def read_payload(kind: PayloadKind, version: int, wire: Any):
    """Upcast ``wire`` from ``version`` to the current one, then validate it into its payload type."""
    current = CURRENT_VERSIONS[kind]
    if not 1 <= version <= current:
        raise PayloadError(f"{kind.value} payload version {version} is unknown (this reader knows 1..{current})")
    while version < current:
        step = UPCASTERS.get((kind, version))
        if step is None:
            raise PayloadError(f"no upcaster for {kind.value} v{version}")
        wire = step(wire)
        version += 1
    return PAYLOAD_TYPES[kind].from_wire(wire)
