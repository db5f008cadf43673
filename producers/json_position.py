"""Where a JSON text first goes wrong, as a byte offset, for the importers' one-line errors.

The readers parse with ijson (traces) and the standard library (dumps); neither says where in
the file the problem is. On the error path only, the text is parsed again with orjson, whose
error carries the position of the first problem, as a character index: it is turned into a byte
offset here. A stream is read in growing windows from a known-good point, so a bad byte near the
end of a large file costs a window's parse, not the whole file in memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO

import orjson

__all__ = ["JsonProblem", "first_problem", "first_problem_in_stream"]

#: The first window read by :func:`first_problem_in_stream`, doubled while the text ends too early.
FIRST_WINDOW = 1 << 20
#: Past this much text the search stops (the error names no offset then).
MAX_WINDOW = 64 << 20
_POSITION = re.compile(r": line \d+ column \d+ \(char \d+\)$")
_TRUNCATED = "unexpected end of data"


@dataclass(frozen=True)
class JsonProblem:
    offset: int
    what: str
    #: The text ended before the value did: more text may still make it parse.
    truncated: bool

    def describe(self, base: int = 0, of: str = "") -> str:
        """``at byte N: what`` for an error line, the offset counted from ``base``."""
        return f"at byte {base + self.offset:,}{of}: {self.what}"


def first_problem(text: bytes) -> JsonProblem | None:
    """The first problem of ``text`` as one JSON document; None if it parses."""
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        earlier = first_problem(text[:exc.start])
        if earlier is not None and not earlier.truncated:
            return earlier
        truncated = exc.reason == _TRUNCATED
        return JsonProblem(exc.start, "unexpected end of data" if truncated else f"not UTF-8 ({exc.reason})",
                           truncated)
    try:
        orjson.loads(decoded)
        return None
    except orjson.JSONDecodeError as exc:
        what = _POSITION.sub("", str(exc))
        return JsonProblem(len(decoded[:exc.pos].encode()), what, what.startswith(_TRUNCATED))


def first_problem_in_stream(raw: BinaryIO, lead: bytes = b"") -> JsonProblem | None:
    """The first problem of ``lead`` followed by what ``raw`` holds from where it stands, with the
    offset counted in ``raw`` from there (``lead`` turns the middle of a document into the
    beginning of one: ``[`` before the elements of an array). None if it parses, or if no problem
    shows within ``MAX_WINDOW`` bytes."""
    text, wanted = b"", FIRST_WINDOW
    while True:
        block = raw.read(wanted - len(text))
        text += block
        at_end = len(text) < wanted
        problem = first_problem(lead + text)
        if problem is None:
            return None
        if at_end or not problem.truncated:
            return JsonProblem(max(0, problem.offset - len(lead)), problem.what, problem.truncated)
        if wanted >= MAX_WINDOW:
            return None
        wanted *= 2
