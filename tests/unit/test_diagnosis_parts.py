"""The diagnosis's parts, each on small hand-made input: op names, the two conversions, periods,
tie-breaking evidence, the wait-for graph, p2p pairing, stragglers, shifted stretches, group
inference and the text rendering."""

from __future__ import annotations

import numpy as np
import pytest

from rankstream.flows.diagnosis.calls import collective_calls
from rankstream.flows.diagnosis.columnar import entry_table, from_entry_tables
from rankstream.flows.diagnosis.engine import diagnose
from rankstream.flows.diagnosis.entries import Vocabulary, concatenate, from_dump_entries, parse_op, recoded
from rankstream.flows.diagnosis.groups import find_groups
from rankstream.flows.diagnosis.origin import shift_origin
from rankstream.flows.diagnosis.p2p import unmatched_p2p
from rankstream.flows.diagnosis.render import rank_ranges, render_text
from rankstream.flows.diagnosis.report import Report
from rankstream.flows.diagnosis.sequences import period_of
from rankstream.flows.diagnosis.stragglers import find_stragglers
from rankstream.flows.diagnosis.waits import Edge, Position, WaitGraph


def entry(record, group, seq, op, size=8, state="completed", created=0, dtype="Float", p2p_seq=0):
    return {"record_id": record, "process_group": group, "collective_seq_id": seq, "p2p_seq_id": p2p_seq,
            "profiling_name": f"nccl:{op}", "input_sizes": [[size]], "output_sizes": [[size]],
            "input_dtypes": [dtype], "output_dtypes": [dtype], "state": state, "time_created_ns": created,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None}


def job(programs: dict[int, list[tuple]], group=("0", "default_pg")) -> tuple:
    """Entries of ranks whose calls are ``(op, size, state, created)`` tuples in one group."""
    vocabulary, parts = Vocabulary(), []
    for rank, calls in programs.items():
        rows = [entry(i, group, i + 1, *call) for i, call in enumerate(calls)]
        parts.append(from_dump_entries(rows, rank, {}, vocabulary=vocabulary))
    return concatenate(parts, vocabulary), sorted(programs)


def from_dump_entries_arrow(rows, rank, members, *, vocabulary):
    """One dump through the Arrow conversion, as the reader converts a batch of one."""
    return from_entry_tables([entry_table(rows)], [rank], members, vocabulary=vocabulary)


def test_op_names_and_p2p_peers():
    assert parse_op("nccl:all_reduce") == ("all_reduce", -1, -1)
    assert parse_op("nccl:send 0->1") == ("send", 0, 1)
    assert parse_op("gloo:recv 1<-0") == ("recv", 0, 1)
    assert parse_op("nccl:send x->y") == ("send", -1, -1)


def test_the_arrow_conversion_gives_the_python_conversion_s_columns():
    rows = [entry(i, ("3", "tp"), i + 1, op, size, state) for i, (op, size, state) in
            enumerate([("all_reduce", 8, "completed"), ("broadcast", 4, "started"), ("all_reduce", 8, "scheduled")])]
    rows.append({**entry(3, ("4", "pp"), 0, "send 0->1", p2p_seq=1), "profiling_name": "nccl:send 0->1"})
    one, other = Vocabulary(), Vocabulary()
    python = recoded(from_dump_entries(rows, 2, {"4": [2, 6]}, vocabulary=one), Vocabulary())
    arrow = recoded(from_dump_entries_arrow(rows, 2, {"4": [2, 6]}, vocabulary=other), Vocabulary())
    for name in ("seq", "p2p_seq", "is_p2p", "peer", "state", "record"):
        assert np.array_equal(getattr(python, name), getattr(arrow, name)), name
    for name, kind in (("group", "groups"), ("op", "ops"), ("shape", "shapes"), ("dtype", "dtypes")):
        def texts(entries):
            return [entries.vocabulary.text(kind, c) for c in getattr(entries, name).tolist()]
        assert texts(python) == texts(arrow), name  # the same values (codes are each table's own)
    assert arrow.peer.tolist()[-1] == 6  # group-local 1 is global rank 6


