"""A rank whose live stack shows it blocked in a point-to-point call waits for a peer.

gloo records no send or receive in the Flight Recorder: in a pipeline whose stage 2 stopped
sending, stage 3 blocks in ``recv`` and both are absent from the world call the others wait in
(live probe 10 e03/e03b: two equal suspects, and the headline went by rank order).
"""

from __future__ import annotations

import json
import time

import duckdb
import pytest

from rankstream.consumers.query import Database
from rankstream.consumers.store import apply_schema
from rankstream.flows.diagnosis.published_stacks import (
    BlockedCall,
    OutsideCommunication,
    innermost_call,
    place_outside,
)
from rankstream.flows.diagnosis.report import diagnose_stored
from tests.diagnosis.storing import store_dumps

WORLD = ("0", "default_pg")
C10D = "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"
RECV = [{"name": "recv", "filename": C10D, "line": 2799},
        {"name": "wrapper", "filename": "/venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py",
         "line": 83}, {"name": "<module>", "filename": "/job/train.py", "line": 37}]
SLEEP = [{"name": "<module>", "filename": "/job/train.py", "line": 41}]


BROADCAST = [{"name": "broadcast", "filename": C10D, "line": 3151}, RECV[1],
             {"name": "<module>", "filename": "/job/train.py", "line": 41}]


def _entry(record: int, seq: int, op: str = "all_reduce") -> dict:
    return {"record_id": record, "process_group": WORLD, "collective_seq_id": seq, "p2p_seq_id": 0,
            "profiling_name": f"gloo:{op}", "input_sizes": [[8]], "output_sizes": [[8]],
            "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "scheduled",
            "time_created_ns": 0, "time_discovered_started_ns": None, "time_discovered_completed_ns": None}


def _diagnose(stacks: dict[int, list[dict]], *, moved_on: set[int] = frozenset(), ops: dict[int, str] = None,
              reason: str = "idle_outside_collectives", reached: dict[int, int] | None = None):
    """Ranks 0 and 1 wait in world call #8; ranks 2 and 3 stopped after #7 (or each rank's last
    call is ``reached``) with ``stacks`` published; a rank in ``moved_on`` made progress after its
    stack was taken; ``ops``: the collective each call number is (all_reduce otherwise);
    ``reason``: the event the tap published the stacks as."""
    con = duckdb.connect()
    apply_schema(con)
    reached = reached or {0: 8, 1: 8, 2: 7, 3: 7}
    ops = ops or {}
    store_dumps(con, {rank: {"entries": [_entry(i, seq, ops.get(seq, "all_reduce"))
                                         for i, seq in enumerate(range(1, last + 1))],
                             "pg_config": {WORLD[0]: {"name": WORLD[0], "desc": WORLD[1], "ranks": [0, 1, 2, 3]}}}
                      for rank, last in reached.items()})
    now = time.time_ns()
    for rank, last in reached.items():
        progress = {"0": {"last_enqueued": last, "last_started": -1, "last_completed": last}}
        later = {"0": {**progress["0"], "last_enqueued": last + 1}} if rank in moved_on else progress
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final, collectives) "
                    "VALUES ('run', ?, 's', ?, false, ?)", [rank, now, json.dumps(later)])
        if rank in stacks:
            con.execute("INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, args) "
                        "VALUES ('run', ?, ?, 'rankstream', 'i', ?, ?)",
                        [rank, reason, now - 10**9, json.dumps({"groups": progress, "frames": stacks[rank]})])
    return diagnose_stored(Database.over(con, "stacks"), "run", live=True).diagnosis


@pytest.mark.parametrize("stalled, receiving", [(2, 3), (3, 2)])
def test_the_rank_blocked_in_recv_waits_for_the_one_that_stalled_outside_communication(stalled, receiving):
    result = _diagnose({stalled: SLEEP, receiving: RECV})
    assert (result.root.kind, result.root.culprit_ranks) == ("skipped_collective", [stalled])
    assert receiving in result.root.waiting_ranks
    assert not any(f.culprit_ranks == [receiving] for f in result.findings)  # it only waits
    assert any(f"rank {receiving}, blocked in recv (distributed_c10d.py:2799, from train.py:37), waits for rank "
               f"{stalled}" in line for line in result.root.evidence)
    # it stopped short of the call, at a place its stack shows: it did not skip it (live probe 11)
    assert result.root.headline().startswith(
        f"rank {stalled} never reached all_reduce #8 (stalled at train.py:41 in <module>) in group")


