"""Collective matching on generated NCCL-style dumps: every finding kind, any dump order."""

import json
import pickle
import random
import subprocess
import sys

import duckdb
import pytest

from rankstream.flows.diagnose import analyze_run, diagnose_directory
from rankstream.flows.dump_loader import load_dump_directory
from rankstream.schemas.tables import ddl

PATTERN = ["all_reduce", "all_gather", "all_reduce", "broadcast"]


def entry(record_id, seq, op, size=1024, created=0, dtype="Float", group=("0", "default_pg"), members=4):
    output = [[size * members]] if op == "all_gather" else [[size]]
    return {"record_id": record_id, "pg_id": int(group[0]), "process_group": list(group), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"nccl:{op}", "time_created_ns": created,
            "input_sizes": [[size]], "input_dtypes": [dtype], "output_sizes": output, "output_dtypes": [dtype],
            "state": "completed", "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": True, "timeout_ms": 600000, "is_p2p": False}


def write_job(directory, fault="none", ranks=4, steps=40, fault_rank=2, at=20):
    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        entries, seq = [], 1
        for i in range(steps):
            op, size, dtype = PATTERN[i % 4], 1024, "Float"
            if rank == fault_rank and i == at:
                if fault == "skip":
                    continue
                if fault == "wrong_op":
                    op = "reduce_scatter"
                if fault == "size":
                    size = 2048
                if fault == "dtype":
                    dtype = "Half"
            late = 8_000_000 if fault == "straggler" and rank == fault_rank else rank * 1000
            entries.append(entry(len(entries), seq, op, size, 1_000_000_000 + i * 10_000_000 + late, dtype))
            seq += 1
            if fault == "extra" and rank == fault_rank and i == at:
                entries.append(entry(len(entries), seq, "barrier", 0, 1_000_000_000 + i * 10_000_000))
                seq += 1
        if fault == "hang" and rank == fault_rank:
            entries = entries[:-1]
        if fault == "wrapped":
            entries = entries[rank * 3:]  # ring buffers that wrapped unevenly
        dump = {"version": "2.10", "entries": entries,
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(ranks)))}}}
        (directory / f"rank_{rank}").write_bytes(pickle.dumps(dump))
    return directory


@pytest.mark.parametrize("fault,kind,seq", [
    ("skip", "skipped_collective", 21),
    ("wrong_op", "type_mismatch", 21),
    ("extra", "extra_collective", 22),
    ("size", "size_mismatch", 21),
    ("dtype", "dtype_mismatch", 21),
    ("hang", "hang", 40),
])
@pytest.mark.parametrize("fault_rank", [0, 2])
def test_each_fault_names_its_kind_sequence_and_culprit(tmp_path, fault, kind, seq, fault_rank):
    report, _ = diagnose_directory(write_job(tmp_path / fault, fault, fault_rank=fault_rank), prefix="rank_")
    first = report.findings[0]
    assert (first.kind, first.group, first.group_desc, first.seq, first.culprit_ranks) == (
        kind, "0", "default_pg", seq, [fault_rank])
    assert report.verdict == ("hang" if fault == "hang" else "desync")
    assert [f.kind for f in report.findings if f.kind != "truncated_buffer"] == [kind]  # no cascade


def test_order_of_dumps_does_not_change_the_findings(tmp_path):
    entries, _, _ = load_dump_directory(write_job(tmp_path / "job", "wrong_op", fault_rank=0), "rank_", "run")
    results = []
    for attempt in range(4):
        order = list(range(entries.num_rows))
        random.Random(attempt).shuffle(order)  # rows (and so ranks' dumps) arrive in any order
        con = duckdb.connect()
        con.execute(ddl())
        con.register("shuffled", entries.take(order))
        con.execute("INSERT INTO fr_entries SELECT * FROM shuffled")
        results.append([f.as_json() for f in analyze_run(con, "run").findings])
    assert all(r == results[0] for r in results)
    assert results[0][0]["culprit_ranks"] == [0]


def test_healthy_and_unevenly_wrapped_buffers_are_not_a_desync(tmp_path):
    assert diagnose_directory(write_job(tmp_path / "ok"), prefix="rank_")[0].verdict == "healthy"
    report, _ = diagnose_directory(write_job(tmp_path / "wrapped", "wrapped"), prefix="rank_")
    assert report.verdict == "healthy"
    assert [f.kind for f in report.findings] == ["truncated_buffer"]


