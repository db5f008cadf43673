"""Layouts an adversarial probe found the diagnosis misread: pipelines that batch their sends and
receives, coalesced calls cut by a wrapped ring buffer, a stuck rank that enqueued more, and a
gather's root, which alone lists the gathered outputs.

Each rank's program is a list of entries written in record order, the way torch's Flight
Recorder writes them for NCCL; ``ring`` keeps only a rank's newest entries, as a wrapped ring does.
"""

from __future__ import annotations

import duckdb
import pytest

from rankstream.consumers.query import Database
from rankstream.consumers.store import apply_schema
from rankstream.flows.diagnosis.columnar import entry_table, from_entry_tables
from rankstream.flows.diagnosis.engine import diagnose
from rankstream.flows.diagnosis.entries import Vocabulary, concatenate, from_dump_entries
from rankstream.flows.diagnosis.report import diagnose_stored
from tests.diagnosis.storing import store_dumps

GROUP = ("0", "default_pg")


class Program:
    """One rank's entries, numbered as torch numbers them (collective and p2p sequence numbers)."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.seq = self.p2p_seq = 0

    def _add(self, name: str, state: str, size: int = 8) -> None:
        self.entries.append({
            "record_id": len(self.entries), "process_group": GROUP, "collective_seq_id": self.seq,
            "p2p_seq_id": self.p2p_seq, "profiling_name": f"nccl:{name}", "input_sizes": [[size]],
            "output_sizes": [[size]], "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": state,
            "time_created_ns": 0, "time_discovered_started_ns": None, "time_discovered_completed_ns": None})

    def collective(self, op: str = "all_reduce", state: str = "completed") -> None:
        self.seq += 1
        self._add(op, state)

    def coalesced(self, members: int, state: str = "completed", *, as_torch: bool = False) -> None:
        """Several all_reduces issued as one call: they share a collective number, then a close.
        ``as_torch``: the members are recorded without events, as torch records them, so they stay
        scheduled whatever the close's state."""
        self.seq += 1
        for _ in range(members):
            self._add("all_reduce", "scheduled" if as_torch else state)
        self._add("coalesced", state, size=0)

    def send_recv(self, ops: list[str], states: list[str] | None = None, size: int = 8) -> None:
        """Sends and receives posted one at a time: each has its own p2p number."""
        for op, state in zip(ops, states or ["completed"] * len(ops)):
            self.p2p_seq += 1
            self._add(op, state, size)

    def batch_p2p(self, ops: list[str], state: str = "completed", *, as_torch: bool = False) -> None:
        """``batch_isend_irecv``: the sends and receives share a p2p number, then a close that
        carries it and the group's current collective number (``as_torch``: see ``coalesced``)."""
        self.p2p_seq += 1
        for op in ops:
            self._add(op, "scheduled" if as_torch else state)
        self._add("coalesced", state, size=0)


def diagnosis(programs: dict[int, Program], ring: dict[int, int] | None = None):
    vocabulary, parts = Vocabulary(), []
    members = {GROUP[0]: sorted(programs)}
    for rank, program in programs.items():
        kept = program.entries[-(ring or {}).get(rank, len(program.entries)):]
        parts.append(from_dump_entries(kept, rank, members, vocabulary=vocabulary))
    return diagnose(concatenate(parts, vocabulary), listed=members, dumped=sorted(programs))


def pipeline(steps: int, *, bystander: bool = False, last_step_recv: bool = True) -> dict[int, Program]:
    """Two pipeline stages that all_reduce, then pass activations with ``batch_isend_irecv``; with
    ``bystander``, a third rank of the group that only takes part in the collectives."""
    ranks = [0, 1, 2] if bystander else [0, 1]
    programs = {rank: Program() for rank in ranks}
    for step in range(steps):
        last = step == steps - 1
        for rank in ranks:
            programs[rank].collective()
        programs[0].batch_p2p(["send 0->1"], state="started" if last and not last_step_recv else "completed")
        if last_step_recv or not last:
            programs[1].batch_p2p(["recv 1<-0"])
    return programs


def test_a_healthy_pipeline_that_batches_its_sends_is_healthy():
    assert diagnosis(pipeline(10)).findings == []
    # the close of a batch used to join the all_reduce of its collective number as a member:
    # a rank that only all_reduces then looked desynced
    assert diagnosis(pipeline(10, bystander=True)).findings == []


def test_a_receive_batch_never_posted_is_the_root_cause():
    root = diagnosis(pipeline(10, last_step_recv=False)).root
    assert (root.kind, root.culprit_ranks) == ("p2p_unmatched", [1])


def coalesced_job(steps: int) -> dict[int, Program]:
    programs = {rank: Program() for rank in range(4)}
    for _ in range(steps):
        for program in programs.values():
            program.coalesced(3)
            program.collective()
    return programs


def test_a_coalesced_call_cut_by_a_wrapped_ring_is_not_a_desync():
    programs = coalesced_job(10)
    # rank 1's ring kept the last 13 entries: its oldest call has lost two of its three members
    assert diagnosis(programs, ring={1: 13, 2: 15, 3: 20}).findings == []


def test_a_coalesced_call_that_really_differs_is_still_found():
    programs = coalesced_job(10)
    programs[2].entries[-5:-1] = programs[2].entries[-4:-1]  # the last block lost a member on rank 2
    for record, entry in enumerate(programs[2].entries):
        entry["record_id"] = record
    root = diagnosis(programs, ring={1: 13}).root
    assert (root.kind, root.culprit_ranks) == ("type_mismatch", [2])


def test_a_stuck_rank_that_enqueued_more_calls_is_one_finding_naming_the_call():
    programs = {rank: Program() for rank in range(4)}
    for step in range(5):
        for rank, program in programs.items():
            program.collective(state="started" if (rank == 2 and step == 3) else
                               "scheduled" if (rank == 2 and step == 4) else
                               "started" if step == 4 else "completed")
    result = diagnosis(programs)
    assert [f.culprit_ranks for f in result.findings] == [[2]]
    assert "all_reduce #4" in result.root.headline() and "completed #" not in result.root.headline()


def exchanges(rounds: int) -> dict[int, Program]:
    """Two ranks that trade activations: rank 0 sends then receives, rank 1 the reverse."""
    programs = {0: Program(), 1: Program()}
    for _ in range(rounds):
        programs[0].send_recv(["send 0->1", "recv 0<-1"])
        programs[1].send_recv(["recv 1<-0", "send 1->0"])
    return programs


def test_both_ranks_receiving_first_is_a_deadlock():
    # each receive pairs with a send the peer posted, so pairing by count saw nothing wrong
    programs = exchanges(5)
    programs[0].send_recv(["recv 0<-1", "send 0->1"], states=["started", "scheduled"])
    programs[1].send_recv(["recv 1<-0", "send 1->0"], states=["started", "scheduled"])
    root = diagnosis(programs).root
    assert (root.kind, sorted(root.culprit_ranks)) == ("deadlock", [0, 1])


def test_a_receive_of_other_sizes_than_its_send_is_named_from_the_history():
    programs = exchanges(5)
    programs[0].send_recv(["send 0->1"], states=["started"])
    programs[1].send_recv(["recv 1<-0"], states=["started"], size=16)
    root = diagnosis(programs).root
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("size_mismatch", [1], [0])
    assert root.headline().startswith("rank 1 used other tensor sizes in recv #")


