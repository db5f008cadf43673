"""``rankstream report --html``: the run on one self-contained page.

The page carries plotly.js once, inline, and the figures as one JSON document: it opens offline,
from a laptop after ``scp``, with no network fetch. The charts come from ``report_charts`` (SQL
aggregates, never raw events). Sections follow the order of an investigation: the verdict first,
then who stopped (collective progress), what was slow (steps), where the time went, who talked
to whom, which ops, and whether the figures can be trusted (clocks, ingest).

With ``refresh_s`` the page reloads itself: ``report --html --watch N`` rewrites it every N
seconds while the run is live, so the report is also the live dashboard.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from rankstream.consumers.query import connect
from rankstream.flows import report_charts as charts
from rankstream.schemas.errors import BadInput, ConfigError
from rankstream.schemas.files import write_atomically

__all__ = ["HtmlReport", "write_html_report", "html_report_if_possible", "plotly_js", "run_is_live"]


@dataclass(frozen=True)
class HtmlReport:
    path: Path
    bytes: int
    seconds: float
    charts: int


def plotly_js() -> str:
    """plotly.js as the plotly package ships it (the ``report`` extra)."""
    try:
        import plotly
    except ModuleNotFoundError:
        raise ConfigError("report --html needs the report extra: pip install 'rankstream[report]'") from None
    bundle = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    try:
        return bundle.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"the plotly package has no plotly.min.js ({bundle}): {exc.strerror}") from None


#: A run whose ranks have all been silent this long is over, even if they never said goodbye.
SILENT_S = 120


def run_is_live(db_path: Path, run_id: str) -> bool:
    """Whether some rank has not said goodbye yet and the run was heard from lately."""
    database = connect(db_path)
    ended, last_ns = database.fetchall(
        "SELECT (SELECT count(*) FROM runs WHERE run_id = $1 AND ended_at IS NOT NULL), "
        "(SELECT max(sent_ns) FROM heartbeats WHERE run_id = $1)", [run_id])[0]
    return not ended and last_ns is not None and time.time_ns() - last_ns < SILENT_S * 1e9


def write_html_report(db_path: Path, run_id: str, out: Path, *, refresh_s: float | None = None,
                      ingest_lag: int | None = None) -> HtmlReport:
    """Write the page for ``run_id`` to ``out`` (atomically: a watcher never sees half a page);
    ``ingest_lag``: the materializer's backlog in messages, when the caller can see it."""
    started = time.perf_counter()
    script = plotly_js()
    database = connect(db_path)
    if not database.fetchall("SELECT count(*) FROM rank_metadata WHERE run_id = $1", [run_id])[0][0]:
        raise BadInput(f"no run {run_id!r} in {db_path}")
    body, figures = _sections(database, run_id, ingest_lag)
    page = _page(run_id, body, figures, script, refresh_s)
    out = Path(out)
    write_atomically(out, page)
    return HtmlReport(out, len(page), time.perf_counter() - started, len(figures))


def html_report_if_possible(db_path: Path, run_id: str, out: Path) -> str:
    """For the end of ``run`` and the demo: the page's path, or how to get one (no plotting extra)."""
    try:
        return str(write_html_report(db_path, run_id, out).path)
    except ConfigError:  # no plotly here: the text report is enough
        return "no HTML report (pip install 'rankstream[report]')"


def _sections(database, run_id: str, ingest_lag: int | None) -> tuple[list[str], dict[str, dict]]:
    figures: dict[str, dict] = {}
    parts = [_verdict_section(charts.verdict(database, run_id))]

    def section(title: str, found: list, empty: str, after: str = "") -> None:
        found = [chart for chart in found if chart is not None]
        inner = "".join(_chart_html(chart, figures) for chart in found) or f"<p class=empty>{html.escape(empty)}</p>"
        parts.append(f"<section><h2>{html.escape(title)}</h2>{inner}{after}</section>")

    progress, left_out = charts.collective_charts(database, run_id)
    section("Collective progress", progress, "No Flight Recorder entries in this run.",
            f"<p class=note>{left_out} more group(s) not drawn.</p>" if left_out else "")
    section("Step times", charts.step_charts(database, run_id),
            "No step times: the job marked no steps and was not profiled.",
            _table("Slowest steps", charts.worst_steps(database, run_id),
                   {"rank": "rank", "step": "step", "step_ms": "ms", "times_median": "x its rank's median"}))
    section("Time breakdown", [charts.breakdown_chart(database, run_id)], "No traced ops or kernels to break down.")
    section("Communication matrix", [charts.matrix_chart(database, run_id)], "No communication recorded.")
    section("Top ops and kernels", [charts.top_chart(database, run_id)], "No traced ops.")
    ingest, totals = charts.ingest_chart(database, run_id)
    if ingest_lag is not None:
        totals["materializer backlog (messages, all runs)"] = ingest_lag
    section("Clock alignment and ingest health", [charts.clock_chart(database, run_id), ingest],
            "No clock or heartbeat data.", _table("Totals", [{"what": k, "count": v} for k, v in totals.items()],
                                                  {"what": "", "count": ""}))
    return parts, figures


