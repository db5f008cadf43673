"""Profiling windows of a real torch.profiler, converted and streamed (in-memory bus).

The reference here converts one activity at a time with the accessors torch documents; the
streamed columns must hold exactly the same values."""

import json
import threading

import duckdb
import pytest
import torch
import torch.profiler as tp

from rich.console import Console

from rankstream.consumers.materializer import Materializer
from rankstream.consumers.store import Store
from rankstream.producers.producer import Producer
from rankstream.producers.profiler import ProfilerStream, profile, window_columns
from rankstream.producers.trace_columns import trace_batches
from rankstream.schemas import PayloadKind, all_topics
from rankstream.status import collect_status, render_status
from rankstream.schemas.trace import NULL_INT, TraceBatch
from tests.doubles import MemorySource, MemoryTransport
from tests.unit.test_producer import read_all


def train(profiler, steps: int) -> None:
    """A few steps of a small model, with a user span and allocations to record."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler.start()
    for _ in range(steps):
        with torch.profiler.record_function("user_span"):
            loss = model(torch.randn(16, 32)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        profiler.step()
    profiler.stop()


@pytest.fixture(scope="module")
def window_activities():
    """The activities of one real window (steps 2-4 of 6), with shapes and memory events."""
    windows = []

    def keep(prof):
        results = prof.profiler.kineto_results
        windows.append((results, results.trace_activities()))

    train(tp.profile(activities=[tp.ProfilerActivity.CPU], schedule=tp.schedule(wait=1, warmup=1, active=3),
                     on_trace_ready=keep, record_shapes=True, profile_memory=True), steps=6)
    assert windows, "torch.profiler delivered no window"
    return windows[0][1]


def reference_event(activity, step_spans):
    kind = str(activity.type())
    instant = kind == "cpu_instant_event"
    ts = activity.timestamp()
    metadata = activity.metadata_json()
    step = next((number for start, end, number in step_spans if start <= ts < end), None)
    return (activity.name(), kind, "i" if instant else "X", ts, 0 if instant else activity.duration(),
            activity.device_id(), activity.resource_id(), step, activity.flow_id() or None,
            activity.correlation_id() or None, "{" + metadata + "}" if metadata else None)


def column_events(columns):
    def plain(name):
        values = columns[name]
        values = values.tolist() if hasattr(values, "tolist") else values
        return [None if v == NULL_INT else v for v in values]

    names = ("name", "cat", "ph", "ts_ns", "dur_ns", "pid", "tid", "step", "flow_id", "correlation_id", "args")
    return list(zip(*(plain(name) for name in names)))


def test_window_columns_equal_a_per_activity_conversion(window_activities):
    spans = [(a.timestamp(), a.timestamp() + a.duration(), int(a.name().split("#")[1]))
             for a in window_activities if a.name().startswith("ProfilerStep#")]
    assert [s[2] for s in sorted(spans)] == [2, 3, 4]
    expected = [reference_event(a, spans) for a in window_activities]
    assert column_events(window_columns(window_activities)) == expected
    kinds = {e[1] for e in expected}
    assert {"cpu_op", "user_annotation", "cpu_instant_event"} <= kinds
    assert any(e[10] and "Input Dims" in e[10] for e in expected), "record_shapes gave no shapes"
    assert {e[7] for e in expected if e[1] == "cpu_op"} <= {2, 3, 4}


def test_every_window_reaches_the_bus_with_named_tracks(make_config, bus):
    config = make_config(**{"producer.batch_events": 100})
    producer = Producer(run_id="r", rank=3, world_size=4, config=config, transport=MemoryTransport(bus))
    stream = ProfilerStream(producer, rank=3)
    train(profile(stream, wait=1, warmup=1, active=2, repeat=2), steps=9)
    stream.flush()
    stats = producer.close()
    assert stream.windows == 2 and stream.events > 0 and stream.dropped_windows == 0
    batches = [e.payload for e in read_all(bus, config.topic_prefix) if e.kind is PayloadKind.TRACE_BATCH]
    assert all(batch.count <= 100 for batch in batches)
    events = [event for batch in batches for event in batch_events(batch)]
    assert stats.events_dropped == 0 and stats.events_sent == len(events)
    metadata = [e for e in events if e["ph"] == "M"]
    assert {e["name"] for e in metadata} == {"process_name", "process_sort_index", "thread_name"}
    assert any(json.loads(e["args"]) == {"name": "MainThread"} for e in metadata if e["name"] == "thread_name")
    profiled = [e for e in events if e["ph"] != "M"]
    assert len(profiled) == stream.events
    # wait, warmup, then two active steps, twice: torch records steps 2-3 and 6-7
    assert {e["step"] for e in profiled if e["name"].startswith("ProfilerStep#")} == {2, 3, 6, 7}
    assert {e["step"] for e in profiled if e["cat"] == "cpu_op"} == {2, 3, 6, 7}


def test_a_window_beyond_the_producers_bound_is_dropped_and_counted(make_config, bus, window_activities):
    config = make_config(**{"producer.max_buffered_events": 10})
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    batch, = trace_batches(window_columns(window_activities), 10_000)
    assert batch.count > 10
    assert producer.offer_batch(batch) is False
    assert producer.stats().events_dropped == batch.count
    assert producer.stats().buffered_events == 0
    producer.close()


def test_a_window_that_cannot_be_taken_is_counted_in_the_heartbeats(make_config, bus):
    config = make_config()
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    stream = ProfilerStream(producer, rank=0)

    class Broken:  # what a torch whose results changed shape would hand over
        profiler = None

    stream(Broken())
    stats = producer.close()
    assert stream.failed_windows == 1 and stats.windows_lost == 1
    assert "profiler window lost" in stats.last_error
    final = [e.payload for e in read_all(bus, config.topic_prefix) if e.kind is PayloadKind.HEARTBEAT][-1]
    assert final.fields["windows_lost"] == 1
    store = Store(duckdb.connect(str(config.db_path)))
    Materializer(config, store, MemorySource(bus, all_topics(config.topic_prefix)), log=lambda line: None).run(
        threading.Event(), until_caught_up=True)
    store.connection.close()
    console = Console(record=True, width=200)
    render_status(collect_status(config), console)
    assert "run r: 0 send(s) failed (the messages were kept and sent again, not lost), 1 profiler window(s) lost" \
        in console.export_text()


def batch_events(batch: TraceBatch) -> list[dict]:
    strings = {name: batch.string_column(name) for name in ("name", "cat", "ph")}
    ints = {name: batch.int_column(name)[0] for name in ("ts_ns", "step")}
    args = dict(zip(batch.args_positions().tolist(), batch.args))
    return [{**{name: values[codes[i]] for name, (codes, values) in strings.items()},
             **{name: (None if column[i] == NULL_INT else int(column[i])) for name, column in ints.items()},
             "args": args.get(i)} for i in range(batch.count)]


def test_a_requested_window_opens_at_the_next_step_and_waits_while_another_profiler_records(make_config, bus):
    from rankstream.producers.on_demand import WINDOW_MARK, OnDemandWindows
    from rankstream.producers.requests import decode_request, profile_request

    config = make_config()
    producer = Producer(run_id="asked", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    stream = ProfilerStream(producer, rank=0)
    windows = OnDemandWindows(producer, pid=1, make_stream=lambda: stream)
    request = decode_request(json.dumps(profile_request("asked", [0], active=2)).encode())
    windows.request(request)
    windows.on_step(0, wait=True)  # another profiler records: not yet
    assert not windows.active
    steps = 0
    for step in range(1, 6):
        windows.on_step(step)
        steps += windows.active
        torch.mm(torch.randn(64, 64), torch.randn(64, 64))
    assert steps == 2 and not windows.active and windows.failed == 0
    stream.flush()
    producer.close()
    names = []
    for envelope in read_all(bus, config.topic_prefix):
        if envelope.kind is PayloadKind.TRACE_BATCH:
            codes, values = envelope.payload.string_column("name")
            names += [values[c] for c in codes]
    assert names.count(WINDOW_MARK) == 2 and "aten::mm" in names


@pytest.mark.parametrize("raw", [b"", b"[]", b'{"kind": "profile"}', b'{"kind": "profile", "id": "x", "active": 0}',
                                 b'{"kind": "profile", "id": "x", "active": 2, "ranks": ["0"]}', b"\xff"])
def test_anything_that_is_not_a_valid_request_is_ignored(raw):
    from rankstream.producers.requests import decode_request

    assert decode_request(raw) is None
