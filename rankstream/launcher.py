"""``rankstream run -- <launcher and script>``: capture and diagnose a job nobody edited.

The job is started with the bootstrap directory first on PYTHONPATH (``rankstream/bootstrap``,
whose ``sitecustomize`` hooks ``init_process_group``: see ``rankstream.autostart``), the run id,
the endpoint and the Flight Recorder switched on in its environment. Before, the embedded broker
and the materializer are started if none runs for this state dir (and only what was started here
is stopped at the end). While the job runs, one status line every few seconds and the live root
cause as soon as the hang watch finds one; ``--on-hang`` says what happens then. At the end, the
analyses run and the verdict, the culprit, step times and the report and timeline paths are
printed; the exit code is the job's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rankstream.autostart import AGREED_RUN_ID, DUMP_REQUEST
from rankstream.schemas.config import Config, ProducerSettings
from rankstream.schemas.errors import BadInput, RankstreamError
from rankstream.schemas.processes import descendants, start_ticks
from rankstream.schemas.settings import RunOptions, absolute_paths, config_env, run_environment, with_overrides

__all__ = ["JobOptions", "run_job", "new_run_id", "BOOTSTRAP_DIR", "ON_HANG"]

#: The directory ``run`` puts first on the job's PYTHONPATH: it holds only the bootstrap.
BOOTSTRAP_DIR = Path(__file__).with_name("bootstrap")
#: What ``--on-hang`` may say: report and wait, also dump every rank, or end the job.
ON_HANG = ("wait", "dump", "kill")
#: Flight Recorder entries per rank when the user did not size the ring.
FR_ENTRIES = 2000
#: After the job, how long to wait for the ranks' last events to be stored (a quarter of it after
#: a failed job, whose dead ranks never say goodbye).
DRAIN_S = 20.0
#: How often the ranks cut a trace batch under ``run`` (unless configured): live status needs no
#: more, and the default 0.1 s made the materializer's per-message cost take the cores a 2-rank
#: job needed (docs/benchmarks.md).
RUN_FLUSH_INTERVAL_S = 1.0
#: How often the live findings are looked up: as often as the hang watch passes. Each lookup is a
#: query the materializer answers on the cores the job needs.
FINDINGS_EVERY_S = 2.0
#: Once no rank has stepped for this long (the watch records a hang after 5 s), they are looked up
#: twice as often: the culprit is then named up to a second sooner.
QUIET_AFTER_S = 2.0
#: How long a killed job may take to end before it is killed for good.
KILL_GRACE_S = 10.0

STEPS_SQL = """
WITH marks AS (
    SELECT rank, step, ts_ns FROM trace_events WHERE run_id = $1 AND cat = 'step' AND name = 'step' AND ph = 'i'
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY ts_ns DESC) <= 11
)
SELECT rank, max(step) AS step, (max(ts_ns) - min(ts_ns)) / nullif(count(*) - 1, 0) / 1e6 AS recent_step_ms,
       max(ts_ns) AS last_ns
FROM marks GROUP BY rank ORDER BY rank
"""


#: A rank is named the slowest only when its recent steps take this much longer than the other
#: ranks' median: in a synchronous job every rank's step lasts as long as the slowest one's, and
#: naming whichever rank measured a few microseconds more made the name wander from line to line.
SLOWER_BY = 1.10


def pace(recent_step_ms: dict[int, float | None]) -> str:
    """The status line's step times: the slowest rank when it stands out, else the common pace."""
    timed = {rank: ms for rank, ms in recent_step_ms.items() if ms is not None}
    if len(timed) < 2:
        return "".join(f", {ms:,.1f} ms/step" for ms in timed.values())
    rank, slowest = max(timed.items(), key=lambda item: (item[1], -item[0]))
    others = statistics.median(ms for other, ms in timed.items() if other != rank)
    if slowest > others * SLOWER_BY:
        return f", slowest rank {rank} ({slowest:,.1f} ms/step, the others {others:,.1f})"
    return f", {statistics.median(timed.values()):,.1f} ms/step, ranks even"


@dataclass(frozen=True)
class JobOptions:
    command: list[str]
    run_id: str | None = None
    #: A profiler window of ``profile_active`` steps every ``profile_every`` steps (0: none).
    profile_every: int = 200
    profile_active: int = 2
    on_hang: str = "wait"
    status_every_s: float = 5.0
    #: ``--on-hang kill`` ends the job once a hang has lasted this long: a shorter pause (a rank
    #: saving a checkpoint while its peers wait) is reported, but the job goes on.
    kill_after_s: float = 30.0