def _chart_html(chart: charts.Chart, figures: dict[str, dict]) -> str:
    figures[chart.id] = chart.figure
    return (f"<figure><figcaption><b>{html.escape(chart.title)}</b> {html.escape(chart.caption)}</figcaption>"
            f"<div class=plot id=\"{chart.id}\" style=\"height:{chart.height}px\"></div></figure>")


def _verdict_section(found: dict) -> str:
    verdict = found["verdict"]
    findings, episodes = found["findings"], found["episodes"]
    if verdict is None:
        headline = "No collective diagnosis (the run has no Flight Recorder data)"
        tone = "unknown"
    elif not findings:
        headline, tone = "HEALTHY: no problem found in the collectives", "healthy"
    else:
        headline, tone = f"{verdict.upper()}: root cause: {findings[0]['detail']}", "fault"
    rows = "".join(_finding_html(f) for f in findings)
    lived = "".join(
        f"<li><b>{html.escape(e['kind'])}</b> {html.escape(e['detail'] or '')} "
        f"({_episode_span(e)}; culprits {html.escape(_ranks(e['culprit_ranks']))})"
        f"{_stack_html(e['stack'])}</li>" for e in episodes)
    return (f"<section id=verdict class=\"{tone}\"><h2>Verdict</h2><p class=headline>{html.escape(headline)}</p>"
            + (f"<h3>Findings</h3><ol>{rows}</ol>" if rows else "")
            + (f"<h3>Live episodes (the hang watch, while the run ran)</h3><ul>{lived}</ul>" if lived else "")
            + "</section>")


def _finding_html(finding: dict) -> str:
    where = f" in group {finding['pg_name']}" if finding["pg_name"] else ""
    seq = f" at collective #{finding['seq']}" if finding["seq"] is not None else ""
    return (f"<li><b>{html.escape(finding['kind'])}</b>{html.escape(where + seq)}: "
            f"{html.escape(finding['detail'] or '')} (culprits {html.escape(_ranks(finding['culprit_ranks']))}; "
            f"waiting {html.escape(_ranks(finding['waiting_ranks']))}){_stack_html(finding['stack'])}</li>")


def _stack_html(lines: list[str]) -> str:
    return f"<pre>{html.escape(chr(10).join(lines))}</pre>" if lines else ""


def _episode_span(episode: dict) -> str:
    first = time.strftime("%H:%M:%S", time.localtime(episode["first_seen_ns"] / 1e9))
    if episode["cleared_ns"]:
        return f"first seen {first}, cleared after {(episode['cleared_ns'] - episode['first_seen_ns']) / 1e9:.1f} s"
    return f"first seen {first}, still found at the last pass"


def _ranks(ranks) -> str:
    return ", ".join(map(str, ranks)) if ranks else "none"


def _table(title: str, rows: list[dict], columns: dict[str, str]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(label)}</th>" for label in columns.values())
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(row[key]))}</td>" for key in columns) + "</tr>"
                   for row in rows)
    return f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{body}</table>"


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


_STYLE = """
body{font:14px system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px;color:#222}
h1{font-size:20px;margin:16px 0 4px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:14px}section{margin:18px 0}figure{margin:8px 0 18px}figcaption{color:#555;margin-bottom:4px}
#verdict.fault .headline{color:#b00020;font-weight:600;font-size:16px}
#verdict.healthy .headline{color:#1b7f3b;font-weight:600;font-size:16px}
pre{background:#f6f6f6;padding:6px;overflow-x:auto;font-size:12px}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
.empty,.note{color:#777}
"""

_DRAW = """
const figures = JSON.parse(document.getElementById('figures').textContent);
const drawn = Object.entries(figures).map(([id, figure]) =>
  Plotly.newPlot(id, figure.data, figure.layout, {displaylogo: false, responsive: true}));
Promise.all(drawn).then(() => { document.body.dataset.drawn = String(drawn.length); });
"""


def _page(run_id: str, body: list[str], figures: dict[str, dict], script: str, refresh_s: float | None) -> bytes:
    # "</" inside the JSON would end its <script> element early
    data = orjson.dumps(figures, option=orjson.OPT_SERIALIZE_NUMPY).replace(b"</", b"<\\/")
    refresh = f"<meta http-equiv=refresh content=\"{int(refresh_s)}\">" if refresh_s else ""
    written = time.strftime("%Y-%m-%d %H:%M:%S")
    live = f" (live: rewritten every {int(refresh_s)} s)" if refresh_s else ""
    head = (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>{refresh}"
            f"<title>rankstream: {html.escape(run_id)}</title><style>{_STYLE}</style>"
            f"<script>{script}</script></head><body>"
            f"<h1>rankstream report: {html.escape(run_id)}</h1><p class=note>written {written}{live}</p>")
    return (head.encode() + "".join(body).encode()
            + b"<script type=application/json id=figures>" + data + b"</script><script>"
            + _DRAW.encode() + b"</script></body></html>")
