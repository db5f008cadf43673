"""``rankstream report --html`` in a real headless Chromium (Debian's package, driven by playwright):
a hung gloo run, an imported GPU trace and 1024 ranks x 10,000 steps with one 40 s step planted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from rankstream.consumers.query import connect
from rankstream.demo.job import JobSpec, start_job
from rankstream.flows.html_report import write_html_report
from rankstream.schemas.settings import config_env

from .conftest import cli, free_port

pytestmark = pytest.mark.integration

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import kineto_gpu_generator  # noqa: E402
import report_scale  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.fail("these tests need Chromium: apt-get install chromium (`make test` installs it)")
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def open_page(browser, path: Path, screenshot: Path | None = None) -> tuple[object, list[str], list[str]]:
    """The page loaded and drawn; its JavaScript errors and every URL it tried to fetch."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors, fetched = [], []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("request", lambda request: fetched.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-drawn]", timeout=60_000)
    if screenshot is not None:
        page.screenshot(path=str(screenshot), full_page=True)
    return page, errors, fetched


def assert_every_plot_drawn(page) -> int:
    plots = page.eval_on_selector_all(".plot", "els => els.map(e => e.querySelectorAll('svg.main-svg').length)")
    assert plots and all(count > 0 for count in plots), plots
    assert int(page.get_attribute("body", "data-drawn")) == len(plots)
    return len(plots)


@pytest.fixture(scope="module")
def hung_run(live, tmp_path_factory):
    """4 gloo ranks; rank 1 skips the gradient all-reduce and the others wait for it."""
    spec = JobSpec(run_id=f"h-{uuid.uuid4().hex[:6]}", world_size=4, steps=6, fault="hang", fault_rank=1,
                   master_port=free_port(), report_dir=str(tmp_path_factory.mktemp("hung")), collective_timeout_s=12)
    processes = start_job(spec, config_env(live))
    database, deadline = connect(live.db_path), time.monotonic() + 60
    while time.monotonic() < deadline and not database.fetchall(
            "SELECT count(*) FROM live_findings WHERE run_id = ?", [spec.run_id])[0][0]:
        time.sleep(0.5)  # the hang watch saw it: the page will have an episode to show
    for process in processes:
        process.join(90)
    return spec


def test_a_hung_run_names_its_culprit_on_a_page_that_draws_offline(live, hung_run, browser, tmp_path):
    out = tmp_path / "hung.html"
    done = cli(live, "report", "--run", hung_run.run_id, "--html", "-o", str(out), timeout=300)
    assert str(out) in done.stdout
    page, errors, fetched = open_page(browser, out, tmp_path / "hung.png")
    assert errors == []
    assert all(url.startswith("file:") for url in fetched), fetched  # no network: it opens after scp
    assert assert_every_plot_drawn(page) >= 4
    assert "materializer backlog" in page.inner_text("body")  # ingest health: the lag too
    text = page.inner_text("#verdict")
    assert "root cause" in text and "rank 1" in text, text
    assert page.inner_text("body").index("Verdict") < page.inner_text("body").index("Collective progress")
    marked = page.evaluate("() => document.getElementById('progress-0').data.filter(t => t.name === 'culprit')"
                           ".map(t => t.y)")
    assert marked == [[1]]  # the culprit's cell carries the finding's mark
    last = page.evaluate("() => document.getElementById('progress-0').data[0].z.map(row => row[row.length - 1])")
    assert last[1] != last[0] and last[0] == last[2] == last[3], last  # and its row ends unlike the others
    page.close()


def test_an_imported_gpu_trace_gets_the_gpu_breakdown(live, browser, tmp_path):
    kineto_gpu_generator.generate(tmp_path, ranks=2, steps=4, kernels_per_step=40, seed=3, compress=False)
    run_id = f"gpu-{uuid.uuid4().hex[:6]}"
    traces = sorted(str(p) for p in tmp_path.glob("*.json"))
    cli(live, "import", "trace", *traces, "--run", run_id, timeout=300)
    out = tmp_path / "gpu.html"
    cli(live, "report", "--run", run_id, "--html", "-o", str(out), timeout=300)
    page, errors, _ = open_page(browser, out, tmp_path / "gpu.png")
    assert errors == []
    assert_every_plot_drawn(page)
    assert "Where the time goes (GPU)" in page.inner_text("body")
    assert "No Flight Recorder entries" in page.inner_text("body")
    page.close()


def test_one_stalled_step_among_ten_million_shows(browser, tmp_path):
    db_path = tmp_path / "scale.duckdb"
    with duckdb.connect(str(db_path)) as database:
        report_scale.fill(database, "scale", ranks=1024, steps=10_000, collectives=20,
                          stalled=(517, 7_321, 40_000_000_000))
    out = tmp_path / "scale.html"
    written = write_html_report(db_path, "scale", out)
    assert written.bytes <= 20 << 20
    page, errors, _ = open_page(browser, out, tmp_path / "scale.png")
    assert errors == []
    assert_every_plot_drawn(page)
    worst = page.inner_text("table")  # the slowest steps come first
    assert "517" in worst and "7,321" in worst and "40,000.00" in worst, worst
    hottest = page.evaluate("""() => {
        const z = document.getElementById('steps-heatmap').data[0].z;
        let best = [-1, -1, -1];
        z.forEach((row, r) => row.forEach((v, c) => { if (v !== null && v > best[0]) best = [v, r, c]; }));
        return best; }""")
    assert hottest[0] == 40_000.0 and hottest[1] == 517, hottest  # its cell is the brightest, on its rank's row
    page.close()


LIVE_JOB = """
import os, sys, time
import rankstream
rankstream.init(run_id="RUN", rank=0, world_size=1)
deadline = time.monotonic() + 120
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:  # steps until the test says stop
    rankstream.step()
    time.sleep(0.25)
rankstream.shutdown()
"""


def test_watch_rewrites_a_self_reloading_page_while_the_run_is_live_then_stops(live, tmp_path):
    run_id = f"w-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **config_env(live)}
    stop = tmp_path / "stop"
    job = subprocess.Popen([sys.executable, "-c", LIVE_JOB.replace("RUN", run_id), str(stop)], env=env)
    database, deadline = connect(live.db_path), time.monotonic() + 30
    while time.monotonic() < deadline and not database.fetchall(
            "SELECT count(*) FROM heartbeats WHERE run_id = ?", [run_id])[0][0]:
        time.sleep(0.2)
    out = tmp_path / "live.html"
    watch = subprocess.Popen([sys.executable, "-m", "rankstream", "report", "--run", run_id, "--html", "-o", str(out),
                              "--watch", "1", "--no-refresh"], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not out.exists():
        time.sleep(0.2)
    assert b"http-equiv=refresh content=\"1\"" in out.read_bytes()  # the page reloads itself while live
    stop.touch()
    job.wait(60)
    said, _ = watch.communicate(timeout=120)  # the run ended: the watch writes once more and stops
    assert watch.returncode == 0
    lines = [line for line in said.splitlines() if line.startswith("wrote")]
    assert len(lines) >= 2 and "the run is live" in lines[0] and "the run is live" not in lines[-1], said
    assert b"http-equiv=refresh" not in out.read_bytes()
