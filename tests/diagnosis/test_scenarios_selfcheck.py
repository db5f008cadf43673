"""Sanity checks of the Flight Recorder scenario generator itself (no diagnosis engine involved)."""

from __future__ import annotations

import json
import os
import pickle
from collections import defaultdict
from pathlib import Path

import pytest

from tests.diagnosis.fr_scenarios import FORMATS, KINDS, LAYOUTS, Scenario, scenarios, write_scenario

NCCL_ONLY = {"stuck_in_collective", "state_mismatch", "p2p_unmatched"}
ENTRY_KEYS = {"record_id", "pg_id", "process_group", "thread_name", "thread_id", "collective_seq_id", "p2p_seq_id",
              "op_id", "profiling_name", "time_created_ns", "input_sizes", "input_dtypes", "output_sizes",
              "output_dtypes", "state", "time_discovered_started_ns", "time_discovered_completed_ns", "retired",
              "timeout_ms", "is_p2p"}


def _written_subset() -> list[Scenario]:
    """Every 8-rank scenario (they cover every kind, format and position); of the 16-rank ones the
    first of every (layout, format) and the first absent-dump one; one 64-rank scenario. Writing
    all 97 takes 15-20 s (set FR_SCENARIOS_ALL=1 to check them all)."""
    if os.environ.get("FR_SCENARIOS_ALL"):
        return scenarios()
    chosen, seen = [], set()
    for s in scenarios():
        if s.world == 8:
            take = True
        elif s.world == 16:
            take = (s.layout, s.fmt) not in seen or (s.culprit_dump == "absent" and "w16-absent" not in seen)
        else:
            take = "w64" not in seen
        if take:
            chosen.append(s)
            seen.update({(s.layout, s.fmt), "w64" if s.world == 64 else "",
                         "w16-absent" if s.world == 16 and s.culprit_dump == "absent" else ""})
    return chosen


def _load(path: Path, fmt: str) -> dict:
    if fmt == "json":
        return json.loads(path.read_text())
    return pickle.loads(path.read_bytes())


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, tuple[Scenario, dict[int, dict]]]:
    root = tmp_path_factory.mktemp("fr_scenarios")
    out = {}
    for s in _written_subset():
        directory = write_scenario(s, root / s.name)
        docs = {int(p.name[len("rank_"):]): _load(p, s.fmt) for p in directory.iterdir()}
        out[s.name] = (s, docs)
    return out


def test_matrix_size_and_unique_names():
    names = [s.name for s in scenarios()]
    assert len(names) >= 60
    assert len(names) == len(set(names))
    assert scenarios() == scenarios()          # deterministic


def test_every_kind_appears_and_kinds_are_known():
    kinds = {s.expected.kind for s in scenarios()}
    assert set(KINDS) <= kinds
    assert kinds - {None} <= set(KINDS)


def test_every_layout_has_a_healthy_case_in_every_format():
    have = {(s.layout, s.fmt) for s in scenarios() if s.expected.kind is None}
    assert have == {(layout, fmt) for layout in LAYOUTS for fmt in FORMATS}
    # including a healthy pipeline job with p2p, a mid-flight snapshot and unevenly wrapped buffers
    faults = {(s.fault, s.fmt) for s in scenarios() if s.expected.kind is None and "pp" in s.layout}
    assert ("healthy", "pickle") in faults
    assert {s.fault for s in scenarios() if s.expected.kind is None} >= {
        "healthy", "healthy_midflight", "healthy_wrapped", "healthy_noise"}


def test_expected_is_consistent():
    for s in scenarios():
        e = s.expected
        assert s.fmt in FORMATS and s.position in ("inflight", "older", "-") and s.culprit_dump in ("present", "absent")
        assert s.name.startswith(f"{s.layout}__{s.fault}__{s.position}__{s.fmt}__{s.culprit_dump}")
        assert s.world == LAYOUTS[s.layout][0]
        assert e.note and "\n" not in e.note
        assert all(0 <= c < s.world for c in e.culprits)
        assert list(e.culprits) == sorted(set(e.culprits))
        if e.kind is None:
            assert e.culprits == () and s.position == "-" and s.culprit_dump == "present"
        else:
            assert e.culprits, s.name
        if e.kind in NCCL_ONLY or s.fault in NCCL_ONLY:
            assert s.fmt != "gloo", s.name
        if s.fault == "missing_dump":
            assert s.culprit_dump == "absent" and e.kind == "missing_dump"
        if e.kind == "deadlock":
            assert len(e.culprits) >= 2
        if e.group_desc is not None:
            assert e.group_desc in ("tp", "pp", "dp", "default_pg")
    # culprits at both ends of the rank range, and faults inside 2-rank groups
    assert any(s.expected.culprits == (0,) for s in scenarios())
    assert any(s.expected.culprits == (s.world - 1,) for s in scenarios())
    two_rank = [s for s in scenarios() if s.expected.kind not in (None, "straggler", "deadlock")
                and (s.expected.group_desc == "pp" or (s.expected.group_desc == "tp" and "tp2" in s.layout))]
    assert len(two_rank) >= 10


