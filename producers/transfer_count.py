"""Counting the job's point-to-point calls, which gloo leaves out of the Flight Recorder.

A pipeline whose stages move only by ``send``/``recv`` shows no progress in any group, so, live,
a healthy one looked as still as a hung one, and only the verdict after the job named a hang of
transfers alone (``flows.diagnosis.blocked_transfers``). ``install`` wraps the
``torch.distributed`` functions that post a transfer; every call that returns adds one to the
producer's count, which its heartbeats carry (``transfers``). A rank blocked in a transfer that
never completes stops counting, and ``flows.hang_watch`` reads a change of the count as progress,
as it reads a collective completing.

The wrappers replace the module attributes, so calls made as ``dist.send(...)`` are counted; a
name the job imported before the session started (``from torch.distributed import send``) keeps
the original function, and its calls are not.
"""

from __future__ import annotations

import functools
from typing import Callable

__all__ = ["install", "TRANSFER_FUNCTIONS"]

#: The functions that post a point-to-point transfer (``isend``/``irecv`` count when posted).
TRANSFER_FUNCTIONS = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list")

_MARK = "__rankstream_counted__"


def install(count: Callable[[], None]) -> Callable[[], None]:
    """Wrap the transfer functions of ``torch.distributed`` so each call that returns calls
    ``count``; returns the function that puts the originals back. Does nothing (and returns a
    no-op) when torch.distributed is not available or the functions are already wrapped."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
    except Exception:  # no torch, or a build without distributed: nothing to count
        return lambda: None
    replaced: list[tuple[object, str, Callable]] = []
    for name in TRANSFER_FUNCTIONS:
        original = getattr(distributed_c10d, name, None)
        if original is None or getattr(original, _MARK, False):
            continue
        wrapper = _counting(original, count)
        for module in (distributed_c10d, dist):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapper)
                replaced.append((module, name, original))

    def uninstall() -> None:
        for module, name, original in replaced:
            setattr(module, name, original)

    return uninstall


def _counting(function: Callable, count: Callable[[], None]) -> Callable:
    def _rankstream_counted_transfer(*args, **kwargs):  # schemas.stack_frames.WRAPPER_FUNCTION: left out of stacks
        result = function(*args, **kwargs)
        count()
        return result

    counted = functools.wraps(function)(_rankstream_counted_transfer)
    setattr(counted, _MARK, True)
    return counted