def new_run_id(command: list[str]) -> str:
    """``<script>-<date>-<time>-<random>``: readable, and a different one for every launch."""
    script = next((Path(word).stem for word in command if word.endswith(".py")), Path(command[0]).name)
    script = re.sub(r"[^A-Za-z0-9_.-]+", "-", script)[:40] or "job"
    return f"{script}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def run_job(config: Config, options: JobOptions, say: Callable[[str], None] = print) -> int:
    """Run the job under capture; returns its exit code (a signal N gives 128 + N)."""
    config = absolute_paths(config)
    if config.producer.flush_interval_s == ProducerSettings.flush_interval_s:
        config = with_overrides(config, **{"producer.flush_interval_s": RUN_FLUSH_INTERVAL_S})
    run_id = options.run_id or new_run_id(options.command)
    run_dir = config.run_dir(run_id)
    if _elsewhere(config):
        return _run_on_another_node(config, options, run_id, run_dir, say)
    try:
        started = _ensure_services(config, say)
        run_dir.mkdir(parents=True, exist_ok=True)
    except Exception as exc:  # no capture is no reason to stop the job
        say(f"rankstream: capture could not start ({type(exc).__name__}: {exc}); running the job without it")
        return _exit_code(subprocess.call(options.command))
    env = _job_environment(config, options, run_id, run_dir)
    say(f"rankstream: run {run_id} -> {config.db_path}" + (f" (started {', '.join(started)})" if started else ""))
    if options.run_id and _has_data(config, run_id):
        say(f"rankstream: warning: run {run_id} already holds an earlier launch's data, and this launch's steps and "
            "findings will mix with it: give each launch its own --run (or none)")
    job = _start_job(options.command, env, say)
    if job is None:
        _stop(config, started)
        return 127
    watch = _Watch(config, run_id, run_dir, options, say, started=started)
    received: list[tuple[int, int]] = []
    with _forwarding_signals(job, received):
        killed = watch.follow(job)
    code = _exit_code(job.returncode)
    if received:
        number, at_ns = received[0]
        say(f"rankstream: the job was stopped: {signal.Signals(number).name} was passed on to it")
        watch.ended_ns = watch.ended_ns or at_ns  # ranks that then said nothing ended on it, not of their own
    try:
        watch.finish(drain_s=DRAIN_S if code == 0 else DRAIN_S / 4)
    except Exception as exc:  # the job's own exit code still stands
        say(f"rankstream: the end-of-run analysis failed: {type(exc).__name__}: {exc}")
    finally:
        _stop(config, started)
    return code or (1 if killed else 0)


def _has_data(config: Config, run_id: str) -> bool:
    """Whether a run of that id was captured before (a ``--run NAME`` given twice)."""
    from rankstream.consumers.query import connect

    try:
        return bool(connect(config.db_path, wait_s=5.0).fetchall(
            "SELECT count(*) FROM rank_metadata WHERE run_id = $1", [run_id])[0][0])
    except Exception:  # no database yet, or busy: nothing to warn about that can be seen
        return False


def _job_environment(config: Config, options: JobOptions, run_id: str, run_dir: Path) -> dict[str, str]:
    return {**os.environ, **config_env(config),
            **run_environment(RunOptions(options.profile_every, options.profile_active, run_dir), run_id,
                              bootstrap_dir=BOOTSTRAP_DIR, fr_entries=FR_ENTRIES, chosen=options.run_id is not None)}


def _start_job(command: list[str], env: dict[str, str], say) -> subprocess.Popen | None:
    """The job in a session of its own (signals are forwarded to all of it); None if it cannot start."""
    try:
        return subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as exc:
        say(f"rankstream: cannot start {command[0]}: {exc.strerror or exc}")
        return None


def _elsewhere(config: Config) -> bool:
    """Whether the events go to a broker whose materializer runs on another machine (another node
    of a multi-node job, or a cluster): then this node only launches and captures."""
    if config.uses_embedded_broker:
        return False
    try:
        from rankstream.services import materializer_pid
    except ImportError:  # the plain install: no materializer can run here
        return True
    return materializer_pid(config) is None