def test_a_straggler_is_reported_but_is_not_a_desync(tmp_path):
    report, _ = diagnose_directory(write_job(tmp_path / "slow", "straggler", fault_rank=3), prefix="rank_")
    assert report.verdict == "straggler"
    assert [(f.kind, f.culprit_ranks) for f in report.findings] == [("straggler", [3])]
    assert report.findings[0].actual["mean_late_ms"] == pytest.approx(8.0, abs=0.1)


@pytest.mark.parametrize("op,gathers", [("_all_gather_base", True), ("all_gather_into_tensor", True),
                                        ("_reduce_scatter_base", False)])
def test_a_gather_or_scatter_that_breaks_the_expansion_rule_on_every_rank_is_a_size_mismatch(tmp_path, op, gathers):
    """All four ranks agree, so only the per-call rule can tell: seq 11 expands by the group size
    (4), seq 12 by 2. (Like fr_trace's check, equal shapes would pass: no dimension expanded.)"""
    for rank in range(4):
        entries = [entry(i, i + 1, "all_reduce") for i in range(10)]
        for record, (small, large) in ((10, (1024, 4096)), (11, (1024, 2048))):
            call = entry(record, record + 1, op)
            call["input_sizes"], call["output_sizes"] = ([[small]], [[large]]) if gathers else ([[large]], [[small]])
            entries.append(call)
        dump = {"version": "2.10", "entries": entries,
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(4)))}}}
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps(dump))
    report, _ = diagnose_directory(tmp_path, prefix="rank_")
    assert [(f.kind, f.seq, f.culprit_ranks) for f in report.findings] == [("size_mismatch", 12, [0, 1, 2, 3])]
    assert "expansion rule" in report.findings[0].detail


@pytest.mark.parametrize("op", ["alltoall_base", "all_to_all_single"])
@pytest.mark.parametrize("lost", [0, 1])
def test_an_all_to_all_with_uneven_splits_is_judged_by_its_totals(tmp_path, op, lost):
    """Rank r sends 10 + r elements and receives 13 - r: every rank's sizes differ, yet the totals
    agree (46 each way), which is healthy; one element lost makes the totals disagree."""
    for rank in range(4):
        entries = [entry(i, i + 1, "all_reduce") for i in range(10)]
        call = entry(10, 11, op)
        call["input_sizes"], call["output_sizes"] = [[10 + rank]], [[13 - rank - (lost if rank == 0 else 0)]]
        dump = {"version": "2.10", "entries": entries + [call],
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(4)))}}}
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps(dump))
    report, _ = diagnose_directory(tmp_path, prefix="rank_")
    if not lost:
        assert report.findings == [] and report.verdict == "healthy"
    else:
        assert [(f.kind, f.seq, f.expected, f.actual) for f in report.findings] == [("size_mismatch", 11, 46, 45)]
        assert "all-to-all" in report.findings[0].detail


def test_mismatch_cap_and_missing_dumps(tmp_path):
    job = write_job(tmp_path / "job", "wrong_op")
    (job / "rank_3").unlink()
    report, _ = diagnose_directory(job, prefix="rank_", mismatch_cap=0)
    assert report.missing_ranks == [3] and report.verdict == "incomplete"
    allowed, _ = diagnose_directory(job, prefix="rank_", allow_incomplete=True)
    assert allowed.verdict == "desync"


def test_cli_prints_one_json_object_and_exits_by_verdict(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "rankstream", "diagnose", *args], capture_output=True, text=True)

    healthy = run(str(write_job(tmp_path / "ok")), "--prefix", "rank_", "--json")
    assert healthy.returncode == 0 and json.loads(healthy.stdout) == {"verdict": "healthy", "findings": []}
    bad = run(str(write_job(tmp_path / "bad", "skip", fault_rank=1)), "--prefix", "rank_", "--json")
    body = json.loads(bad.stdout)
    assert bad.returncode == 1 and body["verdict"] == "desync"
    assert set(body["findings"][0]) == {"kind", "group", "group_desc", "seq", "culprit_ranks", "ranks_involved",
                                        "expected", "actual", "detail"}
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "rank_0").write_bytes(b"\x80\x04not a pickle")
    broken = run(str(tmp_path / "broken"), "--prefix", "rank_", "--json")
    assert broken.returncode == 2 and broken.stdout == ""
    assert broken.stderr.strip().startswith("rankstream: error:") and "rank_0" in broken.stderr


