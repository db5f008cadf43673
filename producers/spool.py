"""The local spool: where encoded messages wait on disk while the broker cannot take them.

Messages are appended to segment files in ``<spool_dir>/<run_id>/rank<rank>/``. The directory is
per run and rank, not per process, so a restarted rank also resends what its previous process
left behind (the materializer drops the repeats by batch key). Total size is capped; a message
that does not fit is refused and the caller counts it as dropped. Disk errors never propagate:
the spool just reports that it could not take the message.

Record layout: ``u16 topic length, u16 key length, u32 value length, u32 events`` then the bytes.
The top bit of ``events`` marks a resend after a broker restart (older segments never set it).

Each rank's directory has an ``acked/`` area beside it (:meth:`Spool.area`): segments the broker
acknowledged that the materializer has not yet announced as stored (``producers.unconfirmed``).
They go back to the spool proper whenever they must be sent again.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rankstream.schemas.codec import peek_sequence
from rankstream.schemas.config import path_safe
from rankstream.schemas.processes import process_alive

__all__ = ["Spool", "SpooledMessage", "left_behind", "abandoned"]

_HEADER = struct.Struct("<HHII")
_RESEND_BIT = 1 << 31
_SEGMENT_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class SpooledMessage:
    topic: str
    key: bytes
    value: bytes
    events: int
    #: Sent again after a broker restart, so its events are not counted as sent twice.
    resend: bool = False
    #: ``(stream, session_id, seq)`` of its envelope: what the materializer's announcements name.
    sequence: tuple[str, str, int] | None = None


class Spool:
    def __init__(self, root: Path, run_id: str, rank: int, *, max_bytes: int, area: str = "",
                 flush_each: bool = True) -> None:
        """``flush_each``: flush every message to the OS at once (a crash loses none of them); off
        for the acked area, whose messages the broker holds too, where it halves the sender's writes."""
        self.directory = Path(root) / path_safe(run_id) / f"rank{rank}"
        if area:
            self.directory = self.directory / area
        self._root, self._run_id, self._rank = Path(root), run_id, rank
        self._flush_each = flush_each
        self.max_bytes = max_bytes
        self.last_error: str | None = None
        #: Size of the last message refused for the cap (0: none yet), see :meth:`would_refuse`.
        self._refused_size = 0
        self._writer = None
        self._writer_path: Path | None = None
        self._writer_size = 0
        self._bytes = self._scan_size()

    def area(self, name: str) -> "Spool":
        """Another spool beside this one (``<rank dir>/<name>``), with the same cap; not flushed per message."""
        return Spool(self._root, self._run_id, self._rank, max_bytes=self.max_bytes, area=name, flush_each=False)

    def _scan_size(self) -> int:
        try:
            return sum(p.stat().st_size for p in self.directory.glob("*.seg"))
        except OSError:
            return 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def has_pending(self) -> bool:
        return self._bytes > 0

    def would_refuse(self) -> bool:
        """Whether a message as big as the last one refused would be refused now: the spool is
        still that full. It takes messages again once replay removes a segment."""
        return self._refused_size > 0 and self._bytes + self._refused_size > self.max_bytes

    def append(self, message: SpooledMessage) -> bool:
        """Write a message; False when it would exceed the cap or the disk refused it."""
        topic = message.topic.encode()
        size = _HEADER.size + len(topic) + len(message.key) + len(message.value)
        if self._bytes + size > self.max_bytes:
            self._refused_size = size
            return False
        try:
            if self._writer is None or self._writer_size >= _SEGMENT_BYTES:
                self._open_segment()
            self._writer.write(_HEADER.pack(len(topic), len(message.key), len(message.value),
                                           message.events | (_RESEND_BIT if message.resend else 0)))
            self._writer.write(topic)
            self._writer.write(message.key)
            self._writer.write(message.value)
            if self._flush_each:
                self._writer.flush()
        except OSError as exc:
            self.last_error = f"spool {self.directory}: {exc.strerror or exc}"
            self._close_writer()
            return False
        self._writer_size += size
        self._bytes += size
        return True

    def _open_segment(self) -> None:
        self._close_writer()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._writer_path = self.directory / f"{time.time_ns():020d}-{os.getpid()}.seg"
        self._writer = open(self._writer_path, "ab")
        self._writer_size = 0

    def _close_writer(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError:
                pass
        self._writer = None

    def oldest_segment(self) -> Path | None:
        """The oldest segment, sealing the one being written if it is the only one left."""
        try:
            segments = sorted(self.directory.glob("*.seg"))
        except OSError:
            return None
        if not segments:
            return None
        self._seal(segments[0])
        return segments[0]

    @staticmethod
    def read_segment(path: Path) -> Iterator[SpooledMessage]:
        """Messages of one segment; a torn record at the end (crash mid-write) is ignored."""
        try:
            data = path.read_bytes()
        except OSError:
            return
        position = 0
        while position + _HEADER.size <= len(data):
            topic_len, key_len, value_len, events = _HEADER.unpack_from(data, position)
            start = position + _HEADER.size
            end = start + topic_len + key_len + value_len
            if end > len(data):
                return
            topic = data[start:start + topic_len].decode()
            key = data[start + topic_len:start + topic_len + key_len]
            value = data[start + topic_len + key_len:end]
            yield SpooledMessage(topic, key, value, events & ~_RESEND_BIT, resend=bool(events & _RESEND_BIT),
                                 sequence=peek_sequence(value))
            position = end

    @property
    def current_segment(self) -> Path | None:
        """The segment the last ``append`` wrote to."""
        return self._writer_path

    def segments(self) -> list[Path]:
        try:
            return sorted(self.directory.glob("*.seg"))
        except OSError:
            return []

    def move_segment(self, path: Path, to: "Spool") -> Path | None:
        """Move a segment of this spool into ``to`` (a rename: no copy), named as written by this
        process so that no other process takes it for left behind. Its new path, or None if the
        disk refused."""
        self._seal(path)
        target = to.directory / f"{path.stem.split('-')[0]}-{os.getpid()}.seg"
        try:
            size = path.stat().st_size
            to.directory.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
        except OSError as exc:
            self.last_error = f"spool {path}: {exc.strerror or exc}"
            return None
        self._bytes = max(0, self._bytes - size)
        to._bytes += size
        return target

    def _seal(self, path: Path) -> None:
        if path == self._writer_path:
            self._close_writer()
            self._writer_path = None

    def remove_segment(self, path: Path) -> None:
        self._seal(path)
        try:
            size = path.stat().st_size
            path.unlink()
            self._bytes = max(0, self._bytes - size)
        except OSError as exc:
            self.last_error = f"spool {path}: {exc.strerror or exc}"

    def close(self) -> None:
        self._close_writer()


def left_behind(root: Path) -> list[Path]:
    """The segments under ``root`` (acknowledged ones included) that no running producer will send
    itself (the process that wrote each is named in its file name), oldest first."""
    found = [*Path(root).glob("*/rank*/*.seg"), *Path(root).glob("*/rank*/acked/*.seg")]
    return sorted((path for path in found if not _writer_alive(path)), key=lambda p: p.name)


def abandoned(spool: Spool) -> list[Path]:
    """The segments of ``spool`` whose writer process is gone, oldest first."""
    return [path for path in spool.segments() if not _writer_alive(path)]


def _writer_alive(path: Path) -> bool:
    try:
        writer = int(path.stem.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return True  # not a segment name of ours: leave it alone
    return process_alive(writer)
