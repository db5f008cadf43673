"""The projector merges a poll's trace batches column-wise: each event must keep its own values."""

from rankstream.consumers.projector import trace_table
from rankstream.schemas.trace import TraceBatch


def _rows(prefix: str, count: int, offset: int) -> list[tuple]:
    return [(f"{prefix}{i % (2 + offset)}", f"cat{offset}", "XBE"[(i + offset) % 3], offset * 1000 + i, i, offset, 7,
             i if i % 2 else None, None, offset if i % 3 == 0 else None, {"i": i} if i % 4 == 0 else None)
            for i in range(count)]


def test_every_event_keeps_its_values_when_batches_with_different_dictionaries_merge():
    parts = [("run-a", 0, _rows("conv", 5, 0)), ("run-a", 1, _rows("mm", 7, 1)), ("run-b", 3, _rows("x", 1, 2)),
             ("run-b", 0, _rows("relu", 4, 3))]
    table = trace_table([(run, rank, TraceBatch.from_rows(rows)) for run, rank, rows in parts])
    stored = table.to_pylist()
    expected = [{"run_id": run, "rank": rank, "name": r[0], "cat": r[1], "ph": r[2], "ts_ns": r[3], "dur_ns": r[4],
                 "pid": r[5], "tid": r[6], "step": r[7], "flow_id": r[8], "correlation_id": r[9],
                 "args": None if r[10] is None else '{"i":%d}' % r[10]["i"]}
                for run, rank, rows in parts for r in rows]
    assert stored == expected