def test_written_dumps_parse_and_have_the_torch_shape(written):
    for name, (s, docs) in written.items():
        expected_ranks = set(range(s.world))
        if s.culprit_dump == "absent":
            assert len(s.expected.culprits) == 1
            expected_ranks -= set(s.expected.culprits)
        assert set(docs) == expected_ranks, name
        for r, doc in docs.items():
            assert doc["version"] == "2.10"
            assert {"pg_config", "pg_status", "entries", "comm_lib_version"} <= set(doc)
            entries = doc["entries"]
            assert entries, (name, r)
            ids = [e["record_id"] for e in entries]
            assert ids == sorted(ids) and len(set(ids)) == len(ids)
            for e in entries:
                assert ENTRY_KEYS <= set(e), (name, r)
                assert e["state"] in ("scheduled", "started", "completed")
                assert e["profiling_name"].startswith("gloo:" if s.fmt == "gloo" else "nccl:")
                if s.fmt == "json":
                    assert isinstance(e["process_group"], list) and "frames" not in e
                    assert e["time_discovered_started_ns"] is not None
                else:
                    assert isinstance(e["process_group"], tuple) and e["frames"]
            if s.fmt == "gloo":
                assert all(e["state"] == "scheduled" for e in entries)
                assert not any(e["is_p2p"] for e in entries)
                assert all(e["time_discovered_started_ns"] is None for e in entries)
            else:
                for name_, cfg in doc["pg_config"].items():
                    assert cfg["name"] == name_ and json.loads(cfg["ranks"])
            if s.fmt == "json":
                assert all(isinstance(v, str) for st in doc["pg_status"].values() for v in st.values())


def _by_group(docs: dict[int, dict]) -> dict[str, dict[int, dict[int, dict]]]:
    """pg name -> rank -> collective_seq_id -> entry (collectives only)."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for r, doc in docs.items():
        for e in doc["entries"]:
            if not e["is_p2p"]:
                out[e["process_group"][0]][r][e["collective_seq_id"]] = e
    return out


def test_healthy_groups_agree_on_every_collective(written):
    checked = 0
    for name, (s, docs) in written.items():
        if s.expected.kind is not None and s.expected.kind != "straggler":
            continue
        for group, ranks in _by_group(docs).items():
            members = list(ranks)
            common = set.intersection(*(set(ranks[m]) for m in members))
            for seq in common:
                shapes = {(ranks[m][seq]["profiling_name"], json.dumps(ranks[m][seq]["input_sizes"]),
                           json.dumps(ranks[m][seq]["output_sizes"]), tuple(ranks[m][seq]["input_dtypes"]))
                          for m in members}
                assert len(shapes) == 1, (name, group, seq, shapes)
                checked += 1
            if s.fmt != "gloo" and s.fault != "healthy_midflight":
                states = {e["state"] for m in members for e in ranks[m].values()}
                assert states == {"completed"}, (name, group, states)
    assert checked > 1000


def test_healthy_wrapped_buffers_wrap_unevenly(written):
    for name, (s, docs) in written.items():
        if s.fault == "healthy_wrapped":
            firsts = {doc["entries"][0]["record_id"] for doc in docs.values()}
            assert len(firsts) > 1 and min(firsts) > 0, name


def test_mismatches_are_visible_in_every_format(written):
    """At the root cause seq the culprit's op differs from its peers' (also on gloo, which records
    reduce-scatter as all-reduce)."""
    checked = 0
    for name, (s, docs) in written.items():
        e = s.expected
        if e.kind not in ("type_mismatch", "size_mismatch", "dtype_mismatch") or s.culprit_dump == "absent":
            continue
        seen = {}
        for r, doc in docs.items():
            for x in doc["entries"]:
                if x["process_group"][1] == e.group_desc and x["collective_seq_id"] == e.seq and not x["is_p2p"]:
                    seen.setdefault(x["process_group"][0], {})[r] = (
                        x["profiling_name"], json.dumps(x["input_sizes"]), json.dumps(x["output_sizes"]),
                        tuple(x["input_dtypes"]))
        group = next(g for g, ranks in seen.items() if e.culprits[0] in ranks)
        mine = seen[group].pop(e.culprits[0])
        assert seen[group] and all(other != mine for other in seen[group].values()), name
        checked += 1
    assert checked >= 5


def test_faults_are_where_the_ground_truth_says(written):
    """NCCL dumps: an in-flight root cause is not completed on the culprit, an older one is; p2p
    and state faults show the documented states."""
    for name, (s, docs) in written.items():
        e = s.expected
        if s.fmt == "gloo" or s.culprit_dump == "absent" or e.kind in (None, "straggler", "deadlock"):
            continue
        if e.kind in ("skipped_collective",):
            continue   # the culprit has no entry at that seq (or a shifted one)
        culprit = docs[e.culprits[0]]["entries"]
        seq_key = "p2p_seq_id" if e.group_desc == "pp" else "collective_seq_id"
        at = [x for x in culprit if x["process_group"][1] == e.group_desc and x[seq_key] == e.seq
              and x["is_p2p"] == (e.group_desc == "pp")]
        if e.kind == "p2p_unmatched":
            assert at, name         # the culprit's own p2p at that seq is some other op
            continue
        assert len(at) == 1, (name, at)
        if s.position == "older":
            assert at[0]["state"] == "completed", name
        else:
            assert at[0]["state"] != "completed", name
        if e.kind in ("stuck_in_collective", "state_mismatch"):
            assert at[0]["state"] == "started"
            peers = [r for r in docs if r != e.culprits[0]]
            done = [x for r in peers for x in docs[r]["entries"] if x["process_group"][1] == e.group_desc
                    and x["collective_seq_id"] == e.seq and x["state"] == "completed"]
            assert done, name


def test_absent_dump_cases_have_no_file_for_the_culprit(tmp_path):
    absent = [s for s in scenarios() if s.culprit_dump == "absent" and s.world <= 16]
    assert absent
    s = absent[0]
    write_scenario(s, tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert f"rank_{s.expected.culprits[0]}" not in names
    assert len(names) == s.world - 1