def gather_job(steps: int, *, skip_rank: int | None = None, half_rank: int | None = None) -> dict[int, list[dict]]:
    """Four ranks that gather to rank 0, then scatter from it, each step, as torch records them:
    only the gather's root lists outputs, only the scatter's root inputs. ``skip_rank`` skips
    the last step's gather; ``half_rank`` gathers Half tensors in it."""
    entries: dict[int, list[dict]] = {rank: [] for rank in range(4)}
    for rank, rows in entries.items():
        root = rank == 0
        calls = []
        for step in range(steps):
            last = step == steps - 1
            dtype = "Half" if last and rank == half_rank else "Float"
            if not (last and rank == skip_rank):
                calls.append(("gather", [[64]], [[4, 64]] if root else [], [dtype], [dtype] if root else []))
            calls.append(("scatter", [[4, 64]] if root else [], [[64]], ["Float"] if root else [], ["Float"]))
        for seq, (op, inputs, outputs, in_dtypes, out_dtypes) in enumerate(calls, start=1):
            stuck = seq > len(calls) - (2 if skip_rank is not None else 0)
            rows.append({"record_id": seq - 1, "process_group": GROUP, "collective_seq_id": seq, "p2p_seq_id": 0,
                         "profiling_name": f"nccl:{op}", "input_sizes": inputs, "output_sizes": outputs,
                         "input_dtypes": in_dtypes, "output_dtypes": out_dtypes,
                         "state": "started" if stuck else "completed", "time_created_ns": seq * 1000,
                         "time_discovered_started_ns": None, "time_discovered_completed_ns": None})
    return entries


def diagnose_through(door: str, entries: dict[int, list[dict]]):
    """The diagnosis of the same dumps through one of its doors: the raw entries, Arrow (the
    loader's fast path for torch's types) or the stored run."""
    members = {GROUP[0]: sorted(entries)}
    if door == "stored":
        con = duckdb.connect()
        apply_schema(con)
        pg_config = {GROUP[0]: {"name": GROUP[0], "desc": GROUP[1], "ranks": sorted(entries)}}
        store_dumps(con, {rank: {"entries": rows, "pg_config": pg_config} for rank, rows in entries.items()})
        return diagnose_stored(Database.over(con, "layouts"), "run").diagnosis
    vocabulary = Vocabulary()
    if door == "arrow":
        together = from_entry_tables([entry_table(rows) for rows in entries.values()], list(entries), members,
                                     vocabulary=vocabulary)
    else:
        together = concatenate([from_dump_entries(rows, rank, members, vocabulary=vocabulary)
                                 for rank, rows in entries.items()], vocabulary)
    return diagnose(together, listed=members, dumped=sorted(entries))


@pytest.mark.parametrize("door", ["entries", "arrow", "stored"])
def test_a_gather_s_root_is_not_at_odds_with_its_peers_for_listing_the_outputs(door):
    assert diagnose_through(door, gather_job(6)).findings == []
    skipped = diagnose_through(door, gather_job(6, skip_rank=3)).root
    assert (skipped.kind, skipped.culprit_ranks) == ("skipped_collective", [3])
    half = diagnose_through(door, gather_job(6, half_rank=2)).root
    assert (half.kind, half.culprit_ranks) == ("dtype_mismatch", [2])
    assert "Half" in half.actual["dtype"] and "Half" not in half.expected["dtype"]


class Groups:
    """Ranks issuing collectives in several groups, numbered per group as torch numbers them."""

    def __init__(self, members: dict[str, list[int]], desc: str | dict[str, str] = "undefined") -> None:
        """``desc``: every group's description, or one per group name."""
        self.members, self.desc = members, desc
        self.entries: dict[int, list[dict]] = {rank: [] for ranks in members.values() for rank in ranks}
        self.seqs: dict[tuple[int, str], int] = {}

    def call(self, rank: int, group: str, *, size: int = 8, state: str = "completed", dtype: str = "Float") -> None:
        seq = self.seqs[rank, group] = self.seqs.get((rank, group), 0) + 1
        rows = self.entries[rank]
        rows.append({"record_id": len(rows), "process_group": (group, self.desc_of(group)), "collective_seq_id": seq,
                     "p2p_seq_id": 0, "profiling_name": "nccl:all_reduce", "input_sizes": [[size]],
                     "output_sizes": [[size]], "input_dtypes": [dtype], "output_dtypes": [dtype], "state": state,
                     "time_created_ns": 0, "time_discovered_started_ns": None, "time_discovered_completed_ns": None})

    def desc_of(self, group: str) -> str:
        return self.desc[group] if isinstance(self.desc, dict) else self.desc

    def transfer(self, rank: int, group: str, name: str, *, state: str = "completed") -> None:
        """A send or receive (``send 0->1``: group-local ranks), numbered by the group's p2p count."""
        p2p_seq = self.seqs[rank, group, "p2p"] = self.seqs.get((rank, group, "p2p"), 0) + 1
        rows = self.entries[rank]
        rows.append({"record_id": len(rows), "process_group": (group, self.desc_of(group)),
                     "collective_seq_id": self.seqs.get((rank, group), 0), "p2p_seq_id": p2p_seq,
                     "profiling_name": f"nccl:{name}", "input_sizes": [[8]], "output_sizes": [[8]],
                     "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": state, "time_created_ns": 0,
                     "time_discovered_started_ns": None, "time_discovered_completed_ns": None})

    def diagnosis(self, *, without: int | None = None, ring: dict[int, int] | None = None):
        """``ring``: rank -> how many of its newest entries its wrapped ring kept."""
        vocabulary = Vocabulary()
        parts = [from_dump_entries(rows[-(ring or {}).get(rank, len(rows)):], rank, self.members,
                                   vocabulary=vocabulary)
                 for rank, rows in self.entries.items() if rank != without]
        return diagnose(concatenate(parts, vocabulary), listed=self.members,
                        dumped=sorted(rank for rank in self.entries if rank != without))


def test_two_undescribed_groups_over_the_same_ranks_are_not_each_other_s_siblings():
    """Two gradient buckets' groups, both with torch's placeholder description: rank 1 passes the
    second bucket's tensor to the first bucket's group. Read as siblings, the second group's calls
    outvoted the first group's own history and the culprit was undetermined."""
    job = Groups({"1": [0, 1], "2": [0, 1]})
    for step in range(10):
        last = step == 9
        for rank in (0, 1):
            job.call(rank, "1", size=512 if last and rank == 1 else 1024, state="started" if last else "completed")
            job.call(rank, "2", size=512, state="scheduled" if last else "completed")
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks, root.group) == ("size_mismatch", [1], "1")


def interleaved(reverse: set[int], ranks: int = 4, steps: int = 9) -> Groups:
    """Two groups over the same ranks, called alternately; in the last step the ``reverse`` ranks
    call the first group's next collective before the second group's, and NCCL runs what each rank
    enqueued first: everyone ends up inside a call the others are not in."""
    job = Groups({"1": list(range(ranks)), "2": list(range(ranks))})
    for step in range(steps):
        for rank in range(ranks):
            job.call(rank, "1")
            if step < steps - 1:
                job.call(rank, "2")
            elif rank in reverse:
                job.call(rank, "1", state="started")
                job.call(rank, "2", state="scheduled")
            else:
                job.call(rank, "2", state="started")
    return job


def test_a_rank_that_reversed_two_groups_calls_is_the_root_of_the_deadlock():
    result = interleaved(reverse={2}).diagnosis()
    root = result.root
    assert (root.kind, root.culprit_ranks, root.waiting_ranks, result.verdict) == (
        "order_mismatch", [2], [0, 1, 3], "hang")
    assert "all_reduce #10 of ranks 0, 1, 2, 3 (pg 1) before all_reduce #9" in root.headline()


def test_with_no_majority_order_the_rank_that_changed_its_own_order_is_the_root():
    """Two ranks, one each way: no majority, but rank 1 issued group 1's call with no call of group
    2 since its previous one, which every earlier step of its own had; rank 0 kept to its program."""
    root = interleaved(reverse={1}, ranks=2).diagnosis().root
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("order_mismatch", [1], [0])
    assert "its peer kept to its program" in root.evidence[0]