def _run_on_another_node(config: Config, options: JobOptions, run_id: str, run_dir: Path, say) -> int:
    """Launch with capture into ``config``'s broker; status and verdict are on the materializer's node."""
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"rankstream: capturing into {config.bootstrap_servers}; live status and the report are where the "
        "materializer runs (`rankstream status` there)")
    job = _start_job(options.command, _job_environment(config, options, run_id, run_dir), say)
    if job is None:
        return 127
    with _forwarding_signals(job, []):
        job.wait()
    return _exit_code(job.returncode)


def _ensure_services(config: Config, say) -> list[str]:
    """Start the broker and materializer unless they run for this state dir; what was started."""
    from rankstream.deploy.broker import broker_status
    from rankstream.services import materializer_pid, up
    from rankstream.spools import deliver_spools

    broker_was_up = not config.uses_embedded_broker or broker_status(config) is not None
    materializer_was_up = materializer_pid(config) is not None
    if broker_was_up and materializer_was_up:
        return []
    up(config)
    delivery = deliver_spools(config)  # what earlier jobs left while nothing was up
    if delivery is not None:
        say(f"rankstream: {delivery.line()}")
    return [name for name, was_up in (("broker", broker_was_up), ("materializer", materializer_was_up))
            if not was_up]


def _stop(config: Config, started: list[str]) -> None:
    """Stop only what ``run`` started (the materializer first: it finishes its transaction)."""
    from rankstream.services import stop_materializer

    if "materializer" in started:
        stop_materializer(config)
    if "broker" in started:
        from rankstream.deploy.broker import stop_broker

        stop_broker(config)