def test_dumps_converted_together_give_each_dump_s_own_columns():
    dumps = {rank: [entry(i, ("3", "tp"), i + 1, op, size) for i, (op, size) in enumerate(calls)]
             for rank, calls in {0: [("all_reduce", 8), ("broadcast", 4)], 5: [("all_gather", 2)],
                                 7: [("all_reduce", 8), ("all_reduce", 16), ("broadcast", 4)]}.items()}
    together = from_entry_tables([entry_table(rows) for rows in dumps.values()], list(dumps), {}, vocabulary=Vocabulary())
    one_by_one = Vocabulary()
    apart = concatenate([from_dump_entries_arrow(rows, rank, {}, vocabulary=one_by_one) for rank, rows in dumps.items()],
                        one_by_one)
    assert together.rank.tolist() == [0, 0, 5, 7, 7, 7]
    for name in ("seq", "record", "state"):
        assert getattr(together, name).tolist() == getattr(apart, name).tolist(), name
    for name, kind in (("op", "ops"), ("shape", "shapes"), ("group", "groups")):
        assert [together.vocabulary.text(kind, c) for c in getattr(together, name).tolist()] == \
            [apart.vocabulary.text(kind, c) for c in getattr(apart, name).tolist()], name


def test_a_period_predicts_the_next_call():
    assert period_of({1: 5, 2: 6, 3: 5, 4: 6, 5: 5, 6: 6}) == 2
    assert period_of({1: 5, 2: 6, 3: 7}) is None


def test_a_two_rank_tie_is_broken_by_the_group_s_history():
    pattern = [("all_gather", 8), ("reduce_scatter", 8)] * 6
    bad = pattern[:-1] + [("broadcast", 8)]
    entries, dumped = job({0: pattern, 1: bad})
    [finding] = diagnose(entries, listed={}, dumped=dumped).findings
    assert (finding.kind, finding.culprit_ranks, finding.seq) == ("type_mismatch", [1], 12)
    assert any("period" in line for line in finding.evidence)


def test_a_tie_without_evidence_says_undetermined_and_why():
    entries, dumped = job({0: [("all_reduce", 8)], 1: [("broadcast", 8)]})
    [finding] = diagnose(entries, listed={}, dumped=dumped).findings
    assert finding.culprit_ranks == [] and "undetermined between ranks 0, 1" in finding.culprit_reason
    assert finding.headline().startswith("ranks 0, 1 disagree on the collective of #1 (all_reduce / broadcast) "
                                         "in group default_pg (pg 0); culprit undetermined between ranks 0, 1")


def test_cycles_sinks_and_upstream_of_the_wait_for_graph():
    graph = WaitGraph()
    for waiter, target in ((0, 1), (1, 2), (2, 1), (3, 4), (5, 0)):
        graph.add(Edge(Position(waiter, 0, 1), target, "absent"))
    assert graph.cycles() == [[1, 2]]
    assert graph.sinks() == [4]
    assert graph.upstream({1}) == {0, 2, 5}


def test_an_unfinished_send_without_its_receive_waits_for_the_receiver():
    vocabulary = Vocabulary()
    sender = [entry(0, ("9", "pp"), 0, "send 0->1", state="started", p2p_seq=1)]
    receiver = [entry(0, ("9", "pp"), 0, "recv 1<-0", state="completed", p2p_seq=1)]
    entries = concatenate([from_dump_entries(sender, 4, {"9": [4, 5]}, vocabulary=vocabulary),
                           from_dump_entries(receiver, 5, {"9": [4, 5]}, vocabulary=vocabulary)], vocabulary)
    [gap] = unmatched_p2p(entries)
    assert (gap.waiter, gap.peer, gap.op, gap.p2p_seq) == (4, 5, "send", 1)


def test_stragglers_need_lateness_beyond_the_noise():
    rng = np.random.default_rng(0)
    def run(late_ms, noise_ms, ranks=4, steps=40, late_rank=2):
        programs = {r: [("all_reduce", 8, "completed", int(1e9 + s * 1e8 + rng.normal(0, noise_ms) * 1e6
                                                          + (late_ms * 1e6 if r == late_rank else 0)))
                        for s in range(steps)] for r in range(ranks)}
        entries, dumped = job(programs)
        return find_stragglers(collective_calls(entries), {0: ranks})
    assert [s.rank for s in run(late_ms=20, noise_ms=0.1)] == [2]
    assert run(late_ms=0, noise_ms=3) == []
    assert run(late_ms=0.3, noise_ms=0.05, ranks=2) == []  # a pair where one is always a little later
    pair = dict(late_ms=20, noise_ms=0.5, ranks=2, late_rank=1)
    assert [s.rank for s in run(**pair, steps=30)] == [1]
    assert run(**pair, steps=12) == []  # too few collectives to know the noise


