"""The diagnosis as text: the verdict and the root cause in one line, then why, then the rest.

Lines stay within 120 columns; long lists of ranks are shortened to ranges.
"""

from __future__ import annotations

import textwrap

from rankstream.flows.diagnosis.findings import Finding

__all__ = ["render_text", "rank_ranges"]

_WIDTH = 120
_STYLE = {"healthy": "green", "straggler": "yellow"}


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``."""
    parts, ranks = [], sorted(ranks)
    start = previous = None
    for rank in ranks + [None]:
        if rank is not None and previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
        start = previous = rank
    return ", ".join(parts)


def _wrapped(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=indent,
                         subsequent_indent=" " * len(indent) + "  ") or [indent]


def _details(finding: Finding, *, stack_depth: int) -> list[str]:
    lines = []
    if finding.culprit_reason:
        lines += _wrapped(finding.culprit_reason, "  why no culprit: ")
    for line in finding.evidence:
        lines += _wrapped(line, "  - ")
    if finding.waiting_ranks:
        lines += _wrapped(f"blocked: ranks {rank_ranges(finding.waiting_ranks)}", "  ")
    if finding.stack and stack_depth:
        lines.append(f"  stack of rank {finding.culprit_ranks[0]} (innermost first):")
        for frame in finding.stack[:stack_depth]:
            lines += _wrapped(f"{frame.get('filename')}:{frame.get('line')} {frame.get('name')}", "    ")
    for line in finding.explains[:10]:
        lines += _wrapped(line, "  explains: ")
    return lines


def render_text(report, *, stack_depth: int = 6) -> list[tuple[str, str | None]]:
    """``(line, style)`` pairs: rich styles for a console, ignored when written plain."""
    verdict = report.verdict
    out: list[tuple[str, str | None]] = []
    head = f"{verdict.upper()}: " + (report.root_cause or "no problem found")
    out += [(line, f"bold {_STYLE.get(verdict, 'red')}") for line in _wrapped(head, "")]
    findings = report.findings
    if findings:
        out += [(line, None) for line in _details(findings[0], stack_depth=stack_depth)]
    if len(findings) > 1:
        out.append((f"{len(findings) - 1} more finding(s):", "bold"))
        for number, finding in enumerate(findings[1:], 2):
            out += [(line, None) for line in _wrapped(f"{number}. [{finding.kind}] {finding.headline()}", "")]
            out += [(line, None) for line in _details(finding, stack_depth=0)[:4]]
    d = report.diagnosis
    tail = f"ranks {rank_ranges(d.ranks)} of {d.world} diagnosed"
    if d.missing:
        tail += f"; no data from ranks {rank_ranges(d.missing)}"
    out.append((tail, "dim"))
    return out
