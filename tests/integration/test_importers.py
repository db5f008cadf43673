"""Importers round-trip real torch 2.13 artifacts: FR dumps (pickle and JSON) and profiler traces."""

import gzip
import json
import os
from datetime import timedelta

import pytest
import torch.multiprocessing as mp

from rankstream.consumers.query import connect
from rankstream.deploy.broker import stop_broker
from rankstream.services import start_embedded_broker
from rankstream.consumers.imports import import_fr
from rankstream.consumers.imports import import_traces

from .conftest import free_port

pytestmark = pytest.mark.integration


def _write_artifacts(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="200")
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    pair = dist.new_group([0, 1])
    tensor = torch.ones(8)
    with torch.profiler.profile(record_shapes=True) as prof:
        for step in range(3):
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                dist.all_reduce(tensor)
                dist.all_gather([torch.empty(8) for _ in range(world)], tensor, group=pair)
    dist.barrier()
    (out / "fr").mkdir(exist_ok=True)
    dump = (_dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False) if rank == 0
            else _dump_fr_trace_json(includeCollectives=True, onlyActive=False))
    (out / "fr" / f"rank_{rank}").write_bytes(dump)
    prof.export_chrome_trace(str(out / f"trace_rank{rank}.json"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("artifacts")
    mp.spawn(_write_artifacts, args=(2, free_port(), out), nprocs=2)
    return out


@pytest.fixture
def broker(make_config):
    config = make_config(broker_port=free_port(), partitions=2)
    start_embedded_broker(config)
    yield config
    stop_broker(config)


def test_fr_dumps_round_trip_and_reimport_adds_nothing(artifacts, broker):
    summary = import_fr(broker, artifacts / "fr", prefix="rank_", run_id="fr-real")
    database = connect(broker.db_path)
    rows = dict(database.fetchall("SELECT rank, count(*) FROM fr_entries WHERE run_id = 'fr-real' GROUP BY rank"))
    for rank in (0, 1):
        raw = (artifacts / "fr" / f"rank_{rank}").read_bytes()
        from rankstream.producers.fr_reader import parse_dump

        assert rows[rank] == len(parse_dump(raw, "dump")["entries"]) == summary.ranks[rank] > 0
    framed = database.fetchall("SELECT count(*) FROM fr_entries WHERE run_id = 'fr-real' AND rank = 0 "
                               "AND len(frames) > 0")[0][0]
    assert framed == rows[0]  # the pickle dump carries stack frames
    import_fr(broker, artifacts / "fr", prefix="rank_", run_id="fr-real")
    again = dict(database.fetchall("SELECT rank, count(*) FROM fr_entries WHERE run_id = 'fr-real' GROUP BY rank"))
    assert again == rows


def test_profiler_traces_round_trip_with_rank_steps_and_absolute_times(artifacts, broker, tmp_path):
    plain, compressed = artifacts / "trace_rank0.json", tmp_path / "trace_rank1.json.gz"
    compressed.write_bytes(gzip.compress((artifacts / "trace_rank1.json").read_bytes()))
    summary = import_traces(broker, [plain, compressed], run_id="tr-real")
    database = connect(broker.db_path)
    for rank, path in ((0, plain), (1, artifacts / "trace_rank1.json")):
        source = json.loads(path.read_text())
        expected = [e for e in source["traceEvents"] if e]
        count, first_ns, stepped = database.fetchall(
            "SELECT count(*), min(ts_ns) FILTER (WHERE ph = 'X'), count(step) FROM trace_events "
            "WHERE run_id = 'tr-real' AND rank = ?", [rank])[0]
        assert count == len(expected) == summary.ranks[rank]
        first_x = min(e["ts"] for e in expected if e["ph"] == "X")
        assert abs(first_ns - (source["baseTimeNanoseconds"] + first_x * 1000)) < 1000
        assert stepped > 0