@pytest.mark.parametrize("fault", ["skip", "swap"])
def test_a_rank_whose_later_calls_all_stay_one_number_behind_skipped_one_and_did_not_swap(fault):
    """Hosts that never wait for their devices enqueue every step (NCCL): each step a gradient
    all_reduce in group 1, then a loss all_reduce in group 2. Rank 2 skips step 2's gradient
    call: its loss call #2 comes before its gradient call #2, the reverse of its peers' order, as
    a swap would, but every later pair stays reversed and it ends one gradient call short. A swap
    of the two calls puts them back in order at the next step and ends even (probe 4: the skip was
    reported as an order mismatch)."""
    job = Groups({"1": [0, 1, 2, 3], "2": [0, 1, 2, 3]})
    for rank in range(4):
        if rank != 2:
            program = ["1", "2"] * 5
        elif fault == "skip":
            program = ["1", "2", "2"] + ["1", "2"] * 3
        else:
            program = ["1", "2", "2", "1"] + ["1", "2"] * 3
        for index, group in enumerate(program):
            job.call(rank, group, state="completed" if index < 2 else "started" if index == 2 else "scheduled")
    root = job.diagnosis().root
    expected = ("skipped_collective", [2], "1", 2) if fault == "skip" else ("order_mismatch", [2], "1", 2)
    assert (root.kind, root.culprit_ranks, root.group, root.seq) == expected, root.headline()


def test_a_deadlock_with_no_majority_and_no_change_of_order_names_every_rank_of_the_cycle():
    """Each rank calls the two groups in the order it always did (a job that relied on both calls
    running at once): nothing tells who is at fault."""
    job = Groups({"1": [0, 1], "2": [0, 1]})
    for step in range(9):
        last = step == 8
        for rank, order in ((0, ("1", "2")), (1, ("2", "1"))):
            job.call(rank, order[0], state="started" if last else "completed")
            job.call(rank, order[1], state="scheduled" if last else "completed")
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks) == ("deadlock", [0, 1])


def test_a_missing_dump_does_not_outrank_a_disagreement_among_the_dumps():
    """Rank 3 skipped a call (its next one is at odds with its peers'), and rank 2's dump was not
    collected: the disagreement is direct evidence, the missing file is not."""
    job = Groups({"0": [0, 1, 2, 3]}, desc="default_pg")
    for step in range(6):
        last = step == 5
        for rank in range(4):
            if not (last and rank == 3):
                job.call(rank, "0", size=1024, state="started" if last else "completed")
            job.call(rank, "0", size=1, state="scheduled" if last else "completed")
    result = job.diagnosis(without=2)
    assert result.root.culprit_ranks == [3] and result.root.kind != "missing_dump"
    assert any(f.kind == "missing_dump" and f.culprit_ranks == [2] for f in result.findings[1:])


def test_what_hangs_the_job_is_its_root_cause_rather_than_an_older_mismatch_that_completed():
    job = Groups({"0": [0, 1, 2, 3]}, desc="default_pg")
    for step in range(8):
        for rank in range(4):
            if step == 7 and rank == 3:
                continue  # rank 3 never issues the last call: the others wait in it
            job.call(rank, "0", dtype="Half" if (step, rank) == (1, 1) else "Float",
                     state="started" if step == 7 else "completed")
    result = job.diagnosis()
    assert (result.verdict, result.root.culprit_ranks) == ("hang", [3])
    assert any(f.kind == "dtype_mismatch" and f.culprit_ranks == [1] for f in result.findings)


def all_to_all_job(steps: int, *, half_rank: int | None = None) -> dict[int, list[dict]]:
    """Four ranks exchanging tokens with ``all_to_all_single``, each with its own uneven split
    every step (the sizes differ by design); ``half_rank`` sends Half in the last step."""
    entries: dict[int, list[dict]] = {rank: [] for rank in range(4)}
    for rank, rows in entries.items():
        for seq in range(1, steps + 1):
            dtype = "Half" if seq == steps and rank == half_rank else "Float"
            tokens = 100 + 17 * ((rank * 7 + seq * 3) % 5)
            rows.append({"record_id": seq - 1, "process_group": GROUP, "collective_seq_id": seq, "p2p_seq_id": 0,
                         "profiling_name": "nccl:all_to_all", "input_sizes": [[tokens, 64]],
                         "output_sizes": [[tokens + rank, 64]], "input_dtypes": [dtype], "output_dtypes": [dtype],
                         "state": "completed", "time_created_ns": seq * 1000, "time_discovered_started_ns": None,
                         "time_discovered_completed_ns": None})
    return entries


@pytest.mark.parametrize("door", ["entries", "arrow", "stored"])
def test_an_all_to_all_s_uneven_splits_are_not_a_mismatch_but_another_dtype_is(door):
    assert diagnose_through(door, all_to_all_job(8)).findings == []
    half = diagnose_through(door, all_to_all_job(8, half_rank=1)).root
    assert (half.kind, half.culprit_ranks, half.seq) == ("dtype_mismatch", [1], 8)


def device_stall_job(steps: int, *, stalled: tuple[int, ...], ahead: int = 0) -> dict[int, list[dict]]:
    """Four ranks all_reducing; in the last call, every device but the ``stalled`` ranks' started
    it (NCCL marks an entry started when its kernel starts). ``ahead``: calls the stalled ranks'
    CPUs enqueued after it, which their devices never reached either."""
    job = Groups({GROUP[0]: [0, 1, 2, 3]}, desc=GROUP[1])
    for step in range(steps):
        last = step == steps - 1
        for rank in range(4):
            job.call(rank, GROUP[0], state=("scheduled" if rank in stalled else "started") if last else "completed")
    for rank in stalled:
        for _ in range(ahead):
            job.call(rank, GROUP[0], state="scheduled")
    return job.entries


@pytest.mark.parametrize("door", ["entries", "arrow", "stored"])
def test_a_device_that_never_starts_a_call_its_peers_started_is_the_root_cause(door):
    """Its CPU enqueued the call, so nothing is missing from the sequence; only the states tell
    that its peers' kernels run and wait while its own never started."""
    assert diagnose_through(door, device_stall_job(10, stalled=())).verdict == "healthy"  # all inside: a snapshot
    for stalled, ahead in (((2,), 0), ((2,), 2), ((1, 3), 1)):
        result = diagnose_through(door, device_stall_job(10, stalled=stalled, ahead=ahead))
        assert (result.verdict, result.root.kind, result.root.culprit_ranks, result.root.seq) == (
            "hang", "not_started", list(stalled), 10)
        assert result.root.waiting_ranks == sorted({0, 1, 2, 3} - set(stalled))
        assert len(result.findings) == 1


def test_a_rank_whose_device_waits_in_an_earlier_call_of_another_group_is_not_the_root():
    """Rank 3's device never started the dp call its dp peers started, but its earlier pp call is
    started and waits for rank 4, which skipped it: rank 4 is the root, and the dp ranks wait too."""
    job = Groups({"dp": [0, 1, 2, 3], "pp": [3, 4]})
    for step in range(6):
        last = step == 5
        for rank in (3, 4):
            if not (last and rank == 4):
                job.call(rank, "pp", state="started" if last else "completed")
        for rank in range(4):
            job.call(rank, "dp", state=("scheduled" if rank == 3 else "started") if last else "completed")
    result = job.diagnosis()
    assert (result.root.kind, result.root.culprit_ranks, result.root.seq) == ("skipped_collective", [4], 6)
    assert result.root.waiting_ranks == [0, 1, 2, 3]
    # rank 3's own order decides where its device stopped: at the pp call it enqueued first
    job.entries[3][-2]["state"] = "scheduled"
    job.entries[4].append({**job.entries[3][-2], "record_id": len(job.entries[4])})
    job.entries[4][-1]["state"] = "started"
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks, root.group, root.seq) == ("not_started", [3], "pp", 6)


