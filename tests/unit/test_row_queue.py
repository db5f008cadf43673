"""The flat queue between ``Producer.emit`` and the sender thread."""

import threading

from rankstream.producers.row_queue import ROW_WIDTH, RowQueue, rows_of
from rankstream.schemas.trace import TRACE_ROW_FIELDS


def _row(i: int) -> tuple:
    return (f"op{i % 3}", "cpu_op", "X", i, 1, 0, 0, None, None, i if i % 2 else None, None)


def test_take_returns_the_oldest_rows_as_columns_and_keeps_the_rest():
    queue = RowQueue(max_events=100)
    for i in range(10):
        queue.items.extend(_row(i))
    columns = queue.take(4)
    assert list(columns) == list(TRACE_ROW_FIELDS)
    assert columns["ts_ns"] == [0, 1, 2, 3] and columns["correlation_id"] == [None, 1, None, 3]
    assert rows_of(columns) == [_row(i) for i in range(4)]
    assert len(queue) == 6 and queue.limit == 100 * ROW_WIDTH
    assert rows_of(queue.take(6)) == [_row(i) for i in range(4, 10)]
    assert len(queue) == 0


def test_rows_added_while_the_sender_takes_are_never_split_lost_or_repeated():
    queue = RowQueue(max_events=10**7)
    total = 200_000

    def emit() -> None:
        items = queue.items
        for i in range(total):
            items.extend(_row(i))

    producer = threading.Thread(target=emit)
    producer.start()
    seen: list[int] = []
    while producer.is_alive() or len(queue):
        count = len(queue)
        if count:
            columns = queue.take(count)
            assert all(name.startswith("op") for name in columns["name"])  # no row taken in half
            seen.extend(columns["ts_ns"])
    producer.join()
    assert seen == list(range(total))


def test_clear_drops_whole_rows_and_counts_them():
    queue = RowQueue(max_events=10)
    for i in range(3):
        queue.items.extend(_row(i))
    assert queue.clear() == 3 and len(queue) == 0 and queue.items == []