def test_healthy_p2p_is_quiet_and_a_receive_of_the_wrong_size_is_named(tmp_path):
    from rankstream.demo.fr_dump_generator import write_dumps

    healthy = write_dumps(tmp_path / "p2p", 8, 300, tp=4, p2p=True)
    report, _ = diagnose_directory(healthy, prefix="rank_")
    assert report.verdict == "healthy" and not [f for f in report.findings if f.kind == "p2p_mismatch"]

    dump = pickle.loads((healthy / "rank_3").read_bytes())
    receives = [e for e in dump["entries"] if e["profiling_name"].startswith("nccl:recv")]
    receives[2]["output_sizes"] = [[8192]]
    (healthy / "rank_3").write_bytes(pickle.dumps(dump))
    report, _ = diagnose_directory(healthy, prefix="rank_")
    mismatches = [f for f in report.findings if f.kind == "p2p_mismatch"]
    assert report.verdict == "desync"
    assert len(mismatches) == 1 and mismatches[0].ranks_involved == [2, 3]
    assert "[[4096]]" in mismatches[0].expected and "[[8192]]" in mismatches[0].actual


def write_coalesced_job(directory, fault="none", ranks=4, fault_rank=1):
    """Each step: an all-reduce, then a coalesced group of two all-reduces (one sequence number,
    closed by a ``nccl:coalesced`` entry). Faults in the group at step 5 on ``fault_rank``: a member
    of another size, or a member of another op."""
    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        entries, seq = [], 1
        for step in range(10):
            entries.append(entry(len(entries), seq, "all_reduce", created=step * 1000))
            seq += 1
            for member in range(2):
                op, size = "all_reduce", 512 * (member + 1)
                if rank == fault_rank and step == 5 and member == 1:
                    size, op = (4096, op) if fault == "size" else (size, "all_gather" if fault == "op" else op)
                entries.append(entry(len(entries), seq, op, size, created=step * 1000 + 1))
            entries.append(dict(entry(len(entries), seq, "coalesced", 0, created=step * 1000 + 2),
                                input_sizes=[], output_sizes=[], input_dtypes=[], output_dtypes=[]))
            seq += 1
        dump = {"version": "2.10", "entries": entries,
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(ranks)))}}}
        (directory / f"rank_{rank}").write_bytes(pickle.dumps(dump))
    return directory


@pytest.mark.parametrize("fault,kind", [("none", None), ("size", "size_mismatch"), ("op", "type_mismatch")])
def test_coalesced_groups_match_as_one_collective(tmp_path, fault, kind):
    report, con = diagnose_directory(write_coalesced_job(tmp_path / fault, fault), prefix="rank_")
    ops = {op for (op,) in con.execute("SELECT DISTINCT op FROM collective_calls").fetchall()}
    assert "coalesced(all_reduce,all_reduce)" in ops
    if kind is None:
        assert report.verdict == "healthy" and report.findings == []
    else:
        first = report.findings[0]
        assert (first.kind, first.seq, first.culprit_ranks) == (kind, 12, [1])  # step 5's group: seq 2 * 5 + 2


def test_a_rank_that_moved_on_without_completing_is_a_state_mismatch(tmp_path):
    directory = write_job(tmp_path / "state")
    dump = pickle.loads((directory / "rank_3").read_bytes())  # our own test file
    dump["entries"][10]["state"] = "started"
    (directory / "rank_3").write_bytes(pickle.dumps(dump))
    report, _ = diagnose_directory(directory, prefix="rank_")
    first = report.findings[0]
    assert (first.kind, first.seq, first.culprit_ranks, report.verdict) == ("state_mismatch", 11, [3], "desync")


def test_a_group_head_still_running_is_not_a_state_mismatch(tmp_path):
    directory = write_job(tmp_path / "head")
    dump = pickle.loads((directory / "rank_1").read_bytes())  # our own test file
    dump["entries"][-1]["state"] = "started"
    (directory / "rank_1").write_bytes(pickle.dumps(dump))
    report, _ = diagnose_directory(directory, prefix="rank_")
    assert report.verdict == "healthy"