def test_a_rank_waiting_in_a_transfer_is_not_the_root_although_its_device_never_started_the_next_call():
    """The receiving stage's device is held by its receive, whose send was never posted: the
    missing send is the root, not the all_reduce the receiver's device has not reached."""
    programs = {rank: Program() for rank in (0, 1)}
    for step in range(6):
        last = step == 5
        if not last:
            programs[0].send_recv(["send 0->1"])
        programs[1].send_recv(["recv 1<-0"], states=["started" if last else "completed"])
        programs[0].collective(state="started" if last else "completed")
        programs[1].collective(state="scheduled" if last else "completed")
    root = diagnosis(programs).root
    assert (root.kind, root.culprit_ranks) == ("p2p_unmatched", [0])


def test_ranks_whose_transfers_wait_on_a_stage_stuck_behind_the_culprit_are_counted_as_waiting():
    """Two pipeline stages (ranks 0, 1 then 2, 3), each with its own tensor-parallel group. Rank 3
    skips a tp all_reduce and goes on: its send to rank 1 completes. Rank 2 waits in the all_reduce,
    so its device never reaches the send it enqueued after it, and rank 0's receive, started,
    waits for that send."""
    job = Groups({"tp0": [0, 1], "tp1": [2, 3], "pp0": [0, 2], "pp1": [1, 3]})
    for step in range(6):
        last = step == 5
        for rank, tp, pp, recv in ((0, "tp0", "pp0", "recv 0<-1"), (1, "tp0", "pp1", "recv 0<-1")):
            job.call(rank, tp)
            job.transfer(rank, pp, recv, state="started" if last and rank == 0 else "completed")
        for rank, tp, pp in ((2, "tp1", "pp0"), (3, "tp1", "pp1")):
            if not (last and rank == 3):
                job.call(rank, tp, state="started" if last else "completed")
            job.transfer(rank, pp, "send 1->0", state="scheduled" if last and rank == 2 else "completed")
    result = job.diagnosis()
    assert (result.root.kind, result.root.culprit_ranks, result.root.group) == ("skipped_collective", [3], "tp1")
    assert result.root.waiting_ranks == [0, 2]


def pair_inside_job(*, rank3_done: bool = False) -> Groups:
    """Tensor-parallel pairs (0, 1) and (2, 3), data-parallel pairs (0, 2) and (1, 3); four tp
    calls, then one dp call per step. In the last step ranks 2 and 3 both started their third tp
    call and it never completes (``rank3_done``: rank 3 completed it); their CPUs enqueued the rest
    of the step. Ranks 0 and 1 finished their tp calls and wait in the dp call."""
    job = Groups({"tp0": [0, 1], "tp1": [2, 3], "dp0": [0, 2], "dp1": [1, 3]}, desc="tp")
    for step in range(5):
        last = step == 4
        for rank in range(4):
            tp, dp = ("tp0", "tp1")[rank // 2], ("dp0", "dp1")[rank % 2]
            for call in range(4):
                if not last or rank < 2 or call < 2 or (rank3_done and rank == 3 and call == 2):
                    state = "completed"
                else:
                    state = "started" if call == 2 else "scheduled"
                job.call(rank, tp, state=state)
            job.call(rank, dp, state=("started" if rank < 2 else "scheduled") if last else "completed")
    return job


def test_a_pair_inside_a_call_that_never_completes_holds_up_the_ranks_that_wait_for_it():
    """Nothing in the dumps shows either member missing, behind or at odds: the fault is below the
    Flight Recorder, and the pair is named (not healthy, not a skip)."""
    result = pair_inside_job().diagnosis()
    assert (result.verdict, result.root.kind, result.root.culprit_ranks, result.root.group, result.root.seq) == (
        "hang", "stalled_collective", [2, 3], "tp1", 19)
    assert result.root.waiting_ranks == [0, 1]
    root = pair_inside_job(rank3_done=True).diagnosis().root  # one member completed it: the other is at fault
    assert (root.kind, root.culprit_ranks, root.seq) == ("state_mismatch", [2], 19)


def test_members_of_a_block_take_the_state_of_its_close_as_torch_records_them():
    """torch records the members of a batch_isend_irecv or of coalesced collectives without events:
    they stay scheduled for good. Read as they stand, every block of a healthy job is unfinished."""
    programs = {rank: Program() for rank in (0, 1)}
    for _ in range(8):
        for program in programs.values():
            program.coalesced(3, as_torch=True)
        programs[0].batch_p2p(["send 0->1"], as_torch=True)
        programs[1].batch_p2p(["recv 1<-0"], as_torch=True)
    assert diagnosis(programs).findings == []
    assert diagnosis(programs, ring={0: 13, 1: 17}).findings == []  # rings wrapped at different points
    # rank 1's ring starts at a lone close: the members of its oldest block fell out
    assert diagnosis(programs, ring={0: 30, 1: 21}).findings == []
    # the last block: rank 1's device never started it, everything before completed
    for rank, program in programs.items():
        program.coalesced(3, state="scheduled" if rank == 1 else "started", as_torch=True)
    root = diagnosis(programs).root
    assert (root.kind, root.culprit_ranks, root.seq) == ("not_started", [1], 9)


def test_a_rank_that_skipped_one_of_two_alike_calls_and_went_on_is_the_root_though_it_enqueued_that_number():
    """Two pipeline stages of tensor-parallel pairs; every step ends with two alike all_reduces of
    the whole job (a gradient norm, an overflow flag). Rank 2 skips the second one of step 5 and
    goes on into step 6: its receive started (its stage-0 peer never sends: it waits in the
    all_reduce), and its own call of that number is step 6's first one, enqueued after step 6's
    tensor-parallel calls. Its tensor-parallel peer, rank 3, is innocent."""
    job = Groups({"world": [0, 1, 2, 3], "tp0": [0, 1], "tp1": [2, 3], "pp0": [0, 2], "pp1": [1, 3]})
    for step in range(7):
        for rank in range(4):
            stage, tp, pp = rank // 2, ("tp0", "tp1")[rank // 2], ("pp0", "pp1")[rank % 2]
            if step == 6 and rank != 2:
                continue  # the others are still in step 5's second all_reduce
            hung = step == 6
            if stage == 1:
                job.transfer(rank, pp, "recv 1<-0", state="started" if hung else "completed")
            for _ in range(2):
                job.call(rank, tp, state="scheduled" if hung else "completed")
            if stage == 0:
                job.transfer(rank, pp, "send 0->1")
            for second in (False, True):
                if step == 5 and second:
                    if rank != 2:
                        job.call(rank, "world", state="started")
                    continue
                job.call(rank, "world", state="scheduled" if hung else "completed")
    result = job.diagnosis()
    assert (result.root.kind, result.root.culprit_ranks, result.root.group, result.root.seq) == (
        "skipped_collective", [2], "world", 12)
    assert result.root.waiting_ranks == [0, 1, 3]


def test_a_device_that_never_starts_its_send_is_the_root_and_a_peer_blocked_behind_it_is_not_named():
    """Stage 0 (ranks 0, 1, a tensor-parallel pair) sends to stage 1 (ranks 2, 3). Rank 1's device
    never starts its send of the last step, though everything before it completed; rank 3's
    receive started and waits. Rank 1's tp peer is not at fault, nor is the rest of stage 1."""
    job = Groups({"tp0": [0, 1], "tp1": [2, 3], "pp0": [0, 2], "pp1": [1, 3]})
    for step in range(6):
        last = step == 5
        for rank, tp, pp in ((0, "tp0", "pp0"), (1, "tp0", "pp1")):
            job.call(rank, tp)
            job.transfer(rank, pp, "send 0->1", state=("scheduled" if rank == 1 else "completed") if last else "completed")
        for rank, tp, pp in ((2, "tp1", "pp0"), (3, "tp1", "pp1")):
            job.transfer(rank, pp, "recv 1<-0", state=("started" if rank == 3 else "completed") if last else "completed")
            job.call(rank, tp, state=("scheduled" if rank == 3 else "started") if last else "completed")
    result = job.diagnosis()
    root = result.root
    assert (root.kind, root.culprit_ranks, root.group, root.seq) == ("not_started", [1], "pp1", 6)
    assert root.waiting_ranks == [2, 3]
    assert "send to rank 3 (p2p #6)" in root.headline()
    assert [f.culprit_ranks for f in result.findings] == [[1]]


def test_a_device_that_never_starts_a_batch_its_peer_started_is_the_root():
    """``batch_isend_irecv`` as torch records it (members without events, the close carrying the
    state): rank 1's batch of the last step never started, rank 0's did and waits."""
    programs = {rank: Program() for rank in (0, 1)}
    for step in range(6):
        last = step == 5
        for program in programs.values():
            program.collective()
        programs[0].batch_p2p(["send 0->1", "recv 0<-1"], state="started" if last else "completed", as_torch=True)
        programs[1].batch_p2p(["recv 1<-0", "send 1->0"], state="scheduled" if last else "completed", as_torch=True)
    root = diagnosis(programs).root
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("not_started", [1], [0])


def test_a_rank_whose_ring_starts_at_the_call_its_device_never_started_is_the_root():
    """Rank 1's CPU ran far ahead of its stuck device: its ring holds only calls it enqueued and
    never started, from the very call its peers started and wait in. Its peers completed the call
    before with it, so it is behind, not a rank whose entries never say whether they finished."""
    job = device_stall_job(10, stalled=(1,), ahead=3)
    job[1] = job[1][-4:]  # the ring kept the stuck call and the three enqueued after it
    for door in ("entries", "arrow", "stored"):
        root = diagnose_through(door, job).root
        assert (root.kind, root.culprit_ranks, root.seq) == ("not_started", [1], 10), door


def test_a_rank_held_up_by_another_is_not_named_for_the_extra_calls_its_role_issues():
    """Three pipeline stages of tp pairs; the last (ranks 4, 5) issues two loss all_reduces in tp
    every step that the other stages never issue. Rank 5's host hangs before step 5's: rank 4
    waits in it, so its call of the step's closing all_reduce comes after more tp calls than the
    other stages issue there. That is its stage's program, and rank 4 only waits for rank 5."""
    tp = {rank: f"tp{rank // 2}" for rank in range(6)}
    job = Groups({"world": list(range(6)), "tp0": [0, 1], "tp1": [2, 3], "tp2": [4, 5]},
                 desc={"world": "default_pg", "tp0": "tp", "tp1": "tp", "tp2": "tp"})
    for step in range(6):
        last = step == 5
        for rank in range(6):
            job.call(rank, tp[rank], state="completed")
            if rank >= 4:
                if last and rank == 5:
                    continue  # its host hangs here: nothing more is issued
                for loss in range(2):
                    job.call(rank, tp[rank], state=("started" if loss == 0 else "scheduled") if last else "completed")
            job.call(rank, "world", state=("scheduled" if rank == 4 else "started") if last else "completed")
    result = job.diagnosis()
    assert result.root.culprit_ranks == [5]
    assert all(f.culprit_ranks != [4] for f in result.findings)


@pytest.mark.parametrize("steps", [2, 6])
def test_a_rank_that_skipped_one_of_several_alike_sends_and_went_on_is_the_p2p_root(steps):
    """Stage 1 (rank 1) sends two gradients per step back to stage 0 (rank 0), then both join the
    step's all_reduce. In the last step rank 1 posts one send only and goes on into the all_reduce,
    where it waits for rank 0, which waits for the second gradient: a cycle, but only rank 1 left
    its program (every earlier step between two all_reduces held two sends; with 2 steps, the
    first counts from the start of a ring that never wrapped)."""
    job = Groups({"world": [0, 1], "pp": [0, 1]})
    for step in range(steps):
        last = step == steps - 1
        for index in range(2):
            skipped = last and index == 1
            if not skipped:
                job.transfer(1, "pp", "send 1->0")
            job.transfer(0, "pp", "recv 0<-1", state="started" if skipped else "completed")
        job.call(1, "world", state="started" if last else "completed")
        if not last:
            job.call(0, "world")
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks) == ("p2p_unmatched", [1])
    assert any("went on" in line for line in root.evidence)