@contextlib.contextmanager
def _forwarding_signals(job: subprocess.Popen, received: list[tuple[int, int]]):
    """Ctrl-C, SIGTERM and SIGHUP go to the whole job (its own session, so each arrives once);
    ``received`` gets (signal, when in ns) for each."""
    def forward(number, frame):
        received.append((number, time.time_ns()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, number)

    previous = {number: signal.signal(number, forward) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Watch:
    """Status lines and live findings while the job runs; the verdict after."""

    def __init__(self, config: Config, run_id: str, run_dir: Path, options: JobOptions, say,
                 started: list[str] = ()) -> None:
        self.config, self.run_id, self.run_dir, self.options, self.say = config, run_id, run_dir, options, say
        self.started = list(started)  # the services ``run`` started, and so keeps running
        self.services_problem = ""  # the last failure to start them again, said once
        self.reported: set[tuple] = set()
        self.open: dict[tuple, str] = {}  # the live findings open at the last look, and what they said
        self.quiet = False  # no rank stepped for QUIET_AFTER_S at the last status
        self.ended_ns: int | None = None  # when --on-hang kill (or a signal passed on) ended the job
        self.database = None

    def _db(self):
        from rankstream.consumers.query import connect

        if self.database is None:
            self.database = connect(self.config.db_path, wait_s=2.0)
        return self.database

    def follow(self, job: subprocess.Popen) -> bool:
        """Until the job ends; True if it was ended here (``--on-hang kill``)."""
        next_status = time.monotonic() + self.options.status_every_s
        while job.poll() is None:
            time.sleep(FINDINGS_EVERY_S / 2 if self.quiet else FINDINGS_EVERY_S)
            self.follow_agreed_id()
            self.keep_services_up()
            try:
                if time.monotonic() >= next_status:
                    next_status = time.monotonic() + self.options.status_every_s
                    self.say(self.status_line())
                if self._new_findings() and self.options.on_hang == "dump":
                    self._dump()
                if self.options.on_hang == "kill" and self._hang_lasted(self.options.kill_after_s):
                    self.say(f"rankstream: --on-hang kill: the hang lasted {self.options.kill_after_s:g} s, "
                             "ending the job")
                    self.ended_ns = time.time_ns()
                    _end(job)
                    return True
            except Exception as exc:  # the database is busy or the materializer restarting: next time
                self.say(f"rankstream: status unavailable: {type(exc).__name__}: {exc}"[:200])
        return False

    def keep_services_up(self) -> None:
        """Start again what ``run`` started and that stopped (killed, out of memory) while the job
        runs. Nothing is lost meanwhile: the ranks keep every message until the materializer
        announces it stored, and resend to a broker that came back without its log."""
        from rankstream.deploy.broker import broker_status
        from rankstream.services import materializer_pid, up

        gone = [name for name in self.started
                if (materializer_pid(self.config) if name == "materializer" else broker_status(self.config)) is None]
        if not gone:
            return
        try:
            up(self.config)
        except Exception as exc:  # said once; tried again at the next look
            problem = f"rankstream: the {' and '.join(gone)} stopped and could not start again: {exc}"
            if problem != self.services_problem:
                self.say(problem[:300])
            self.services_problem = problem
            return
        self.services_problem = ""
        self.database = None  # the query server is a new one
        self.say(f"rankstream: the {' and '.join(gone)} stopped during the run and was started again "
                 "(the ranks resend what was not stored)")

    def follow_agreed_id(self) -> None:
        """Take the run id this node's ranks agreed on, if it is not the one proposed."""
        try:
            agreed = (self.run_dir / AGREED_RUN_ID).read_text().strip()
        except OSError:
            return
        if agreed and agreed != self.run_id:
            self.say(f"rankstream: the ranks joined run {agreed} (proposed by another node's `run`)")
            self.run_id = agreed

    def status_line(self) -> str:
        rows = self._db().arrow(STEPS_SQL, [self.run_id]).to_pylist()
        lag = _ingest_lag(self.config)
        if not rows:
            return f"rankstream: {self.run_id}: no step yet" + lag
        steps = [row["step"] for row in rows]
        text = (f"rankstream: {self.run_id}: {len(rows)} rank{'s' if len(rows) > 1 else ''} at step {min(steps)}"
                + (f"-{max(steps)}" if max(steps) != min(steps) else "")
                + pace({row["rank"]: row["recent_step_ms"] for row in rows}))
        quiet_s = (time.time_ns() - max(row["last_ns"] for row in rows)) / 1e9
        self.quiet = quiet_s >= QUIET_AFTER_S
        if quiet_s > 2 * self.options.status_every_s:
            text += f", no new step for {quiet_s:,.0f} s"
        return text + lag

    def _new_findings(self) -> bool:
        """Print the live findings not printed yet, and those printed that cleared (a pause that
        ended: a checkpoint, a slow rank that caught up), so that no hang is left standing."""
        from rankstream.status import live_findings

        found, current = False, {}
        for finding in live_findings(self._db(), self.run_id):
            key = (finding["kind"], finding["pg_name"], finding["seq"], tuple(finding["culprit_ranks"] or ()))
            current[key] = finding["detail"]
            if key not in self.reported:
                self.reported.add(key)
                found = True
                culprits = finding["culprit_ranks"] or []
                self.say(f"rankstream: {finding['kind'].upper()}: {finding['detail']}"
                         + (f" (culprit rank {', '.join(map(str, culprits))})" if culprits else ""))
        for key, detail in self.open.items():
            if key not in current:
                self.reported.discard(key)  # said again if it comes back
                self.say(f"rankstream: cleared, the ranks moved on: {detail}")
        self.open = current
        return found

    def _hang_lasted(self, seconds: float) -> bool:
        from rankstream.status import live_findings

        return any(finding["for_s"] >= seconds for finding in live_findings(self._db(), self.run_id))

    def _dump(self) -> None:
        """Ask every rank of this node for its Flight Recorder dump and Python stacks."""
        name = f"dump-{time.strftime('%H%M%S')}"
        (self.run_dir / DUMP_REQUEST).write_text(name)
        folder, deadline, count = self.run_dir / name, time.monotonic() + 10, -1
        while time.monotonic() < deadline:
            time.sleep(1.0)
            now = len(list(folder.glob("rank_*")))
            if now and now == count:
                break
            count = now
        self.say(f"rankstream: dumps of {max(count, 0)} rank(s) in {folder}; "
                 f"rankstream diagnose {folder} --prefix rank_")

    def finish(self, drain_s: float) -> None:
        """Wait for the last events, run the analyses, print the verdict and where the report is."""
        from rankstream.flows.collective_analysis import diagnose_run
        from rankstream.flows.diagnosis.loader import fatal_reports
        from rankstream.flows.html_report import html_report_if_possible
        from rankstream.flows.pipeline import analyze_everything
        from rankstream.flows.report import gather_report, render_run_report
        from rankstream.flows.timeline import write_timeline

        self.follow_agreed_id()
        self.keep_services_up()
        self._drain(drain_s)
        self._deliver_spools(drain_s)
        if not self._db().fetchall("SELECT count(*) FROM rank_metadata WHERE run_id = $1", [self.run_id])[0][0]:
            self.say(f"rankstream: nothing was captured for {self.run_id} (no process got through "
                     "init_process_group: none called it, or a rank that never reached it kept the others inside)")
            return
        analyze_everything(self.config.db_path, self.run_id, collectives=False)
        try:
            report, _ = diagnose_run(self.config.db_path, self.run_id, job_over=True, ended_here_ns=self.ended_ns,
                                     fatal=fatal_reports(self.run_dir))
            self.say(f"rankstream: {report.verdict.upper()}: {report.root_cause or 'no problem found'}")
        except BadInput as exc:  # nothing to diagnose: gloo records no send/recv, a job may issue no collective
            self.say(f"rankstream: no collective diagnosis: {exc}")
        data = gather_report(self.config.db_path, self.run_id)
        for row in data["steps"]:
            self.say(f"  rank {row['rank']}: {row['steps']} steps, p50 {row['p50_ms']:,.1f} ms, "
                     f"p99 {row['p99_ms']:,.1f} ms, max {row['max_ms']:,.1f} ms")
        if not data["steps"]:
            self.say("  no step times: the job stepped its optimizer fewer than twice and was not profiled")
        report_path = self.run_dir / "report.txt"
        with open(report_path, "w") as out:
            from rich.console import Console

            render_run_report(self.run_id, data, Console(file=out, width=120, color_system=None))
        try:
            timeline = ", ".join(map(str, write_timeline(self.config.db_path, self.run_id,
                                                         self.run_dir / "timeline.json.gz").files))
        except BadInput as exc:  # no trace events: not profiled, no optimizer to mark steps
            timeline = f"none ({exc})"
        page = html_report_if_possible(self.config.db_path, self.run_id, self.run_dir / "report.html")
        self.say(f"  report {report_path}, {page}; timeline {timeline}")

    def _deliver_spools(self, seconds: float) -> None:
        """What the ranks spooled (a broker they could not reach, a materializer that had not
        confirmed their last messages when they closed) is delivered here, before the analyses."""
        from rankstream.spools import deliver_spools

        try:
            delivery = deliver_spools(self.config, wait_s=seconds)
        except RankstreamError as exc:
            self.say(f"rankstream: the ranks' spools stay on disk: {exc}")
            return
        if delivery is not None:
            self.say(f"rankstream: {delivery.line()}")

    def _drain(self, seconds: float) -> None:
        """Until every rank said goodbye (or ``seconds`` passed): the last batches are on their way."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ended = self._db().fetchall("SELECT count(*) FROM runs WHERE run_id = $1 AND ended_at IS NOT NULL",
                                        [self.run_id])[0][0]
            if ended:
                return
            time.sleep(0.5)


def _ingest_lag(config: Config) -> str:
    from rankstream.consumers.materializer import materializer_lag, materializer_silent_s

    silent = materializer_silent_s(config)
    if silent is not None:
        return (f", the materializer has not reported for {silent:,.0f} s (stopped or stuck: "
                f"{config.state_dir / 'materializer.log'})")
    lag = materializer_lag(config)
    return "" if lag is None else f", ingest lag {lag} messages"


def _end(job: subprocess.Popen) -> None:
    """SIGTERM to the job and every process below it, then SIGKILL to whatever is left after the
    grace. A launcher's workers may sit in sessions of their own (torchrun's do), where a signal
    to the job's process group never arrives, and a rank blocked in a collective may not act on
    SIGTERM: without this, the hung ranks outlived ``--on-hang kill``."""
    tree = descendants(job.pid)
    _signal_all(job, tree, signal.SIGTERM)
    try:
        job.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _signal_all(job, {**tree, **(descendants(job.pid) if job.poll() is None else {})}, signal.SIGKILL)
    job.wait()


def _signal_all(job: subprocess.Popen, tree: dict[int, int | None], number: int) -> None:
    """``number`` to the job's process group and to each process of ``tree`` that is still the
    one recorded (its start time: a pid reused since is someone else's)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, number)
    for pid, started in tree.items():
        if started is not None and start_ticks(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)
