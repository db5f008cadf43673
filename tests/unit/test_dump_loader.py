"""The dump loader behind ``rankstream diagnose``: what it writes must not depend on its shortcuts."""

import json
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rankstream.flows import dump_loader
from rankstream.flows.dump_loader import FR_SCHEMA, load_dump_directory, write_dump_parquet
from rankstream.demo.fr_dump_generator import write_dumps


def _lenient(monkeypatch):
    """Make the Arrow conversion refuse everything, so the lenient per-column one runs."""
    def refuse(*_):
        raise pa.ArrowInvalid("refused for the test")
    monkeypatch.setattr(dump_loader, "_analysis_table", refuse)


def test_the_arrow_conversion_gives_the_rows_the_lenient_one_gives(tmp_path, monkeypatch):
    write_dumps(tmp_path / "job", 16, 300, fault="wrong_op", fault_rank=5)
    fast, fast_groups, fast_ranks = load_dump_directory(tmp_path / "job", "rank_", "run")
    _lenient(monkeypatch)
    slow, slow_groups, slow_ranks = load_dump_directory(tmp_path / "job", "rank_", "run")
    assert fast.num_rows == slow.num_rows > 16 * 200
    assert fast.equals(slow)
    assert (fast_groups, fast_ranks) == (slow_groups, slow_ranks)


def test_a_dump_with_unusual_types_is_still_read(tmp_path):
    """Integer group names (not what torch writes) make Arrow refuse the fast conversion; the
    lenient one reads them as text, as the importer does."""
    entries = [{"record_id": i, "process_group": (7, "tp"), "collective_seq_id": i + 1, "p2p_seq_id": 0,
                "profiling_name": "nccl:all_reduce", "time_created_ns": 1, "input_sizes": [[4]],
                "input_dtypes": ["Float"], "output_sizes": [[4]], "state": "completed", "is_p2p": False}
               for i in range(3)]
    (tmp_path / "rank_0").write_bytes(pickle.dumps({"entries": entries}))
    table, _, ranks = load_dump_directory(tmp_path, "rank_", "run")
    assert ranks == [0]
    assert table["pg_name"].to_pylist() == ["7"] * 3 and table["pg_desc"].to_pylist() == ["tp"] * 3


@pytest.mark.parametrize("ranks", [4, 40])  # in this process, and in worker processes
def test_every_distinct_group_configuration_is_kept_once(tmp_path, ranks):
    """Dumps usually repeat one pg_config; those that differ must not be lost by the dedup."""
    for rank in range(ranks):
        config = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(ranks)))}}
        if rank == ranks - 1:  # one rank also knows a group the others do not list
            config["9"] = {"name": "9", "desc": "late", "ranks": "[0, 1]"}
        entry = {"record_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1, "p2p_seq_id": 0,
                 "profiling_name": "nccl:all_reduce", "time_created_ns": 1, "input_sizes": [[4]],
                 "input_dtypes": ["Float"], "output_sizes": [[4]], "state": "completed", "is_p2p": False}
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps({"entries": [entry], "pg_config": config}))
    out = tmp_path / "out"
    out.mkdir()
    loaded = write_dump_parquet(tmp_path, "rank_", "run", out)
    kept = sorted((g["pg_name"], g["rank"]) for g in loaded.groups)
    assert kept == [("0", 0), ("0", ranks - 1), ("9", ranks - 1)]
    assert sorted(loaded.ranks) == list(range(ranks))
    assert sum(pq.read_table(f, schema=FR_SCHEMA).num_rows for f in loaded.parquet_files) == ranks
    assert not loaded.repeated_records and not loaded.coalesced


def test_the_loader_reports_repeated_records_and_coalesced_collectives(tmp_path):
    entry = {"record_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1, "p2p_seq_id": 0,
             "profiling_name": "nccl:coalesced", "time_created_ns": 1, "input_sizes": [], "input_dtypes": [],
             "output_sizes": [], "state": "completed", "is_p2p": False}
    (tmp_path / "rank_0").write_bytes(pickle.dumps({"entries": [entry, dict(entry)]}))
    out = tmp_path / "out"
    out.mkdir()
    loaded = write_dump_parquet(tmp_path, "rank_", "run", out)
    assert loaded.repeated_records and loaded.coalesced


def test_running_out_of_memory_is_one_clear_error(tmp_path, monkeypatch):
    from rankstream.schemas.errors import RankstreamError
    from rankstream.flows import diagnose

    write_dumps(tmp_path / "job", 16, 300)
    monkeypatch.setattr(diagnose, "_MEMORY_LIMIT", "1MB")
    with pytest.raises(RankstreamError, match=r"job: the analysis ran out of its 1MB of working memory"):
        diagnose.diagnose_directory(tmp_path / "job", prefix="rank_")