def timed_job(*, late_rank: int | None, clock_ms: dict[int, float], completions: bool = True, ranks: int = 8,
              steps: int = 40, late_ms: float = 20.0) -> list:
    """Collectives in true time: every rank arrives 100 ms after the previous one completed (the
    late rank ``late_ms`` later still), each completes 2 ms after its last member arrives; every
    time is then read on its rank's clock, ``clock_ms`` ahead of true time."""
    rng = np.random.default_rng(1)
    vocabulary, parts, rows = Vocabulary(), [], {r: [] for r in range(ranks)}
    released = 1e9
    for step in range(steps):
        arrive = {r: released + 100e6 + rng.uniform(0, 0.2e6) + (late_ms * 1e6 if r == late_rank else 0)
                  for r in range(ranks)}
        released = max(arrive.values()) + 2e6
        for r in range(ranks):
            clock = clock_ms.get(r, 0) * 1e6
            row = entry(step, ("0", "default_pg"), step + 1, "all_reduce", created=int(arrive[r] + clock))
            row["time_discovered_completed_ns"] = int(released + clock) if completions else None
            rows[r].append(row)
    for rank, mine in rows.items():
        parts.append(from_dump_entries(mine, rank, {}, vocabulary=vocabulary))
    return find_stragglers(collective_calls(concatenate(parts, vocabulary)), {0: ranks})


def test_a_rank_whose_host_clock_runs_ahead_is_no_straggler_but_a_late_one_beside_it_is():
    """Creation times alone cannot tell the two apart; each rank's wait to completion, on its own
    clock, can: a straggler waits less than its peers, a rank whose clock is ahead as long."""
    assert timed_job(late_rank=None, clock_ms={5: 20.0}) == []
    assert timed_job(late_rank=None, clock_ms={r: 20.0 for r in range(4, 8)}) == []  # a second host
    for clocks in ({}, {5: 20.0}):
        [straggler] = timed_job(late_rank=2, clock_ms=clocks)
        assert straggler.rank == 2 and straggler.confirmed and 19e6 < straggler.shortfall_ns < 21e6
    # without completion times the lateness stands, and nothing claims it was checked
    [unchecked] = timed_job(late_rank=None, clock_ms={5: 20.0}, completions=False)
    assert (unchecked.rank, unchecked.confirmed, unchecked.shortfall_ns) == (5, None, None)


def test_a_shifted_stretch_is_found_where_it_began():
    vocabulary = Vocabulary()
    def program(rank, skip, tensor_parallel=True):
        rows, record, dp_seq = [], 0, 0
        for step in range(6):
            if tensor_parallel:
                rows.append(entry(record, ("1", "tp"), step + 1, "all_gather"))
                record += 1
            for bucket in range(2):
                if skip and step == 3 and bucket == 0:
                    continue
                dp_seq += 1
                rows.append(entry(record, ("2", "dp"), dp_seq, "all_reduce"))
                record += 1
        return from_dump_entries(rows, rank, {}, vocabulary=vocabulary)
    entries = concatenate([program(0, False), program(1, True), program(2, False, tensor_parallel=False)],
                          vocabulary)
    calls = collective_calls(entries)
    dp = vocabulary.groups.index(("2", "dp"))
    roles = {code: desc for code, (_, desc) in enumerate(vocabulary.groups)}
    assert shift_origin(calls, 1, dp, peers=[0], before=20, roles=roles) == (7, 7)
    assert shift_origin(calls, 0, dp, peers=[0], before=20, roles=roles) is None
    # rank 2 plays no tensor-parallel role: its peer's all_gathers between the all_reduces are no
    # part of its program, so nothing in its calls is shifted
    assert shift_origin(calls, 2, dp, peers=[0], before=20, roles=roles) is None


