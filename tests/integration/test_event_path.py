"""One event followed from the producer API to a ``SELECT``: the modules of rankstream it passes
through, on the rank side and on the server side, are the chain docs/design.md describes."""

import sys
import threading

import duckdb
import pytest

from rankstream.producers.producer import Producer
from rankstream.services import materialize

pytestmark = pytest.mark.integration

#: The chain in docs/design.md ("One event, end to end").
RANK_SIDE = ["rankstream.producers.producer", "rankstream.producers.sender", "rankstream.schemas.codec",
             "rankstream.producers.delivery", "rankstream.producers.transport"]
SERVER_SIDE = ["rankstream.consumers.materializer", "rankstream.consumers.source", "rankstream.consumers.prepare",
               "rankstream.schemas.codec", "rankstream.consumers.projector", "rankstream.consumers.store"]


class _ModulesVisited:
    """The rankstream modules whose functions run, in the order they first run (every thread)."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.armed = False
        self._lock = threading.Lock()

    def __call__(self, frame, event, arg):
        if event == "call" and self.armed:
            module = frame.f_globals.get("__name__", "")
            if module.startswith("rankstream.") and module not in self.order:
                with self._lock:
                    if module not in self.order:
                        self.order.append(module)
        return None

    def __enter__(self):
        sys.setprofile(self)
        threading.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)


def test_one_event_from_emit_to_select(kafka_config):
    config = kafka_config()
    with _ModulesVisited() as rank_side:  # installed first, so the sender thread is followed too
        producer = Producer(run_id="path", rank=0, world_size=1, config=config, confirm_stored=False)  # stored later
        rank_side.armed = True
        producer.emit(name="forward", ph="X", ts_ns=1_000, dur_ns=500)
        producer.close()
    with _ModulesVisited() as server_side:
        server_side.armed = True
        materialize(config, threading.Event(), once=True, log=lambda line: None)

    con = duckdb.connect(str(config.db_path), read_only=True)
    assert con.execute("SELECT name, dur_ns FROM spans WHERE run_id = 'path'").fetchall() == [("forward", 500)]
    # the sender thread connects while the event is queued, so only the first step's place is fixed
    assert rank_side.order[0] == RANK_SIDE[0] and set(RANK_SIDE) <= set(rank_side.order), rank_side.order
    assert set(SERVER_SIDE) <= set(server_side.order), server_side.order
