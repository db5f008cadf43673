"""Trace batches parked on disk between the trace importer's two passes.

The first pass parses a file once and converts it into batches as it checks it; nothing may be
published until the whole file is known to be good, and holding the batches in memory would
grow with the file. So they wait on disk, length-prefixed, and the second pass reads them back:
in an anonymous temporary file (gone when closed or when the process dies), or in a named one
when a reader process hands its file to the importer.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

from rankstream.schemas.errors import RankstreamError
from rankstream.schemas.codec import pack_local, unpack_local
from rankstream.schemas.trace import TraceBatch

__all__ = ["BatchFile"]

_LENGTH_BYTES = 4


class BatchFile:
    """Append batches, then iterate over them in order (as many times as needed)."""

    def __init__(self, path: Path | None = None) -> None:
        """An anonymous temporary file, or ``path`` (created, or read back if it exists)."""
        if path is None:
            self._file = tempfile.TemporaryFile(prefix="rankstream-import-")
            self._where = tempfile.gettempdir()
        else:
            self._file = open(path, "r+b" if path.exists() else "w+b")
            self._where = str(path.parent)

    def append(self, batch: TraceBatch) -> None:
        """Park one batch. A full or failing disk is the temporary directory's problem, not the
        input file's, and says so (the importer reports OSErrors while reading as a bad file)."""
        raw = pack_local(batch.to_wire())
        try:
            self._file.seek(0, 2)
            self._file.write(len(raw).to_bytes(_LENGTH_BYTES, "little") + raw)
        except OSError as exc:
            raise RankstreamError(f"cannot park import batches in {self._where} "
                                  f"({exc.strerror or exc}); set TMPDIR to a directory with room") from None

    def __iter__(self) -> Iterator[TraceBatch]:
        self._file.flush()
        self._file.seek(0)
        while header := self._file.read(_LENGTH_BYTES):
            raw = self._file.read(int.from_bytes(header, "little"))
            yield TraceBatch.from_wire(unpack_local(raw))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "BatchFile":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