def test_without_a_current_stack_the_rank_is_said_to_have_skipped_the_call():
    result = _diagnose({2: SLEEP}, moved_on={2})
    assert result.root.headline().startswith("rank 2 skipped all_reduce #8 in group")
    assert result.root.actual is None
    # a stack the tap took because a collective looked stuck is no place outside communication
    result = _diagnose({2: SLEEP}, reason="stalled_in_collective")
    assert result.root.headline().startswith("rank 2 skipped all_reduce #8 in group")


def test_a_stack_taken_before_the_rank_moved_on_says_nothing():
    """Rank 3 was in recv once, and has made progress since: its old stack is no evidence, so
    the two suspects stay equal (rank order)."""
    result = _diagnose({2: SLEEP, 3: RECV}, moved_on={3})
    assert result.root.culprit_ranks == [2]
    assert 3 not in result.root.waiting_ranks
    result = _diagnose({3: SLEEP, 2: RECV}, moved_on={2})
    assert result.root.culprit_ranks == [2] and 2 not in result.findings[1].waiting_ranks


def test_ranks_still_inside_a_broadcast_their_peers_completed_are_stuck_in_it():
    """Live probe 10 e05: ranks 2 and 3 called broadcast #7 with another source than ranks 0 and
    1; gloo let 2 and 3 finish it and wait in #8, while 0 and 1 stayed inside #7. gloo marks no
    entry completed, so 0 and 1 looked like ranks that never issued #8, and rank 0 was named for
    skipping it, "stalled outside collectives"."""
    result = _diagnose({2: BROADCAST, 3: BROADCAST}, ops={7: "broadcast"})
    root = result.root
    assert (root.kind, root.culprit_ranks, root.seq, root.waiting_ranks) == ("stuck_in_collective", [2, 3], 7, [0, 1])
    assert root.headline().startswith("ranks 2, 3 are stuck in broadcast #7, which their peers completed")
    assert not any(f.kind == "skipped_collective" for f in result.findings)
    assert not any("stalled outside" in line for f in result.findings for line in f.evidence)


def test_a_stack_inside_another_collective_than_the_last_entry_is_no_evidence_of_being_stuck():
    result = _diagnose({2: BROADCAST, 3: BROADCAST})  # their #7 is an all_reduce
    assert result.root.kind == "skipped_collective"
    assert "rank 2's live stack shows it inside broadcast (distributed_c10d.py:3151, from train.py:41)" \
        in result.root.evidence


def test_only_torch_distributed_calls_count():
    assert innermost_call(RECV) == BlockedCall("recv", "distributed_c10d.py:2799, from train.py:37")
    assert innermost_call(RECV).point_to_point and not innermost_call(BROADCAST).point_to_point
    assert innermost_call(SLEEP) is None
    a_users_recv = [{"name": "recv", "filename": "/job/pipeline.py", "line": 3}]
    assert innermost_call(a_users_recv) is None


def test_a_stack_outside_communication_names_its_innermost_frame_and_the_jobs_own():
    assert place_outside(SLEEP) == OutsideCommunication("train.py:41 in <module>")
    loader = [{"name": "get", "filename": "/usr/lib/python3.11/queue.py", "line": 171},
              {"name": "_next_data", "filename": "/venv/lib/python3.12/site-packages/torch/utils/data/dataloader.py",
               "line": 1300},
              {"name": "train_rank", "filename": "/job/train.py", "line": 20}]
    assert str(place_outside(loader)) == "queue.py:171 in get, from train.py:20"
    assert place_outside([]) is None
    # a request's wait() (isend/irecv, a pipelining schedule) may be waiting for a peer: no place
    pipelined = [{"name": "_wait_batch_p2p", "filename": "/venv/lib/python3.12/site-packages/torch/distributed/"
                  "pipelining/schedules.py", "line": 700}, {"name": "main", "filename": "/job/pipe.py", "line": 9}]
    assert place_outside(pipelined) is None


