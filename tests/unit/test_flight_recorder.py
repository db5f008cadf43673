"""FR dump translation, the plain-data unpickler and the live tap (with stand-in dumps)."""

import json
import os
import pickle
import re
import time
from pathlib import Path

import pytest

import threading

from rankstream.producers.flight_recorder import FlightRecorderDumps, FlightRecorderTap
from rankstream.producers.fr_reader import entry_from_dump, groups_from_pg_config, status_from_pg_status
from rankstream.schemas.safe_pickle import UnsafePickle, safe_loads

ROOT = Path(__file__).resolve().parents[2]


def dump_entry(record_id, state="scheduled", started=None, frames=True, group=("0", "default_pg")):
    return {"record_id": record_id, "pg_id": 0, "process_group": group, "thread_name": "python",
            "thread_id": 1234, "collective_seq_id": record_id + 1, "p2p_seq_id": 0, "op_id": record_id + 1,
            "profiling_name": "gloo:all_reduce", "time_created_ns": 10 + record_id, "input_sizes": [[4]],
            "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"], "state": state,
            "time_discovered_started_ns": started, "time_discovered_completed_ns": 0, "retired": False,
            "timeout_ms": 600000, "is_p2p": False,
            **({"frames": [{"name": "train", "filename": "t.py", "line": 7}]} if frames else {})}


def test_dump_entries_translate_the_same_from_pickle_and_json():
    from_pickle = entry_from_dump(dump_entry(0))
    from_json = entry_from_dump(json.loads(json.dumps(dump_entry(0))))
    assert from_pickle == from_json
    assert (from_pickle["pg_name"], from_pickle["pg_desc"], from_pickle["thread_id"]) == ("0", "default_pg", "1234")
    assert from_pickle["time_discovered_completed_ns"] is None  # JSON dumps write 0 for "unknown"


def test_gloo_placeholder_group_is_skipped_and_ranks_parsed():
    config = {"": {"name": "", "desc": "", "ranks": "[]"}, "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}
    assert groups_from_pg_config(config, "gloo") == [{"pg_name": "1", "pg_desc": "tp", "ranks": [0, 1],
                                                      "backend": "gloo"}]
    assert status_from_pg_status({"0": {"last_enqueued_collective": "5", "last_started_collective": "-1",
                                        "last_completed_collective": "4"}}) == {
        "0": {"last_enqueued": 5, "last_started": -1, "last_completed": 4}}


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch /tmp/rankstream-pwned",))


def test_malicious_pickle_runs_nothing_and_is_refused(tmp_path):
    marker = Path("/tmp/rankstream-pwned")
    marker.unlink(missing_ok=True)
    payload = pickle.dumps({"entries": [RunsCode()]})
    with pytest.raises(UnsafePickle, match="posix.system|os.system"):
        safe_loads(payload)
    assert not marker.exists()
    assert safe_loads(pickle.dumps({"entries": [dump_entry(0)], "v": (1, 2.5, None, b"x")}))["v"] == (1, 2.5, None,
                                                                                                         b"x")
    with pytest.raises(UnsafePickle, match="not a readable pickle"):
        safe_loads(pickle.dumps({"a": 1})[:-3])


def test_no_plain_pickle_load_anywhere_in_the_code_base():
    offenders = []
    for path in ROOT.rglob("*.py"):
        if any(part in (".venv", "build", "tests") for part in path.parts):
            continue
        if re.search(r"pickle\.loads?\(|cPickle|_pickle\.load", path.read_text()):
            offenders.append(str(path))
    assert offenders == []


class Recorder:
    def __init__(self):
        self.fr, self.groups, self.status, self.events = [], [], None, []
        self.refusing = False  # a producer whose spool is full during an outage says True
        self.transfers = 0  # the job's point-to-point calls so far

    def emit_fr_entries(self, entries, snapshot_ns=None):
        self.fr.append(list(entries))

    def emit_process_groups(self, groups):
        self.groups.append(groups)

    def set_collectives(self, status):
        self.status = status

    def emit(self, name, cat="", ph="X", **fields):
        self.events.append((name, fields.get("args")))


class FakeRing:
    """Stand-in for torch's dumps: a list of entries and each group's progress."""

    def __init__(self):
        self.entries = [dump_entry(0), dump_entry(1)]
        self.enqueued, self.completed = 1, 1
        self.full_dumps = 0
        self.pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}

    def status(self):
        return pickle.dumps({"pg_status": {"0": {"last_enqueued_collective": self.enqueued,
                                                 "last_completed_collective": self.completed}}})

    def full(self):
        self.full_dumps += 1
        return pickle.dumps({"entries": self.entries, "pg_status": {}, "pg_config": self.pg_config})

    def dumps(self, frames=None):
        return FlightRecorderDumps(status=self.status, entries=self.full, entries_with_frames=frames or self.full)