@pytest.mark.parametrize("steps", [2, 6])
def test_a_rank_of_two_overlapping_groups_that_swapped_their_calls_is_the_root(steps):
    """Groups A = ranks 0-3 and B = ranks 2-5, every step A then B. In the last step rank 3 issues
    B before A: rank 2 waits in A for rank 3, rank 3 in B for rank 2. Ranks 2 and 3 are the only
    members of both, one each way; rank 3's own earlier steps went A then B."""
    job = Groups({"A": [0, 1, 2, 3], "B": [2, 3, 4, 5]})
    for step in range(steps):
        last = step == steps - 1
        for rank in range(6):
            order = ("B", "A") if last and rank == 3 else ("A", "B")
            for group in order:
                if rank not in job.members[group]:
                    continue
                first = group == order[0] or rank not in job.members[order[0]]
                job.call(rank, group, state=("started" if first else "scheduled") if last else "completed")
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks) == ("order_mismatch", [3])
    assert root.waiting_ranks == [0, 1, 2, 4, 5]


def test_of_two_ranks_that_swapped_calls_of_groups_with_different_rates_the_one_that_left_its_program_is_named():
    """A tensor-parallel pair calls its tp group three times per step and a second pair group once,
    at the end. In the last step rank 1 issues the pair call before its third tp call. The previous
    calls of the two groups (tp #k-1, pair #n-1) went pair first for both ranks, so comparing them
    says nothing; rank 1's period does: fewer tp calls before the pair call than every earlier step."""
    job = Groups({"tp": [0, 1], "pair": [0, 1]}, desc={"tp": "TENSOR_MODEL_PARALLEL_GROUP", "pair": "PAIR_GROUP"})
    for step in range(4):
        last = step == 3
        for rank in (0, 1):
            order = ["tp", "tp", "pair", "tp"] if last and rank == 1 else ["tp", "tp", "tp", "pair"]
            for index, group in enumerate(order):
                state = "completed" if not last or index < 2 else ("started" if index == 2 else "scheduled")
                job.call(rank, group, state=state)
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks) == ("order_mismatch", [1])
    assert "its peer kept to its program" in root.evidence[0]


def test_a_swap_is_told_from_the_rank_s_own_steps_when_a_barrier_follows_the_step_s_call_now_and_then():
    """Two buckets all-reduced in a pair group, then a world all_reduce, every step; every third
    step a world barrier right after it (a stretch with no bucket before it). In the last step rank
    1 issues the world call before its second bucket. Its program is told by the stretches that end
    in the same call: two buckets before every world all_reduce, none before a barrier."""
    job = Groups({"dp": [0, 1], "world": [0, 1]}, desc={"dp": "DATA_PARALLEL_GROUP", "world": "default_pg"})
    for step in range(7):
        last = step == 6
        for rank in (0, 1):
            order = ["dp", "world", "dp"] if last and rank == 1 else ["dp", "dp", "world"]
            for index, group in enumerate(order):
                state = "completed" if not last or index == 0 else ("started" if index == 1 else "scheduled")
                job.call(rank, group, size=1 if group == "world" else 8, state=state)
            if step % 3 == 2:
                job.call(rank, "world", size=2)  # the barrier
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks, root.group) == ("order_mismatch", [1], "dp")