def test_a_rank_blocked_in_recv_from_a_peer_that_went_on_to_a_collective_names_that_peer():
    """A pipeline stage that skipped its send and went on to the world all_reduce (live probe 12,
    job21): the next stage blocks in ``recv`` from it and is the only rank absent from that call.
    Its stack names the source, so the stage that never sent is the culprit, not the receiver."""
    recv_from_2 = [dict(RECV[0], args={"src": 2}), *RECV[1:]]
    result = _diagnose({3: recv_from_2}, reached={0: 8, 1: 8, 2: 8, 3: 7})
    assert (result.root.kind, result.root.culprit_ranks) == ("p2p_unmatched", [2])
    assert result.root.headline().startswith("rank 2 never posted its send to rank 3"), result.root.headline()
    assert result.root.waiting_ranks == [0, 1, 3]
    assert not any(3 in f.culprit_ranks for f in result.findings)
    assert any("blocked in recv from rank 2 (distributed_c10d.py:2799" in line for line in result.root.evidence)
    # a stack that does not name the source says only that the receiver waits for some peer
    result = _diagnose({3: RECV}, reached={0: 8, 1: 8, 2: 8, 3: 7})
    assert result.root.culprit_ranks == [3]


def test_the_tap_records_the_peer_arguments_of_torch_distributed_frames_only():
    from rankstream.schemas.stack_frames import C10D_MODULE, frame_records

    namespace: dict = {"frame_records": frame_records}
    exec(compile("import sys\ndef recv(tensor, src=None, group=None, tag=0, group_src=None):\n"
                 "    return frame_records(sys._getframe())\n", "/site-packages/" + C10D_MODULE, "exec"), namespace)
    frames = namespace["recv"](object(), src=2, group=object())
    assert frames[0]["name"] == "recv" and frames[0]["args"] == {"src": 2}  # the objects are never recorded
    assert "args" not in frames[1] and frames[1]["name"] == \
        "test_the_tap_records_the_peer_arguments_of_torch_distributed_frames_only"


def test_a_dump_folder_s_recorded_frames_name_the_peer_its_text_stack_cannot(tmp_path):
    """``--on-hang dump`` writes faulthandler's text and the main thread's recorded frames: the
    stored diagnosis of the folder reads the receive's source from the latter."""
    from rankstream.flows.diagnosis.loader import stack_file_places

    (tmp_path / "stacks_rank3.txt").write_text(
        'Current thread 0x1 (most recent call first):\n'
        f'  File "{C10D}", line 2799 in recv\n  File "/job/train.py", line 37 in <module>\n')
    assert stack_file_places(tmp_path)[3].peer is None
    (tmp_path / "stacks_rank3.json").write_text(json.dumps([dict(RECV[0], args={"src": 2}), *RECV[1:]]))
    assert stack_file_places(tmp_path)[3] == BlockedCall("recv", "distributed_c10d.py:2799, from train.py:37", 2)
    (tmp_path / "stacks_rank3.json").write_text("{not json")  # a damaged file: the text still tells
    assert stack_file_places(tmp_path)[3].function == "recv"


def test_ranks_inside_a_broadcast_whose_stacks_name_different_roots_are_said_to_disagree_on_it():
    """Live probes 12 and 13: a rank broadcast from another root than its peers. Who erred cannot
    be told from the ranks inside alone (a rank naming itself and one naming a root that went past
    look alike whichever erred: a rule that named the one waiting for a root that went past blamed
    an innocent rank when the culprit named itself), so both are named, with their roots."""
    def rooted(root: int) -> list[dict]:
        return [dict(BROADCAST[0], args={"src": root}), *BROADCAST[1:]]

    result = _diagnose({0: rooted(0), 2: rooted(1)}, ops={7: "broadcast"}, reached={0: 7, 1: 8, 2: 7, 3: 8})
    root = result.root
    assert (root.kind, root.culprit_ranks, root.seq) == ("stuck_in_collective", [0, 2], 7)
    assert root.headline().startswith("ranks 0, 2 are stuck in broadcast #7, which their peers completed, naming "
                                      "different roots (rank 0: 0, rank 2: 1)"), root.headline()
    # the same roots say nothing more
    result = _diagnose({0: rooted(0), 2: rooted(0)}, ops={7: "broadcast"}, reached={0: 7, 1: 8, 2: 7, 3: 8})
    assert "roots" not in result.root.headline()