def test_tap_publishes_only_new_or_changed_entries_and_skips_idle_dumps():
    ring, recorder = FakeRing(), Recorder()
    tap = FlightRecorderTap(recorder, full_every_s=0.0, dumps=ring.dumps(), dump_cpu_share=None)
    assert tap.snapshot() == 2
    assert tap.snapshot() == 0 and ring.full_dumps == 1  # no progress: no full dump at all
    ring.entries = [dump_entry(0), dump_entry(1, state="started", started=99), dump_entry(2)]
    ring.enqueued = ring.completed = 2
    assert tap.snapshot() == 2
    assert [e["record_id"] for e in recorder.fr[-1]] == [1, 2]
    assert len(recorder.groups) == 1
    assert recorder.status == {"0": {"last_enqueued": 2, "last_completed": 2}}


def test_a_process_about_to_die_reads_the_whole_ring_whatever_the_schedule_says():
    """The call a rank blocks in was enqueued after the last full read, and a full read was not
    due yet: a rank that died on SIGTERM there never published it (live probe: a job whose peer
    exited at once left no entry at all, and its run could not be diagnosed)."""
    ring, recorder = FakeRing(), Recorder()
    tap = FlightRecorderTap(recorder, full_every_s=60.0, dumps=ring.dumps(), dump_cpu_share=None)
    assert tap.snapshot() == 2
    ring.entries.append(dump_entry(2, state="scheduled"))
    ring.enqueued = 2
    assert tap.snapshot() == 0 and ring.full_dumps == 1  # not due on the schedule
    assert tap.snapshot(full=True) == 1 and ring.full_dumps == 2
    assert recorder.fr[-1][0]["record_id"] == 2


def test_no_full_dumps_while_the_producer_would_drop_them_and_nothing_missed_after():
    ring, recorder = FakeRing(), Recorder()
    tap = FlightRecorderTap(recorder, full_every_s=0.0, dumps=ring.dumps(), dump_cpu_share=None)
    recorder.refusing = True  # broker down, spool full
    ring.enqueued = ring.completed = 1
    assert tap.snapshot() == 0 and ring.full_dumps == 0
    assert recorder.status == {"0": {"last_enqueued": 1, "last_completed": 1}}  # progress is still read
    recorder.refusing = False  # the spool drained
    assert tap.snapshot() == 2 and ring.full_dumps == 1
    assert [e["record_id"] for e in recorder.fr[-1]] == [0, 1]


def test_periodic_dumps_stay_within_their_cpu_share():
    """A dump that costs 20 ms of CPU at a 50% share is not repeated for 40 ms, whatever
    ``full_every_s`` says; progress alone does not override the share, a stuck collective would."""
    ring, recorder = FakeRing(), Recorder()
    costly = ring.dumps()

    def entries():
        started = time.thread_time()
        while time.thread_time() - started < 0.02:
            pass
        return costly.entries()

    tap = FlightRecorderTap(recorder, full_every_s=0.0, dump_cpu_share=0.5, dump_allowance_s=0.0,
                            dumps=FlightRecorderDumps(costly.status, entries, costly.entries_with_frames))
    tap.snapshot()
    ring.entries = ring.entries + [dump_entry(2)]
    ring.enqueued = ring.completed = 2
    tap.snapshot()
    assert ring.full_dumps == 1  # progress, but the last dump's 20 ms buys it 40 ms of quiet
    time.sleep(0.05)
    tap.snapshot()
    assert ring.full_dumps == 2 and [e["record_id"] for e in recorder.fr[-1]] == [2]