def test_entries_a_ring_overwrote_before_they_were_read_are_no_shifted_stretch():
    """A wrapped ring read too late loses a stretch of entries: the calls on either side of the
    hole are not consecutive, and what the rank did between them is unknown (live probe: a hole
    of eight steps was read as a skip at its far edge, which named call #19 instead of #36)."""
    vocabulary = Vocabulary()
    def program(rank, lost):
        rows, record = [], 0
        for step in range(12):
            for group, op in ((("1", "tp"), "all_gather"), (("2", "dp"), "all_reduce")):
                if not (lost[0] <= record < lost[1]):
                    rows.append(entry(record, group, step + 1, op))
                record += 1
        return from_dump_entries(rows, rank, {}, vocabulary=vocabulary)
    # rank 1's hole ends between a step's two calls; rank 0's ends at a step's first
    entries = concatenate([program(0, (4, 10)), program(1, (6, 13))], vocabulary)
    calls = collective_calls(entries)
    dp = vocabulary.groups.index(("2", "dp"))
    roles = {code: desc for code, (_, desc) in enumerate(vocabulary.groups)}
    assert shift_origin(calls, 1, dp, peers=[0], before=20, roles=roles) is None


def test_a_group_nobody_listed_gets_the_member_that_left_no_dump():
    vocabulary, parts = Vocabulary(), []
    for rank in (0, 1, 2, 4):  # rank 3 left no dump; its pair (2, 3) logged only rank 2
        rows = [entry(0, (str(10 + rank // 2), "tp"), 1, "all_gather")]
        parts.append(from_dump_entries(rows, rank, {}, vocabulary=vocabulary))
    parts.append(from_dump_entries([entry(0, ("12", "tp"), 1, "all_gather")], 5, {}, vocabulary=vocabulary))
    groups, world = find_groups(concatenate(parts, vocabulary), {"0": list(range(6))}, [0, 1, 2, 4, 5])
    assert world == 6
    assert {g.name: g.members for g in groups.values()}["11"] == (2, 3)


def test_rank_ranges_and_the_text_stays_within_120_columns():
    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    entries, dumped = job({r: [("all_reduce", 8)] * 3 + [("all_reduce", 8 if r != 37 else 4)] for r in range(64)})
    lines = render_text(Report("run", diagnose(entries, listed={}, dumped=dumped)))
    assert lines[0][0].startswith("DESYNC: root cause: rank 37 used other tensor sizes")
    assert all(len(line) <= 120 for line, _ in lines)


@pytest.mark.parametrize("states,kind", [(("started", "completed"), "stuck_in_collective")])
def test_a_rank_still_in_a_collective_its_peers_completed_is_stuck(states, kind):
    programs = {0: [("all_reduce", 8, "completed"), ("all_reduce", 8, states[0])],
                1: [("all_reduce", 8, "completed"), ("all_reduce", 8, states[1])]}
    entries, dumped = job(programs)
    root = diagnose(entries, listed={}, dumped=dumped).root
    assert (root.kind, root.culprit_ranks, root.seq) == (kind, [0], 2)


def test_calls_sort_the_entries_in_place_without_changing_any_row():
    entries, _ = job({0: [("all_reduce",), ("broadcast", 4)], 1: [("all_reduce",), ("broadcast", 4)]})
    p2p = from_dump_entries([entry(9, ("0", "default_pg"), 0, "send 0->1", p2p_seq=1)], 0, {"0": [0, 1]},
                            vocabulary=entries.vocabulary)
    entries = concatenate([entries, p2p], entries.vocabulary)
    rows_before = sorted(zip(entries.rank.tolist(), entries.record.tolist(), entries.seq.tolist(), entries.op.tolist()))
    calls = collective_calls(entries)
    assert sorted(zip(entries.rank.tolist(), entries.record.tolist(), entries.seq.tolist(),
                      entries.op.tolist())) == rows_before
    assert (calls.group.tolist(), calls.seq.tolist(), calls.rank.tolist()) == ([0] * 4, [1, 1, 2, 2], [0, 1, 0, 1])
    assert calls.rank.base is not None  # a view of the sorted entries, not a copy
    assert entries.is_p2p.tolist()[-1]  # the send is not a call: it sorts after them


def test_sequence_numbers_stay_64_bit_when_they_do_not_fit_in_32():
    big = 2**40
    vocabulary = Vocabulary()
    small = from_dump_entries([entry(0, ("0", "default_pg"), 5, "all_reduce")], 0, {}, vocabulary=vocabulary)
    large = from_dump_entries([entry(0, ("0", "default_pg"), big, "all_reduce")], 1, {}, vocabulary=vocabulary)
    assert small.seq.dtype == np.int32 and large.seq.dtype == np.int64
    assert concatenate([small, large], vocabulary).seq.tolist() == [5, big]


@pytest.mark.parametrize("dumped_after_ms", [4, 20 * 60 * 1000, None])
def test_a_finding_says_how_long_its_waiting_rank_had_been_inside_the_call_when_it_dumped(tmp_path, dumped_after_ms):
    """torch stamps a call it finds started when it dumps: rank 0 waits in all_reduce #3, which rank 1
    never reached. A dump 20 minutes on (a timeout) and one 4 ms on (taken while the job ran) differ
    only by that stamp. Without it (a dump whose newest time is not the stamp) nothing is claimed."""
    import pickle

    from rankstream.flows.diagnosis.report import diagnose_directory

    start = 1_700_000_000_000_000_000
    rows = {rank: [entry(i, ("0", "default_pg"), i + 1, "all_reduce", created=start + i * 10**6) for i in range(2)]
            for rank in (0, 1)}
    waiting = entry(2, ("0", "default_pg"), 3, "all_reduce", state="started", created=start + 3 * 10**6)
    waiting["time_discovered_started_ns"] = start + 3 * 10**6 + (dumped_after_ms or 1) * 10**6
    rows[0].append(waiting)
    if dumped_after_ms is None:  # a later call created after the stamp: the stamp is not the dump's moment
        rows[0].append(entry(3, ("0", "default_pg"), 4, "all_reduce", state="scheduled", created=start + 9 * 10**6))
    for rank, entries in rows.items():
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps({"version": "2.10", "entries": entries}))
    root = diagnose_directory(tmp_path, prefix="rank_").diagnosis.root
    assert root.culprit_ranks == [1]
    told = [line for line in root.evidence if "before it wrote its dump" in line]
    if dumped_after_ms is None:
        assert told == []
    elif dumped_after_ms == 4:
        assert told and told[0].startswith("rank 0 enqueued #3 4.0 ms before") and "under a second" in told[0]
    else:
        assert told and told[0].startswith("rank 0 enqueued #3 1,200.0 s before") and "under a second" not in told[0]


def test_the_stack_files_written_beside_dumps_say_where_a_rank_that_went_nowhere_is(tmp_path):
    """``run --on-hang dump`` writes each rank's ``faulthandler`` stacks beside its dump: rank 1,
    which never issued all_reduce #3, sat in its data loader, and the offline diagnosis says so as
    the live one does (it said "nothing shows where rank 1 went instead")."""
    import pickle

    from rankstream.flows.diagnosis.report import diagnose_directory

    rows = {rank: [entry(i, ("0", "default_pg"), i + 1, "all_reduce") for i in range(2)] for rank in (0, 1)}
    rows[0].append(entry(2, ("0", "default_pg"), 3, "all_reduce", state="started"))
    for rank, entries in rows.items():
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps({"version": "2.10", "entries": entries}))
    (tmp_path / "stacks_rank1.txt").write_text(
        'Thread 0x00007f1e827fc6c0 (most recent call first):\n'
        '  File "/usr/lib/python3.11/threading.py", line 982 in run\n'
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
        'Thread 0x00007f1e837fe6c0 (most recent call first):\n'
        '  File "/usr/lib/python3.11/queue.py", line 171 in get\n'
        '  File "/job/train.py", line 41 in load_batch\n'
        '  File "/job/train.py", line 77 in <module>\n'
        '  File "<frozen runpy>", line 88 in _run_code\n')
    root = diagnose_directory(tmp_path, prefix="rank_").diagnosis.root
    assert (root.kind, root.culprit_ranks) == ("skipped_collective", [1])
    assert root.actual == {"stalled_at": "queue.py:171 in get, from train.py:41"}, root.evidence