def test_a_rank_of_a_two_rank_group_that_skipped_one_of_two_alike_buckets_is_named_not_its_peer():
    """Two ranks all-reduce two alike gradient buckets, then a world all_reduce, every step. In the
    last step rank 1 skips the second bucket and goes on to the world call: each waits for the
    other, no majority exists, and rank 1 never issued the bucket rank 0 waits in."""
    job = Groups({"dp": [0, 1], "world": [0, 1]}, desc={"dp": "DATA_PARALLEL_GROUP", "world": "default_pg"})
    for step in range(3):
        last = step == 2
        job.call(0, "dp")
        job.call(0, "dp", state="started" if last else "completed")
        job.call(0, "world", state="scheduled" if last else "completed")
        job.call(1, "dp")
        if not last:
            job.call(1, "dp")
        job.call(1, "world", state="started" if last else "completed")
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks, root.group, root.seq) == ("skipped_collective", [1], "dp", 6)
    assert root.waiting_ranks == [0]


def test_a_stage_that_posted_a_receive_before_its_send_is_the_root_not_a_deadlock_of_both():
    """Two pipeline stages, three micro-batches, each step: stage 0 sends three activations then
    receives three gradients; stage 1 the reverse; then a world all_reduce. In the last step rank
    0 posts its first receive before its third send: rank 1 waits for that send, rank 0 for a
    gradient rank 1 sends only after it: a cycle, but only rank 0 left its program."""
    job = Groups({"world": [0, 1], "pp": [0, 1]}, desc={"world": "default_pg", "pp": "PIPELINE_MODEL_PARALLEL_GROUP"})
    forward, backward = ["send 0->1"] * 3 + ["recv 0<-1"] * 3, ["recv 1<-0"] * 3 + ["send 1->0"] * 3
    for step in range(3):
        if step < 2:
            for rank, ops in ((0, forward), (1, backward)):
                for op in ops:
                    job.transfer(rank, "pp", op)
                job.call(rank, "world")
            continue
        for index, op in enumerate(["send 0->1", "send 0->1", "recv 0<-1", "send 0->1", "recv 0<-1", "recv 0<-1"]):
            job.transfer(0, "pp", op, state="completed" if index < 2 else "started" if index == 2 else "scheduled")
        for index, op in enumerate(backward):  # its host enqueues the whole step (NCCL does not block it)
            job.transfer(1, "pp", op, state="completed" if index < 2 else "started" if index == 2 else "scheduled")
        job.call(0, "world", state="scheduled")
        job.call(1, "world", state="scheduled")
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("order_mismatch", [0], [1])
    assert "the reverse of its own program's order" in root.headline()


def test_a_rank_of_a_two_rank_group_that_skipped_its_step_end_call_is_named_by_its_own_program():
    """Expert-parallel pair: four all_to_alls then a data-parallel all_reduce, every step. Rank 1
    skips step 2's all_reduce and goes on into step 3; its own all_reduce of that number comes
    after eight all_to_alls, where every earlier step of its own had four. Rank 0, waiting in the
    all_reduce, went past nothing: its peer is the only example of the group, so the rank's own
    program decides."""
    job = Groups({"ep": [0, 1], "dp": [0, 1]}, desc={"ep": "EXPERT_MODEL_PARALLEL_GROUP", "dp": "DATA_PARALLEL_GROUP"})
    for step in range(4):
        for rank in (0, 1):
            if step == 3 and rank == 0:
                for index in range(4):
                    job.call(0, "ep", state="scheduled")
                continue
            for index in range(4):
                hung = step == 3
                job.call(rank, "ep", state=("started" if index == 0 else "scheduled") if hung else "completed")
            if rank == 1 and step == 2:
                continue  # skipped
            job.call(rank, "dp", state=("started" if rank == 0 else "scheduled") if step >= 2 else "completed")
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks, root.group) == ("skipped_collective", [1], "dp")


def test_a_step_short_for_both_stages_does_not_make_the_receiver_a_culprit():
    """Two stages, micro-batches 4, 4, 2, 4 per step (a short last batch), then a world
    all_reduce. Rank 0 issues step 2's all_reduce only after step 3's first send: the receiver,
    rank 1, posted only two receives in step 2 because the step had two micro-batches, which its
    peer's own step 2 shows too. It is not named for a receive it "skipped"."""
    job = Groups({"world": [0, 1], "pp": [0, 1]}, desc={"world": "default_pg", "pp": "PIPELINE_MODEL_PARALLEL_GROUP"})
    for step, batches in enumerate([4, 4, 2]):
        last = step == 2
        for _ in range(batches):
            job.transfer(0, "pp", "send 0->1")
            job.transfer(1, "pp", "recv 1<-0")
        if last:
            job.transfer(0, "pp", "send 0->1", state="started")  # step 3's first, before step 2's all_reduce
            job.call(0, "world", state="scheduled")
            job.call(1, "world", state="started")
        else:
            job.call(0, "world")
            job.call(1, "world")
    root = job.diagnosis().root
    assert root.culprit_ranks != [1]


def pipeline_ahead(*, skipped_sends: bool) -> Groups:
    """Two stages: stage 0 sends two activations and receives one gradient per step, stage 1 the
    reverse, then both all_reduce. The dump is taken while step 3's all_reduce runs on both
    devices and both hosts have enqueued step 4. With ``skipped_sends``, stage 0 skips step 4's
    sends instead: step 3's all_reduce completed and stage 1's first receive waits on its device."""
    job = Groups({"pp": [0, 1], "world": [0, 1]})
    for step in range(5):
        for rank, mine, theirs in ((0, "send 0->1", "recv 0<-1"), (1, "recv 1<-0", "send 1->0")):
            ahead = step == 4
            if not (ahead and skipped_sends and rank == 0):
                job.transfer(rank, "pp", mine, state="started" if ahead and skipped_sends else
                             "scheduled" if ahead else "completed")
                job.transfer(rank, "pp", mine, state="scheduled" if ahead else "completed")
            job.transfer(rank, "pp", theirs, state="scheduled" if ahead else "completed")
            job.call(rank, "world", state="scheduled" if ahead else
                     "started" if step == 3 and not skipped_sends else "completed")
    return job


def test_sends_that_fell_out_of_a_wrapped_ring_are_not_taken_for_sends_never_posted():
    """Stage 0's ring kept only its last two entries (step 4's receive and all_reduce): its step-4
    sends fell out, while stage 1's receives for them are still queued. Nobody waits in a
    transfer, so the job is healthy; it was two p2p_unmatched findings naming stage 0."""
    assert pipeline_ahead(skipped_sends=False).diagnosis(ring={0: 2}).findings == []
    # the same ring, but stage 1's receive is on its device: stage 0 never posted that send
    root = pipeline_ahead(skipped_sends=True).diagnosis(ring={0: 2}).root
    assert (root.kind, root.culprit_ranks) == ("p2p_unmatched", [0])


