"""``rankstream import fr DIR``: per-rank Flight Recorder dumps into the bus.

Reads the files the way PyTorch's ``fr_trace`` does: every file in DIR whose name starts with
``prefix`` is one rank's dump and the rest of its name is the rank (``rank_0``, ``rank_1``...).
Dumps may be pickle (read with the plain-data unpickler: a pickle that names any class or
function is refused) or JSON, from NCCL or gloo, any torch 2.x dump version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankstream.schemas.config import Config
from rankstream.schemas.errors import BadInput
from rankstream.producers.importing import (
    ImportSummary,
    check_input_file,
    content_session_id,
    publish_ranks,
)
from rankstream.schemas.fields import PayloadError
from rankstream.schemas.fr_dump import entry_from_dump, groups_from_pg_config, status_from_pg_status
from rankstream.schemas.safe_pickle import UnsafePickle, safe_loads

__all__ = ["FrDump", "read_fr_dump", "read_fr_directory", "list_fr_files", "parse_dump_bytes", "publish_fr_dumps"]

_CHUNK = 1000


@dataclass(frozen=True)
class FrDump:
    path: Path
    rank: int
    entries: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    status: dict[str, dict[str, int]]
    backend: str | None
    session_id: str


def read_fr_dump(path: Path, rank: int) -> FrDump:
    """Read and check one dump completely; raises BadInput naming the file and the problem."""
    check_input_file(path)
    raw = path.read_bytes()
    try:
        dump = parse_dump_bytes(raw)
    except (UnsafePickle, ValueError) as exc:
        raise BadInput(f"{path}: {exc}") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
        raise BadInput(f"{path}: not a Flight Recorder dump (expected a map with a list 'entries')")
    entries = []
    for index, entry in enumerate(dump.get("entries", [])):
        try:
            entries.append(entry_from_dump(entry))
        except PayloadError as exc:
            raise BadInput(f"{path}: entry {index}: {exc}") from None
    names = {e["profiling_name"].split(":", 1)[0] for e in entries if ":" in e["profiling_name"]}
    backend = names.pop() if len(names) == 1 else None
    return FrDump(path=path, rank=rank, entries=entries, groups=groups_from_pg_config(dump.get("pg_config"), backend),
                  status=status_from_pg_status(dump.get("pg_status")), backend=backend,
                  session_id=content_session_id(path.name, raw))


def parse_dump_bytes(raw: bytes) -> Any:
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        import json

        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
    return safe_loads(raw)


def list_fr_files(directory: Path, prefix: str = "rank", selected_ranks: set[int] | None = None) -> list[tuple[int, Path]]:
    """``(rank, path)`` of every dump in ``directory``, the way fr_trace names them (``<prefix><rank>``)."""
    if not directory.is_dir():
        raise BadInput(f"{directory}: not a directory")
    pattern = re.compile(re.escape(prefix) + r"(\d+)$")
    found = []
    for path in sorted(directory.iterdir()):
        if not path.name.startswith(prefix):
            continue
        match = pattern.match(path.name)
        if match is None:
            raise BadInput(f"{path}: cannot tell the rank from the file name (expected {prefix}<rank>)")
        rank = int(match.group(1))
        if selected_ranks is None or rank in selected_ranks:
            found.append((rank, path))
    if not found:
        raise BadInput(f"{directory}: no dump files starting with {prefix!r}")
    return found


def read_fr_directory(directory: Path, prefix: str = "rank", selected_ranks: set[int] | None = None) -> list[FrDump]:
    return [read_fr_dump(path, rank) for rank, path in list_fr_files(directory, prefix, selected_ranks)]


def publish_fr_dumps(config: Config, directory: Path, *, prefix: str = "rank",
                     run_id: str | None = None) -> ImportSummary:
    """Check every dump of ``directory``, then publish them through the bus, one producer per rank."""
    dumps = read_fr_directory(directory, prefix)
    world_size = max(len(dumps), max(d.rank for d in dumps) + 1,
                     max((max(g["ranks"]) + 1 for d in dumps for g in d.groups if g["ranks"]), default=0))
    summary = ImportSummary(run_id=run_id or f"fr-{directory.resolve().name}")
    for dump in dumps:
        def fill(producers, dump=dump) -> dict[int, int]:
            producer = producers[dump.rank]
            if dump.backend:
                producer.emit_rank_metadata(backend=dump.backend, metadata={"imported_from": str(dump.path)})
            if dump.groups:
                producer.emit_process_groups(dump.groups)
            for start in range(0, len(dump.entries), _CHUNK):
                producer.emit_fr_entries(dump.entries[start:start + _CHUNK])
            if dump.status:
                producer.set_collectives(dump.status)
            return {dump.rank: len(dump.entries)}

        publish_ranks(config, summary.run_id, [dump.rank], world_size, dump.session_id, fill, summary)
    return summary
