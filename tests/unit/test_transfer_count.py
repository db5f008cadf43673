"""The job's point-to-point calls are counted (gloo leaves them out of the Flight Recorder), and
rankstream's counting wrapper never shows in the stacks it reads."""

import sys

import torch.distributed as dist
from torch.distributed import distributed_c10d

from rankstream.producers.transfer_count import install
from rankstream.schemas.stack_frames import frame_records


def test_each_transfer_that_returns_is_counted_and_uninstall_puts_the_originals_back(monkeypatch):
    calls = []
    monkeypatch.setattr(distributed_c10d, "send", lambda tensor, dst: calls.append(("send", dst)))
    monkeypatch.setattr(dist, "send", distributed_c10d.send)
    original = distributed_c10d.send

    def failing_recv(tensor, src):
        raise RuntimeError("peer gone")

    monkeypatch.setattr(distributed_c10d, "recv", failing_recv)
    monkeypatch.setattr(dist, "recv", failing_recv)
    counted = []
    uninstall = install(lambda: counted.append(1))
    try:
        assert install(lambda: counted.append("twice")) is not None  # already wrapped: not wrapped again
        dist.send("tensor", dst=1)
        distributed_c10d.send("tensor", 2)
        try:
            dist.recv("tensor", src=0)
        except RuntimeError:
            pass
        assert calls == [("send", 1), ("send", 2)] and counted == [1, 1]  # a call that raised did not return
        assert dist.send is distributed_c10d.send and dist.send is not original
    finally:
        uninstall()
    assert distributed_c10d.send is original and dist.send is original and dist.recv is failing_recv


def test_the_counting_wrapper_is_left_out_of_the_recorded_stack(monkeypatch):
    seen = []
    monkeypatch.setattr(distributed_c10d, "recv",
                        lambda tensor, src: seen.append(frame_records(sys._getframe())))
    monkeypatch.setattr(dist, "recv", distributed_c10d.recv)
    uninstall = install(lambda: None)
    try:
        dist.recv("tensor", src=3)
    finally:
        uninstall()
    names = [frame["name"] for frame in seen[0]]
    assert names[:2] == ["<lambda>", "test_the_counting_wrapper_is_left_out_of_the_recorded_stack"], names



def test_the_peers_a_request_returning_call_posted_are_noted_for_the_thread(monkeypatch):
    """A rank blocked in a request's ``wait()`` waits for the peers its last ``isend``/``irecv``/
    ``batch_isend_irecv`` posted: the request does not name them (live probe 15: pipelines of
    isend/irecv and of batch_isend_irecv hung unnamed until gloo's timeout)."""
    import threading

    from rankstream.producers.transfer_count import posted_by

    monkeypatch.setattr(distributed_c10d, "isend", lambda tensor, dst=None, group=None, tag=0, group_dst=None: "work")
    monkeypatch.setattr(dist, "isend", distributed_c10d.isend)
    monkeypatch.setattr(distributed_c10d, "irecv", lambda tensor, src=None, group=None, tag=0, group_src=None: "work")
    monkeypatch.setattr(dist, "irecv", distributed_c10d.irecv)

    class Op:
        def __init__(self, op, peer):
            self.op, self.peer = op, peer

    monkeypatch.setattr(distributed_c10d, "batch_isend_irecv", lambda ops: ["work" for _ in ops])
    monkeypatch.setattr(dist, "batch_isend_irecv", distributed_c10d.batch_isend_irecv)
    uninstall = install(lambda: None)
    me = threading.get_ident()
    try:
        dist.isend("tensor", 2)
        assert posted_by(me) == [["send", 2]]
        dist.irecv("tensor", group_src=1)  # as batch_isend_irecv calls it, in the default group
        assert posted_by(me) == [["recv", 1]]
        dist.batch_isend_irecv([Op(dist.irecv, 0), Op(dist.isend, 3)])
        assert posted_by(me) == [["recv", 0], ["send", 3]]
    finally:
        uninstall()
