"""Every rank's collective calls as a table (``rankstream diagnose -j``, fr_trace's listing)."""

from __future__ import annotations

import pyarrow as pa

from rankstream.flows.diagnosis.calls import collective_calls
from rankstream.flows.diagnosis.entries import STATES, Entries

__all__ = ["calls_table"]


def calls_table(entries: Entries) -> pa.Table:
    calls = collective_calls(entries)
    vocab = entries.vocabulary
    return pa.table({
        "rank": calls.rank, "group": [vocab.groups[g][0] for g in calls.group.tolist()],
        "group_desc": [vocab.groups[g][1] for g in calls.group.tolist()], "seq": calls.seq,
        "op": [vocab.ops[o] for o in calls.op.tolist()], "sizes": [vocab.shapes[s] for s in calls.shape.tolist()],
        "dtypes": [vocab.text("dtypes", d) for d in calls.dtype.tolist()],
        "state": [STATES[s] for s in calls.state.tolist()],
    }).sort_by([("rank", "ascending"), ("group", "ascending"), ("seq", "ascending")])
