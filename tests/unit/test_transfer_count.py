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

