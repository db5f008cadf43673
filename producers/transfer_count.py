"""Counting the job's point-to-point calls, which gloo leaves out of the Flight Recorder.

A pipeline whose stages move only by ``send``/``recv`` shows no progress in any group, so, live,
a healthy one looked as still as a hung one, and only the verdict after the job named a hang of
transfers alone (``flows.diagnosis.blocked_transfers``). ``install`` wraps the
``torch.distributed`` functions that post a transfer; every call that returns adds one to the
producer's count, which its heartbeats carry (``transfers``). A rank blocked in a transfer that
never completes stops counting, and ``flows.hang_watch`` reads a change of the count as progress,
as it reads a collective completing.

The wrappers also note which transfers the last ``isend``/``irecv``/``batch_isend_irecv`` of a
thread posted (``posted_by``): a rank blocked in a request's ``wait()`` waits for those peers,
which the request does not name. The tap publishes them with the rank's stack.

The wrappers replace the module attributes, so calls made as ``dist.send(...)`` are counted; a
name the job imported before the session started (``from torch.distributed import isend``) keeps
the original function, and its calls are not (``send`` and ``recv`` call ``isend``/``irecv``
through the module in torch 2.13, so theirs still are).
"""

from __future__ import annotations

import functools
import threading
from typing import Callable

__all__ = ["install", "posted_by", "TRANSFER_FUNCTIONS"]

#: The functions that post a point-to-point transfer (``isend``/``irecv`` count when posted).
TRANSFER_FUNCTIONS = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list")
#: The functions that return requests, and the argument naming the peer (a global rank).
_REQUESTS = {"isend": ("send", "dst"), "irecv": ("recv", "src")}

#: Thread id -> the transfers its last request-returning call posted, as ``[op, peer]`` pairs: a
#: rank blocked in a request's ``wait()`` (C++, whose request names no peer) waits for these.
_POSTED: dict[int, list[list]] = {}

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
        wrapper = _counting(original, count, name)
        for module in (distributed_c10d, dist):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapper)
                replaced.append((module, name, original))

    def uninstall() -> None:
        for module, name, original in replaced:
            setattr(module, name, original)

    return uninstall


def posted_by(thread_id: int) -> list[list]:
    """The transfers the thread's last ``isend``/``irecv``/``batch_isend_irecv`` posted, as
    ``[op, peer]`` pairs (``op`` "send" or "recv"; ``peer`` a global rank or None)."""
    return list(_POSTED.get(thread_id, ()))


def _posted(name: str, args: tuple, kwargs: dict) -> list[list] | None:
    if name in _REQUESTS:
        op, argument = _REQUESTS[name]
        peer = kwargs.get(argument, args[1] if len(args) > 1 else None)
        if peer is None and type(kwargs.get(f"group_{argument}")) is int:  # batch_isend_irecv's way
            peer = _global_rank(kwargs.get("group"), kwargs[f"group_{argument}"])
        return [[op, peer if type(peer) is int else None]]
    if name == "batch_isend_irecv":
        operations = kwargs.get("p2p_op_list", args[0] if args else ())
        return [[_name_of(getattr(o, "op", None)).lstrip("i"), getattr(o, "peer", None)] for o in operations]
    return None


def _name_of(function) -> str:
    """``isend`` or ``irecv`` for torch's function or its wrapper."""
    return getattr(function, _MARK, None) or getattr(function, "__name__", "?")


def _global_rank(group, group_rank: int) -> int | None:
    """A rank within ``group`` as a global rank (None when torch cannot say)."""
    try:
        import torch.distributed as dist

        return group_rank if group is None else dist.get_global_rank(group, group_rank)
    except Exception:  # not a group torch knows: the peer stays unknown
        return None


def _counting(function: Callable, count: Callable[[], None], name: str) -> Callable:
    def _rankstream_counted_transfer(*args, **kwargs):  # schemas.stack_frames.WRAPPER_FUNCTION: left out of stacks
        try:
            posted = _posted(name, args, kwargs)
            if posted is not None:
                _POSTED[threading.get_ident()] = posted
        except Exception:  # odd arguments: the call itself says what is wrong with them
            pass
        result = function(*args, **kwargs)
        count()
        return result

    counted = functools.wraps(function)(_rankstream_counted_transfer)
    setattr(counted, _MARK, name)
    return counted
