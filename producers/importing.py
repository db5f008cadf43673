"""What every file reader shares: input checks, content-derived session ids, the import summary.

Imported data takes the same path as live data (producer, topics, materializer), so it lands in
the same tables. An import first reads and checks every input completely; only when all of it is
good does it publish anything, so a bad file never leaves half an import behind. Each rank's data
is published under a session id derived from the input's bytes: importing the same file again
produces the same batch keys, and the materializer drops the repeat.

Waiting until the data is in DuckDB is the consumers' side (``consumers.imports``).
"""

from __future__ import annotations

import gc
import hashlib
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankstream.schemas.errors import BadInput

__all__ = ["ImportSummary", "content_session_id", "check_input_file", "paused_gc", "MAX_INPUT_BYTES"]

#: Files above this size are refused; nothing rankstream imports legitimately comes close.
MAX_INPUT_BYTES = 64 << 30


@dataclass
class ImportSummary:
    run_id: str
    ranks: dict[int, int] = field(default_factory=dict)  # rank -> records imported
    messages: int = 0
    sessions: list[str] = field(default_factory=list)
    materialized: bool = False
    #: Items that failed validation, published as ``input_rejects`` rows instead.
    rejected: int = 0


def item_as_json(item: Any) -> str:
    """An entry or event of an input file as JSON for its ``input_rejects`` row (cut at 64 kB; what
    JSON cannot say, as its repr). Called after the reader bounded the item's size."""
    return json.dumps(item, default=repr)[:65536]


def check_input_file(path: Path) -> None:
    """Refuse what cannot be an input file, with one line naming it."""
    if path.is_symlink() and not path.exists():
        raise BadInput(f"{path}: broken symbolic link")
    if path.is_dir():
        raise BadInput(f"{path}: is a directory, expected a file")
    if not path.exists():
        raise BadInput(f"{path}: no such file")
    if not path.is_file():  # a FIFO or device would block or never end
        raise BadInput(f"{path}: not a regular file")
    size = path.stat().st_size
    if size == 0:
        raise BadInput(f"{path}: empty file")
    if size > MAX_INPUT_BYTES:
        raise BadInput(f"{path}: {size} bytes is larger than the {MAX_INPUT_BYTES}-byte limit")


@contextmanager
def paused_gc():
    """Pause the cyclic garbage collector while an importer parses: a parsed dump or trace is tens
    of thousands of small objects with no cycles, which reference counting frees. Collecting them
    as they appear took a third of the dump loader's time, and three quarters of orjson's."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def content_session_id(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
    return "import-" + digest.hexdigest()[:16]
