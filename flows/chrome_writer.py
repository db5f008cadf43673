"""Writes a Chrome trace JSON object as a stream: event lines straight from Arrow string buffers.

The timeline's queries render each event as one JSON text in SQL (``to_json``), each led by
``LINE_SEPARATOR``; this writer copies the column's data buffer to the file as it is, with no Python
string per event, and closes the object with its ``otherData``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO

import numpy as np
import pyarrow as pa

__all__ = ["ChromeTraceWriter", "LINE_SEPARATOR"]

#: What comes before every event line but the file's first.
LINE_SEPARATOR = b",\n"


class ChromeTraceWriter:
    """The JSON object to a plain or gzip file, a query's lines at a time."""

    def __init__(self, path: Path, t0_ns: int, run_id: str) -> None:
        self.path = path
        opener = gzip.open if path.name.endswith(".gz") else open
        self._file: IO[bytes] = opener(path, "wb")
        self._file.write(b'{"traceEvents": [\n')
        self._first = True
        self.events = 0
        self._other = {"run_id": run_id, "t0_ns": t0_ns, "clock": "aligned (see clock_offsets)", "writer": "rankstream"}

    def write_lines(self, lines: pa.Table) -> None:
        """``lines``' one column holds events each led by ``LINE_SEPARATOR`` (see ``flows.timeline``):
        its data buffers are written as they are, with no Python string per event."""
        for chunk in lines.column(0).chunks:
            text = _text_bytes(chunk)
            if self._first and len(text):
                text = text[len(LINE_SEPARATOR):]  # the array's first element has none
                self._first = False
            self._file.write(text)
            self.events += len(chunk)

    def close(self) -> None:
        self._file.write(('\n],\n"displayTimeUnit": "ms",\n"otherData": ' + json.dumps(self._other) + "}\n").encode())
        self._file.close()


def _text_bytes(strings: pa.Array) -> memoryview:
    """A string array's values back to back, straight from its data buffer (no value is null:
    every line is a ``to_json`` object)."""
    if not len(strings):
        return memoryview(b"")
    _, offsets, data = strings.buffers()
    width = 8 if pa.types.is_large_string(strings.type) else 4
    ends = np.frombuffer(offsets, dtype=f"<i{width}", count=len(strings) + 1, offset=strings.offset * width)
    return memoryview(data)[ends[0]:ends[-1]]