def test_the_peer_of_an_object_list_call_is_read_from_the_public_function_around_it():
    """``recv_object_list(src=1)`` calls ``recv(group_src=1)``: the innermost call names no global
    rank, the public function around it does (probe 13, p11)."""
    frames = [dict(RECV[0], args={"group_src": 1}),
              {"name": "recv_object_list", "filename": C10D, "line": 3390, "args": {"src": 1, "group_src": 1}},
              *RECV[1:]]
    assert innermost_call(frames).peer == 1


def test_a_rank_blocked_in_a_recv_whose_peer_is_unknown_is_not_said_to_have_skipped_the_call():
    """A receive from any source, or one given a rank within its group: the stack names no global
    rank. The rank waits for some peer; the headline says where it is blocked (probe 13, p13)."""
    result = _diagnose({3: RECV}, reached={0: 8, 1: 8, 2: 8, 3: 7})
    assert result.root.culprit_ranks == [3]
    assert result.root.headline().startswith("rank 3 is blocked in recv (distributed_c10d.py:2799, from train.py:37) "
                                             "instead of all_reduce #8, waiting for a peer"), result.root.headline()


def test_a_hang_of_transfers_alone_is_read_from_the_stacks():
    """Probe 13: with no collective pending, the entries saw nothing and three hung jobs ended
    "HEALTHY". Following the peers the blocked ranks' stacks name finds the rank at the end."""
    from rankstream.flows.diagnosis.blocked_transfers import blocked_transfer_findings

    def blocked(function: str, peer: int | None) -> BlockedCall:
        return BlockedCall(function, "distributed_c10d.py:2799, from pipe.py:40", peer)

    stalled = OutsideCommunication("pipe.py:52 in <module>")
    [found] = blocked_transfer_findings({0: blocked("send", 1), 1: stalled, 2: blocked("recv", 1)})
    assert (found.kind, found.culprit_ranks, found.waiting_ranks) == ("p2p_unmatched", [1], [0, 2])
    assert found.headline().startswith("rank 1 never posted its recv from rank 0 (stalled at pipe.py:52 in <module>)")
    [found] = blocked_transfer_findings({0: blocked("send", 2), 1: blocked("recv", 0), 2: blocked("recv", 1)})
    assert (found.culprit_ranks, found.headline()) == ([0], "rank 0 sent to rank 2, which receives from rank 1; "
                                                            "2 ranks wait for it")
    [found] = blocked_transfer_findings({0: blocked("recv", 1), 1: blocked("recv", 0)})
    assert (found.kind, found.culprit_ranks) == ("deadlock", [0, 1])
    [found] = blocked_transfer_findings({0: blocked("recv", 1)})  # rank 1 left no current stack
    assert found.culprit_ranks == [1] and found.headline().startswith("rank 1 never posted its send to rank 0")
    assert blocked_transfer_findings({0: stalled}) == []


def test_a_rank_waiting_on_a_transfer_request_is_blocked_not_stalled_in_its_own_code():
    """``req.wait()`` on an ``irecv`` request is C++: the job's own line is the innermost frame.
    The tap notes the request it holds, and the rank waits for a peer rather than being stalled
    outside communication (probe 13, p9 and p10)."""
    import sys

    from rankstream.schemas.stack_frames import frame_records

    request_type = type("Work", (), {"__module__": "torch.distributed.distributed_c10d"})  # as torch names it

    def waiting_on(req) -> list[dict]:
        return frame_records(sys._getframe())

    frames = waiting_on(request_type())
    assert frames[0]["waits_on_request"] is True
    place = innermost_call(frames)
    assert place is not None and place.point_to_point and place.function == "wait"
    assert "waits_on_request" not in waiting_on([object()])[0]  # nothing of torch's held

    class Request:
        def wait(self):  # as a C method, it leaves the caller's frame innermost: the frame of the call
            return frame_records(sys._getframe(1))

    assert Request().wait()[0]["waits_on_request"] is True  # held nowhere: ``dist.irecv(t, 1).wait()``
    result = _diagnose({3: [dict(SLEEP[0], waits_on_request=True)]}, reached={0: 8, 1: 8, 2: 8, 3: 7})
    assert result.root.headline().startswith("rank 3 is blocked in wait (train.py:41 in <module>, on a request) "
                                             "instead of all_reduce #8"), result.root.headline()
