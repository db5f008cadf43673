"""Small files that readers poll (status, sidecars, a page a browser reloads): never half-written."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomically"]


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` under a scratch name of this process's own beside ``path``, then rename it
    over ``path``: a reader sees the old file or the new one, and two processes writing the same
    file (the ranks of one node) never share a scratch file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    if isinstance(data, bytes):
        scratch.write_bytes(data)
    else:
        scratch.write_text(data)
    os.replace(scratch, path)