def test_a_costly_first_read_does_not_hold_back_the_cheap_reads_of_a_young_ring():
    """Live probe 10 e06: the first read's cost (one-time work) at the 0.2% share pushed the next
    freshness read seconds away, and three ranks that then died in an abort (no crash-path read)
    had lost every call they made. The allowance lets the cheap reads of a young ring go on each
    tick; spending past it, the share paces them again."""
    ring, recorder = FakeRing(), Recorder()
    plain, costs = ring.dumps(), iter([0.03, 0.0, 0.0, 0.03])

    def entries():
        cost, started = next(costs, 0.0), time.thread_time()
        while time.thread_time() - started < cost:
            pass
        return plain.entries()

    tap = FlightRecorderTap(recorder, full_every_s=0.0, dump_cpu_share=0.002, dump_allowance_s=0.05,
                            dumps=FlightRecorderDumps(plain.status, entries, plain.entries_with_frames))
    reads = []
    for record in range(2, 7):
        tap.snapshot()
        reads.append(ring.full_dumps)
        ring.entries = ring.entries + [dump_entry(record)]
        ring.enqueued = ring.completed = record
    assert reads == [1, 2, 3, 4, 4]  # 30 ms, then two cheap reads; 60 ms spent: paced by the share


def test_a_rank_that_stops_progressing_publishes_where_it_stopped_at_once():
    """Between need-driven dumps the tap waits long (a dump holds the GIL); a rank that pauses is
    dumped on its first quiet tick, whatever the freshness period, and only once."""
    ring, recorder = FakeRing(), Recorder()
    tap = FlightRecorderTap(recorder, full_every_s=3600, dumps=ring.dumps())
    tap.snapshot()
    ring.entries = ring.entries + [dump_entry(2)]
    ring.enqueued = ring.completed = 2
    tap.snapshot()
    assert ring.full_dumps == 1  # progress, completed: not due for an hour
    tap.snapshot()
    assert ring.full_dumps == 2 and [e["record_id"] for e in recorder.fr[-1]] == [2]
    tap.snapshot()
    assert ring.full_dumps == 2  # still quiet, nothing new: no dump


def test_sends_and_receives_count_towards_refilling_the_ring(monkeypatch):
    """Groups' progress counts collectives only; the ring also fills with sends and receives. The
    fill rate seen between two dumps (their newest record ids) makes the next dump due before the
    ring overwrites what was not yet published."""
    clock = [100.0]
    monkeypatch.setattr("rankstream.producers.flight_recorder.time.monotonic", lambda: clock[0])
    ring, recorder = FakeRing(), Recorder()
    tap = FlightRecorderTap(recorder, full_every_s=3600, ring_size=20, dumps=ring.dumps())
    tap.snapshot()

    def one_collective_and_eight_transfers(seconds):
        ring.entries = ring.entries + [dump_entry(len(ring.entries) + i) for i in range(9)]
        ring.enqueued = ring.completed = ring.enqueued + 1
        clock[0] += seconds

    one_collective_and_eight_transfers(1.0)
    tap.snapshot()
    assert ring.full_dumps == 1  # by the groups' progress, 1 new entry of a 20-entry ring
    tap.snapshot()  # the rank paused: dumped, and the fill rate is now known (9 per second)
    assert ring.full_dumps == 2
    one_collective_and_eight_transfers(1.2)
    tap.snapshot()
    assert ring.full_dumps == 3 and len(recorder.fr[-1]) == 9


def test_an_idle_ranks_stack_is_published_once_and_again_when_it_moves_on():
    """gloo's send/recv move no group: a rank that went from its data loader into a blocking
    receive stayed, by the one stack published when it fell idle, at the loader."""
    ring, recorder = FakeRing(), Recorder()
    moved, done = threading.Event(), threading.Event()

    def loading_data():
        moved.wait(30)

    def receiving():
        done.wait(30)

    def rank():
        loading_data()
        receiving()

    thread = threading.Thread(target=rank)
    thread.start()
    try:
        tap = FlightRecorderTap(recorder, full_every_s=3600, dumps=ring.dumps(), main_thread_id=thread.ident)
        for _ in range(8):  # no group moves, the rank stays in the loader
            tap.snapshot()
        moved.set()
        time.sleep(0.2)
        tap.snapshot()
        tap.snapshot()
    finally:
        done.set()
        thread.join()
    tap.snapshot(full=True)  # SIGTERM's flush began: the training thread now runs rankstream's way out
    tap.snapshot()  # the tap's own tick during it: the stack moved (here, the thread ended), not published
    tap.snapshot(final=True)
    idle = [[frame["name"] for frame in args["frames"]] for name, args in recorder.events
            if name == "idle_outside_collectives"]
    assert len(idle) == 2 and "loading_data" in idle[0] and "receiving" in idle[1], idle


