"""A published stack: what the rank-side tap records of the training thread's frames, and what
the diagnosis reads back (``flows.diagnosis.published_stacks``).

Each frame is ``{"name", "filename", "line"}``, innermost first. A frame of torch.distributed's
own functions also carries the integer arguments that name the other side of the call
(``args``: a receive's ``src``, a send's ``dst``, a broadcast's root): gloo's Flight Recorder
records no send or receive and no root, so a rank blocked in one says only through them whom it
waits for. The innermost frame says whether it holds a request of torch.distributed
(``waits_on_request``), or is calling a method named ``wait`` (``dist.irecv(t, 1).wait()`` holds
the request nowhere): ``req.wait()`` on an ``isend``/``irecv`` request is C++, so the job's own
line is the innermost frame, and without this the rank looked stalled in its own code. A ``wait``
written in Python (``threading.Event``'s) would be the innermost frame itself.
"""

from __future__ import annotations

import dis
from types import FrameType

__all__ = ["C10D_MODULE", "PEER_ARGUMENTS", "WRAPPER_FUNCTION", "frame_records"]

#: The module of torch's collective and point-to-point functions (its wrappers live beside it).
C10D_MODULE = "torch/distributed/distributed_c10d.py"
#: The arguments of those functions that name a rank: global ranks, or ranks within ``group``.
PEER_ARGUMENTS = ("src", "dst", "group_src", "group_dst")
#: The frames kept, innermost first.
MAX_FRAMES = 40
#: The function rankstream wraps the job's ``torch.distributed`` transfers in, to count them
#: (``producers.transfer_count``). Its frames are left out of every stack read, so the frame that
#: called the transfer is the job's own, as without the wrapper.
WRAPPER_FUNCTION = "_rankstream_counted_transfer"


def frame_records(frame: FrameType | None) -> list[dict]:
    """The stack from ``frame`` outwards, innermost first (see the module docstring)."""
    records = []
    while frame is not None and len(records) < MAX_FRAMES:
        code = frame.f_code
        if code.co_name == WRAPPER_FUNCTION:
            frame = frame.f_back
            continue
        record = {"name": code.co_name, "filename": code.co_filename, "line": frame.f_lineno}
        if code.co_filename.replace("\\", "/").endswith(C10D_MODULE):
            args = {name: value for name in PEER_ARGUMENTS
                    if type(value := frame.f_locals.get(name)) is int}  # never repr an object of the job
            if args:
                record["args"] = args
        elif not records and (_calling(frame) == "wait" or any(_is_request(v) for v in frame.f_locals.values())):
            record["waits_on_request"] = True
        records.append(record)
        frame = frame.f_back
    return records


def _is_request(value) -> bool:
    """A torch.distributed request (``Work``), or a list of them (``batch_isend_irecv``'s)."""
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    kind = type(value)
    return kind.__name__ == "Work" and kind.__module__.startswith("torch")


def _calling(frame: FrameType) -> str | None:
    """The name of the method or attribute the frame loaded last before its current instruction:
    the method it is calling when it waits in one."""
    name = None
    for instruction in dis.get_instructions(frame.f_code):
        if instruction.offset > frame.f_lasti:
            break
        if instruction.opname in ("LOAD_METHOD", "LOAD_ATTR"):
            name = instruction.argval
    return name
