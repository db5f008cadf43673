"""The rank-side API on the in-memory bus: spans, instants, counters, steps, no-ops."""

import pytest

import rankstream
from rankstream import api
from rankstream.schemas.settings import LaunchEnvironment
from rankstream.producers.producer import Producer
from rankstream.producers.session import RankSession, resolve_identity
from rankstream.schemas import PayloadKind
from tests.doubles import MemoryTransport

from .test_producer import read_all


@pytest.fixture
def session(make_config, bus):
    config = make_config()
    producer = Producer(run_id="api", rank=1, world_size=2, config=config, transport=MemoryTransport(bus))
    launch = LaunchEnvironment(rank=1, world_size=2, local_rank=1, node_rank=0, local_world_size=2,
                               run_id=None, master=None)
    created = RankSession(run_id="api", rank=1, world_size=2, config=config, launch=launch, fr_tap=False,
                          clock_sync=False, producer=producer)
    api._session = created
    yield created
    api.shutdown()


def events(bus, session):
    session.shutdown()
    rows = []
    for envelope in read_all(bus, session.producer._config.topic_prefix):
        if envelope.kind is PayloadKind.TRACE_BATCH:
            batch = envelope.payload
            codes, names = batch.string_column("name")
            phases = [batch.string_column("ph")[1][c] for c in batch.string_column("ph")[0]]
            steps, null = batch.int_column("step")
            rows += [(names[c], ph, None if n else int(s)) for c, ph, s, n in zip(codes, phases, steps, null)]
    return rows


def test_span_emits_begin_end_and_error(bus, session):
    with rankstream.span("forward"):
        pass
    with pytest.raises(ZeroDivisionError):
        with rankstream.span("backward", layer=3):
            1 / 0
    assert events(bus, session) == [("forward", "B", None), ("forward", "E", None), ("backward", "B", None),
                                    ("backward", "E", None), ("backward:error", "i", None)]


def test_span_as_decorator_and_steps(bus, session):
    @rankstream.span("optimizer")
    def update(x):
        return x + 1

    assert rankstream.step() == 0
    assert update(1) == 2
    assert rankstream.step() == 1
    rankstream.instant("checkpoint", path="/tmp/x")
    rankstream.counter("memory", {"allocated_mb": 12.5})
    assert rankstream.step(10) == 10
    assert events(bus, session) == [("step", "i", 0), ("optimizer", "B", 0), ("optimizer", "E", 0), ("step", "i", 1),
                                    ("checkpoint", "i", 1), ("memory", "C", 1), ("step", "i", 10)]


def test_every_call_is_a_no_op_without_a_session():
    api._session = None
    with rankstream.span("x"):
        rankstream.instant("y")
        rankstream.counter("z", {"a": 1})
    assert rankstream.step() is None
    assert rankstream.init(enabled=False) is None


def test_identity_from_arguments_then_launcher():
    launch = LaunchEnvironment(rank=3, world_size=8, local_rank=3, node_rank=0, local_world_size=8,
                               run_id="none", master="10.0.0.1:29500")
    run_id, rank, world = resolve_identity(None, None, None, launch=launch)
    assert (rank, world) == (3, 8)
    assert run_id.startswith("job-10.0.0.1-29500-")  # torchrun's default rendezvous id "none" is ignored
    assert resolve_identity("mine", 1, 2, launch=launch) == ("mine", 1, 2)


class _SlowStore:
    """A store whose second clock barrier takes a while, as on a loaded machine: the round is
    still running when training ends and the rank shuts down."""

    def __init__(self, world_size):
        import threading

        self.world_size = world_size
        self.in_second_barrier = threading.Event()

    def add(self, key, amount):
        if key.endswith("/b/arrived"):
            self.in_second_barrier.set()
            import time

            time.sleep(0.4)
        return self.world_size  # every peer is there

    def set(self, key, value):
        pass

    def wait(self, keys, timeout):
        pass

    def compare_set(self, key, expected, desired):
        return desired.encode()


def test_a_clock_round_running_at_shutdown_still_sends_its_sample(make_config, bus, monkeypatch):
    import types

    from rankstream.producers import session as session_module

    store = _SlowStore(world_size=2)
    fake_dist = types.SimpleNamespace(
        get_backend=lambda: "gloo",
        distributed_c10d=types.SimpleNamespace(_get_default_store=lambda: store, _get_all_pg_configs=lambda: []))
    monkeypatch.setattr(session_module, "_dist", lambda: fake_dist)
    config = make_config()
    launch = LaunchEnvironment(rank=0, world_size=2, local_rank=0, node_rank=0, local_world_size=2,
                               run_id=None, master=None)
    created = RankSession(run_id="clock", rank=0, world_size=2, config=config, launch=launch, fr_tap=False,
                          producer=Producer(run_id="clock", rank=0, world_size=2, config=config, transport=MemoryTransport(bus)))
    assert store.in_second_barrier.wait(5)
    created.shutdown()  # training ended while the round was between its barriers
    metadata = [e.payload.fields for e in read_all(bus, config.topic_prefix) if e.kind is PayloadKind.RANK_META]
    assert any(m.get("clock_sync_ns") for m in metadata), metadata
    assert created.clock_samples == 1