def test_a_stuck_collective_triggers_a_dump_and_reports_the_live_stack():
    ring, recorder = FakeRing(), Recorder()
    tap = FlightRecorderTap(recorder, full_every_s=3600, dumps=ring.dumps(),
                            main_thread_id=threading.get_ident())
    tap.snapshot()
    ring.enqueued = 2  # enqueued, never completed
    ring.entries = ring.entries + [dump_entry(2)]
    tap.snapshot()
    assert ring.full_dumps == 1  # not yet due: one tick of no completion is normal
    tap.snapshot()
    assert ring.full_dumps == 2 and [e["record_id"] for e in recorder.fr[-1]] == [2]
    stalls = [args for name, args in recorder.events if name == "stalled_in_collective"]
    assert len(stalls) == 1 and stalls[0]["groups"]["0"]["last_enqueued"] == 2
    assert any(f["name"] == "test_a_stuck_collective_triggers_a_dump_and_reports_the_live_stack"
               for f in stalls[0]["frames"])
    tap.snapshot()
    assert len([n for n, _ in recorder.events if n == "stalled_in_collective"]) == 1  # once per collective


def test_the_final_snapshot_adds_frames_but_never_blocks_on_them():
    ring, recorder = FakeRing(), Recorder()
    tap = FlightRecorderTap(recorder, dumps=ring.dumps(frames=lambda: time.sleep(30)))
    tap.snapshot()
    started = time.monotonic()
    tap.snapshot(final=True)
    assert time.monotonic() - started < 3
    ring2, recorder2 = FakeRing(), Recorder()
    tap2 = FlightRecorderTap(recorder2, dumps=FlightRecorderDumps(
        status=ring2.status, entries=lambda: pickle.dumps({"entries": [dump_entry(0, frames=False)]}),
        entries_with_frames=ring2.full))
    tap2.snapshot()
    tap2.snapshot(final=True)
    assert recorder2.fr[0][0]["frames"] is None and recorder2.fr[-1][0]["frames"][0]["name"] == "train"


def test_groups_created_after_the_first_report_reach_the_bus_when_the_dump_lists_none():
    """gloo's dumps list no groups (a nameless placeholder): the groups come from torch's own list,
    re-read at each full dump, so a subgroup created after ``init_process_group`` is reported (the
    diagnosis needs its members to see one that never joined)."""
    ring, recorder = FakeRing(), Recorder()
    ring.pg_config = {"": {"name": "", "desc": "", "ranks": "[]"}}
    listed = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1], "backend": "gloo"}]
    tap = FlightRecorderTap(recorder, full_every_s=0.0, dumps=ring.dumps(), dump_cpu_share=None,
                            groups=lambda: list(listed))
    tap.snapshot()
    listed.append({"pg_name": "1", "pg_desc": "undefined", "ranks": [0], "backend": "gloo"})  # new_group
    ring.entries = ring.entries + [dump_entry(2, group=("1", "undefined"))]
    ring.enqueued = ring.completed = 2
    tap.snapshot()
    assert [[g["pg_name"] for g in groups] for groups in recorder.groups] == [["0"], ["0", "1"]]


def test_a_rank_whose_transfers_stopped_publishes_its_stack_though_no_group_exists_in_the_ring():
    """A pipeline of send/recv alone: gloo's ring reports no group at all, so only the count of
    transfers tells a stage that moves from one that waits (live probe: a hung 3-stage pipeline
    published no stack, and the live watch had nothing to read)."""
    ring, recorder = FakeRing(), Recorder()
    ring.status = lambda: pickle.dumps({"pg_status": {}})
    tap = FlightRecorderTap(recorder, full_every_s=3600, dumps=ring.dumps(), main_thread_id=threading.get_ident())
    for _ in range(6):  # a transfer returns between every two ticks: moving
        recorder.transfers += 1
        tap.snapshot()
    assert [name for name, _ in recorder.events if name == "idle_outside_collectives"] == []
    for _ in range(5):  # the count stands still
        tap.snapshot()
    idle = [args for name, args in recorder.events if name == "idle_outside_collectives"]
    assert len(idle) == 1 and any(f["name"] == "test_a_rank_whose_transfers_stopped_publishes_its_stack_though_no_"
                                               "group_exists_in_the_ring" for f in idle[0]["frames"])