def tensor_pair_skip(*, eval_step: bool) -> Groups:
    """A tensor-parallel pair that also all_reduces over the world once per step. In its second
    training step rank 1 skips the first of two alike [512] calls, so at the next call it issues
    a [4096] where rank 0 issues the second [512]: two ranks, no majority, and too few steps for
    the group's history to have a period. ``eval_step``: an evaluation step (one tp call) comes
    between the two training steps."""
    job = Groups({"tp": [0, 1], "world": [0, 1]})
    sizes = [4096, 4096, 512, 512, 4096]
    steps = [sizes, [4096], sizes] if eval_step else [sizes, sizes]
    for step, step_sizes in enumerate(steps):
        last = step == len(steps) - 1
        for rank in (0, 1):
            issued = [size for index, size in enumerate(step_sizes) if not (last and rank == 1 and index == 2)]
            for index, size in enumerate(issued):
                job.call(rank, "tp", size=size, state="completed" if not last or index < 3 else
                         "started" if index == 3 else "scheduled")
            job.call(rank, "world", state="scheduled" if last else "completed")
    return job


def test_with_no_majority_the_rank_whose_call_differs_from_its_own_earlier_step_is_the_culprit():
    root = tensor_pair_skip(eval_step=False).diagnosis().root
    assert root.kind in ("skipped_collective", "size_mismatch") and root.culprit_ranks == [1]
    # steps that differ predict nothing: undetermined, but the rank that kept its program is never named
    root = tensor_pair_skip(eval_step=True).diagnosis().root
    assert root.culprit_ranks != [0]


def test_a_stage_that_skipped_a_tensor_parallel_call_and_went_on_to_its_transfers_is_the_culprit():
    """Two pipeline stages of a tensor-parallel pair each; per step, stage 0 runs two micro-batches
    (two alike tp calls, then a send) and receives two gradients, stage 1 the mirror, then all
    ranks all_reduce. In step 1 rank 1 skips the first tp call of micro-batch 1 and goes on to its
    send and receive: the waits close the cycle 0 -> 1 -> 3 -> 2 -> 0 (tp, p2p, tp, p2p), which
    was a deadlock of four. Its own step 0 shows two sends before that tp call, not one."""
    job = Groups({"tp0": [0, 1], "tp1": [2, 3], "pp0": [0, 2], "pp1": [1, 3], "world": [0, 1, 2, 3]})
    tp = {0: "tp0", 1: "tp0", 2: "tp1", 3: "tp1"}
    pp = {0: "pp0", 1: "pp1", 2: "pp0", 3: "pp1"}
    stage0 = ["tp", "tp", "send 0->1", "tp", "tp", "send 0->1", "recv 0<-1", "recv 0<-1", "world"]
    stage1 = ["recv 1<-0", "tp", "tp", "recv 1<-0", "tp", "tp", "send 1->0", "send 1->0", "world"]
    step1 = {  # (states of step 1's entries in program order; None: rank 1's skipped call)
        0: ["completed"] * 4 + ["started"] + ["scheduled"] * 4,
        1: ["completed"] * 3 + [None] + ["completed"] * 2 + ["started", "scheduled", "scheduled"],
        2: ["completed"] * 3 + ["started"] + ["scheduled"] * 5,
        3: ["completed"] * 4 + ["started"] + ["scheduled"] * 4}
    for rank in range(4):
        program = stage0 if rank < 2 else stage1
        for state, what in [("completed", what) for what in program] + list(zip(step1[rank], program)):
            if state is None:
                continue
            if what in ("tp", "world"):
                job.call(rank, tp[rank] if what == "tp" else "world", state=state)
            else:
                job.transfer(rank, pp[rank], what, state=state)
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks, root.group) == ("skipped_collective", [1], "tp0")


def test_a_rank_that_skipped_an_eval_all_reduce_is_named_not_a_deadlock_with_its_pair():
    """gloo (every entry stays scheduled): tensor-parallel pairs (0, 1), (2, 3), data-parallel
    pairs (0, 2), (1, 3), and an all_reduce over the world every fifth step (an evaluation). Rank 1
    skips step 9's and goes on to step 10's tp call. Its pair peer, rank 0, waits in the world
    call: it too issued a call (that very one) its pair peer's stretch lacks, and the sibling pair
    (2, 3), held in the world call, had no example to lend; rank 0's own earlier steps hold the
    same call after a tp call. It was a deadlock of ranks 0 and 1 (a live probe's real run)."""
    job = Groups({"tp0": [0, 1], "tp1": [2, 3], "dp0": [0, 2], "dp1": [1, 3], "world": [0, 1, 2, 3]},
                 desc={"tp0": "tp", "tp1": "tp", "dp0": "dp", "dp1": "dp", "world": "default_pg"})
    for step in range(11):
        for rank in range(4):
            if step == 10 and rank != 1:
                continue  # the others never get past step 9's world call
            job.call(rank, ("tp0", "tp1")[rank // 2], state="scheduled")
            if step == 10:
                continue  # rank 1 waits in step 10's tp call
            job.call(rank, ("dp0", "dp1")[rank % 2], state="scheduled")
            if step % 5 == 4 and not (rank == 1 and step == 9):
                job.call(rank, "world", state="scheduled")
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks, root.group) == ("skipped_collective", [1], "world")


def test_the_peer_behind_a_swap_is_not_named_when_its_step_legitimately_grew():
    """Groups A (0, 1, 2) and B (0, 1, 3); each step issues A's calls, then B's, then the world's,
    and the hosts run a step ahead. Step 2 issues two A calls where earlier steps issued one (it
    may), and rank 1 issues that step's B call before its A calls. Rank 0, in order, waits in A
    #3: by its own past it issued B #3 late, after more A calls than ever, but only because the
    step grew; it was named as the rank that skipped B #3."""
    job = Groups({"A": [0, 1, 2], "B": [0, 1, 3], "world": [0, 1, 2, 3]},
                 desc={"A": "A", "B": "B", "world": "default_pg"})
    for step in range(4):  # steps 0 and 1 completed; step 2 in flight; step 3 enqueued
        for rank in range(4):
            calls = ["A"] * (2 if step == 2 else 1) * (rank in (0, 1, 2)) + ["B"] * (rank in (0, 1, 3)) + ["world"]
            if step == 2 and rank == 1:
                calls = ["B", "A", "A", "world"]
            for index, group in enumerate(calls):
                state = "completed" if step < 2 else "started" if step == 2 and index == 0 else "scheduled"
                job.call(rank, group, state=state)
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks) == ("order_mismatch", [1])


def test_a_missing_dump_does_not_outrank_a_device_that_never_started_the_call():
    """Rank 2's device never started the last call, which its peers started; rank 3's dump was not
    collected. Rank 2 waits for no one there (its device has not reached the call), so it is the
    root, and the missing file comes after it."""
    job = Groups({GROUP[0]: [0, 1, 2, 3]}, desc=GROUP[1])
    for step in range(8):
        last = step == 7
        for rank in range(4):
            job.call(rank, GROUP[0], state=("scheduled" if rank == 2 else "started") if last else "completed")
    result = job.diagnosis(without=3)
    assert (result.root.kind, result.root.culprit_ranks) == ("not_started", [2])
    assert [f.culprit_ranks for f in result.findings if f.kind == "missing_dump"] == [[3]]


def test_a_rank_stuck_in_a_call_its_peers_completed_outranks_a_missing_dump():
    """Every peer completed #7 (NCCL completes a collective only once every member joined, so the
    rank that left no dump took part in it); rank 2 is still inside it, and the others wait for it
    in #8."""
    job = Groups({GROUP[0]: [0, 1, 2, 3]}, desc=GROUP[1])
    for step in range(8):
        for rank in range(4):
            state = "completed" if step < 6 else ("started" if rank == 2 else "completed") if step == 6 else (
                "scheduled" if rank == 2 else "started")
            job.call(rank, GROUP[0], state=state)
    result = job.diagnosis(without=3)
    assert result.root.culprit_ranks == [2] and result.root.kind in ("stuck_in_collective", "state_mismatch")


def test_a_send_queued_behind_a_call_its_device_is_in_does_not_wait_for_a_missing_rank():
    """Rank 3 skips a tensor-parallel call and goes on to the world group's call. Rank 2, its tp
    peer, is inside the skipped call; its send to rank 0, enqueued after it, has not started, and
    rank 0's dump is missing. Rank 2 waits in the tp call, not for rank 0: rank 3 is the root. (Rank
    1's device is in the world call, waiting.)"""
    job = Groups({"tp0": [0, 1], "tp1": [2, 3], "pp": [0, 2], GROUP[0]: [0, 1, 2, 3]},
                 desc={"tp0": "tp", "tp1": "tp", "pp": "pp", GROUP[0]: GROUP[1]})
    for step in range(6):
        last = step == 5
        for rank, tp in ((0, "tp0"), (1, "tp0"), (2, "tp1"), (3, "tp1")):
            if not (last and rank == 3):
                job.call(rank, tp, state="started" if last and rank == 2 else "completed")
        job.transfer(2, "pp", "send 1->0", state="scheduled" if last else "completed")
        job.transfer(0, "pp", "recv 0<-1", state="started" if last else "completed")
        for rank in range(4):
            job.call(rank, GROUP[0], state=("scheduled" if rank == 2 else "started") if last else "completed")
    result = job.diagnosis(without=0)
    assert (result.root.kind, result.root.culprit_ranks) == ("skipped_collective", [3]), result.root.headline()


def test_ranks_of_a_node_that_went_down_are_one_missing_dump_finding():
    """Ranks 4-7 left no dumps and ranks 0-3 wait for all of them in the same call: one cause."""
    job = Groups({GROUP[0]: list(range(8))}, desc=GROUP[1])
    for step in range(6):
        for rank in range(8):
            job.call(rank, GROUP[0], state="started" if step == 5 else "completed")
    vocabulary = Vocabulary()
    parts = [from_dump_entries(job.entries[rank], rank, job.members, vocabulary=vocabulary) for rank in range(4)]
    result = diagnose(concatenate(parts, vocabulary), listed=job.members, dumped=[0, 1, 2, 3])
    assert [(f.kind, f.culprit_ranks) for f in result.findings] == [("missing_dump", [4, 5, 6, 7])]
    assert result.root.headline().startswith("ranks 4, 5, 6, 7 left no dump; their peers wait in all_reduce #6")
    assert result.root.evidence[0].startswith("ranks 4, 5, 6, 7 left no dump; 4 rank(s) wait for them, first in ")


def test_live_a_rank_whose_heartbeats_stopped_leads_the_peer_it_left_stuck():
    """Rank 3 died inside all_reduce #7 (live: its heartbeats stopped): ranks 0 and 1 completed it,
    rank 2 cannot. The death explains rank 2, not the reverse."""
    from rankstream.flows.diagnosis.report import _name_the_dead

    for rank2_enqueued_next in (True, False):
        job = Groups({GROUP[0]: [0, 1, 2, 3]}, desc=GROUP[1])
        for step in range(8):
            for rank in range(4):
                if step == 7 and rank == 2 and not rank2_enqueued_next:
                    continue
                state = "completed" if step < 6 else ("started" if rank == 2 else "completed") if step == 6 else (
                    "scheduled" if rank == 2 else "started")
                job.call(rank, GROUP[0], state=state)
        result = job.diagnosis(without=3)
        _name_the_dead(result, {3}, None)
        assert (result.verdict, result.root.kind, result.root.culprit_ranks) == ("crash", "dead_rank", [3])


def test_a_rank_whose_record_never_started_a_call_its_peers_completed_is_no_rank_stuck_inside_it():
    """Ranks 0-2 completed all_reduce #6 and wait in #7; rank 3's entry for #6 is still scheduled.
    Its peers could not complete it without rank 3 taking part, so its record disagrees with
    theirs (a dump older than theirs, a start it missed): it is not inside the call."""
    job = Groups({"tp": [0, 1, 2, 3]})
    for step in range(7):
        for rank in range(4):
            if step == 6 and rank == 3:
                continue
            state = "completed" if step < 5 or (step == 5 and rank < 3) else "scheduled" if rank == 3 else "started"
            job.call(rank, "tp", state=state)
    root = job.diagnosis().root
    assert (root.kind, root.culprit_ranks, root.seq) == ("state_mismatch", [3], 6)
    assert "rank 3's entry is still scheduled" in root.evidence[0]


@pytest.mark.parametrize("steps", [12, 24, 60])
def test_a_short_ddp_job_whose_rank_left_its_loop_early_is_named_by_the_group_s_history(steps):
    """Two ranks with uneven data: rank 1 leaves its training loop first and calls the barrier
    before saving while rank 0 still all_reduces its gradients. No majority: the period of the
    group's all_reduces decides, though DDP's set-up broadcasts open its history and a short job
    has fewer calls than a long one's period must explain."""
    programs = {rank: Program() for rank in (0, 1)}
    for rank, program in programs.items():
        for op, size in (("all_gather", 1), ("broadcast", 12), ("broadcast", 9610)):
            program.seq += 1
            program._add(op, "completed", size)
        for _ in range(steps):
            program.collective()
    programs[0].collective(state="started")
    programs[1].collective("barrier", state="started")
    root = diagnosis(programs).root
    assert root.culprit_ranks == [1], root


def test_a_group_torch_left_undescribed_is_named_by_its_ranks():
    """``new_group()`` without a description is "undefined" in the dumps: the headline names the
    group by its members instead (the default group keeps its name)."""
    programs = {rank: Program() for rank in (0, 1)}
    for program in programs.values():
        for _ in range(5):
            program.collective()
    programs[0].collective(state="started")
    vocabulary, parts = Vocabulary(), []
    members = {"2": [0, 1]}
    for rank, program in programs.items():
        entries = [dict(entry, process_group=("2", "undefined")) for entry in program.entries]
        parts.append(from_dump_entries(entries, rank, members, vocabulary=vocabulary))
    root = diagnose(concatenate(parts, vocabulary), listed=members, dumped=[0, 1]).root
    assert root.culprit_ranks == [1]
    assert "in the group of ranks 0, 1 (pg 2)" in root.headline(), root.headline()
    assert "in group default_pg (pg 0)" in diagnosis(_skip_at_end()).root.headline()


def _skip_at_end() -> dict[int, Program]:
    programs = {rank: Program() for rank in (0, 1, 2)}
    for program in programs.values():
        for _ in range(5):
            program.collective()
    for rank in (0, 1):
        programs[rank].collective(state="started")
    return programs


def test_a_rank_waiting_in_the_call_its_group_issues_next_skipped_the_one_before_it():
    """Probe 12 (job34): in a tensor-parallel pair, rank 1 skipped the activation all_reduce; its
    next call (a gradient's) fed rank 0 data of another size, gloo aborted rank 0, and rank 0's last
    entries never reached the bus. Rank 1 waits in a call the group's period has one later: it
    skipped the call before it, rather than issuing an extra one."""
    programs = {rank: Program() for rank in (0, 1)}
    step = [("all_reduce", 16), ("all_reduce", 64), ("all_reduce", 10)]
    for _ in range(10):
        for op, size in step:
            for program in programs.values():
                program.seq += 1
                program._add(op, "completed", size)
    programs[1].seq += 1
    programs[1]._add("all_reduce", "started", 64)  # the group's #32, as its #31
    root = diagnosis(programs).root
    assert (root.kind, root.culprit_ranks, root.seq) == ("skipped_collective", [1], 31), root.headline()
    assert root.expected["shape"] != root.actual["shape"]
