"""``rankstream run``: unmodified torchrun jobs on gloo, the real broker and materializer, DuckDB files."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from rankstream.schemas.processes import process_alive
from rankstream.schemas.settings import config_env

from .conftest import cli, free_port

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"


def torchrun(script: str, *args: str, master_port: bool = True) -> list[str]:
    """torchrun on 2 ranks; without ``--master-port`` as most users type it (torchrun then makes a
    random rendezvous id and picks a free port itself)."""
    port = ["--master-port", str(free_port())] if master_port else []
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *port, str(JOBS / script), *args]


def run_id_of(output: str) -> str:
    return re.search(r"rankstream: run (\S+) ->", output).group(1)


def test_an_unmodified_script_is_captured_on_every_rank(make_config):
    assert "rankstream" not in (JOBS / "plain_train.py").read_text().split('"""')[2]  # the code never names it
    config = make_config(broker_port=free_port(), partitions=2)
    result = cli(config, "run", "--profile-every", "5", "--active", "2", "--",
                 *torchrun("plain_train.py", "--steps", "20", master_port=False), check=False, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "HEALTHY" in result.stdout and "report " in result.stdout
    assert "spool" not in result.stderr, result.stderr  # every event was sent, none left for later
    run_id = run_id_of(result.stdout)
    with duckdb.connect(str(config.db_path), read_only=True) as db:
        marks = dict(db.execute("SELECT rank, count(*) FROM trace_events WHERE run_id = ? AND cat = 'step' "
                                "GROUP BY rank", [run_id]).fetchall())
        profiled = dict(db.execute("SELECT rank, count(*) FROM trace_events WHERE run_id = ? AND cat = 'cpu_op' "
                                   "GROUP BY rank", [run_id]).fetchall())
        entries = dict(db.execute("SELECT rank, count(*) FROM fr_entries WHERE run_id = ? GROUP BY rank",
                                  [run_id]).fetchall())
        numbers = db.execute("SELECT list(DISTINCT step ORDER BY step) FROM trace_events WHERE run_id = ? "
                             "AND cat = 'step'", [run_id]).fetchall()[0][0]
        # each ProfilerStep#k starts at the mark of step k, not at a neighbour's
        nearest = db.execute("""
            SELECT p.rank, p.name, m.step FROM trace_events p ASOF JOIN trace_events m
                ON p.rank = m.rank AND m.run_id = p.run_id AND m.cat = 'step' AND p.ts_ns >= m.ts_ns
            WHERE p.run_id = ? AND p.name LIKE 'ProfilerStep#%'""", [run_id]).fetchall()
    assert marks == {0: 20, 1: 20}  # one mark per optimizer step, under the id `run` printed
    assert numbers == list(range(1, 21))  # the mark after iteration k starts step k + 1
    assert nearest and all(name == f"ProfilerStep#{step}" for _, name, step in nearest), nearest
    # iterations 1 to 19: iteration 0's start is unseen, and what follows the last mark is teardown
    assert re.search(r"rank 1: 19 steps", result.stdout), result.stdout
    assert set(profiled) == {0, 1} and min(profiled.values()) > 0
    assert set(entries) == {0, 1} and min(entries.values()) >= 20
    assert (config.state_dir / "runs" / run_id / "report.txt").exists()
    assert not (config.state_dir / "materializer.pid").exists()  # run stopped what it started


def test_the_job_exit_code_is_returned_and_nothing_captured_is_said(make_config):
    config = make_config(broker_port=free_port(), partitions=2)
    result = cli(config, "run", "--", sys.executable, "-c", "import sys; sys.exit(3)", check=False, timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "nothing was captured" in result.stdout


@pytest.mark.timed
@pytest.mark.parametrize("stall_in", ["sleep", "all_gather"])
def test_a_rank_that_stalls_is_named_live_and_kill_ends_the_job(make_config, stall_in):
    """``sleep``: the stalled rank sleeps, its peer waits in the all_reduce; it is named within 10 s.
    ``all_gather``: both ranks are blocked in gloo behind a wrapper (``timeout``): torchrun's workers
    sit in sessions of their own and used to outlive the killed launcher."""
    config = make_config(broker_port=free_port(), partitions=2)
    command = [sys.executable, "-m", "rankstream", "run", "--on-hang", "kill", "--kill-after", "8", "--no-profile",
               "--", "timeout", "250",
               *torchrun("plain_train.py", "--steps", "40", "--skip-rank", "1", "--skip-step", "8", "--timeout-s", "300",
                         "--stall-in", stall_in)]
    started = time.monotonic()
    tag = f"killed-job-{uuid.uuid4().hex}"  # in every process of the job's environment
    process = subprocess.Popen(command, env={**os.environ, **config_env(config), "RANKSTREAM_TEST_TAG": tag},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stalled_at = named_at = ended_at = None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("STALL") and stalled_at is None:
            stalled_at = time.monotonic()
        if "culprit rank 1" in line and named_at is None:
            named_at = time.monotonic()
        if "--on-hang kill" in line and ended_at is None:
            ended_at = time.monotonic()
    code = process.wait(timeout=120)
    output = "".join(lines)
    assert code != 0, output
    assert stalled_at is not None and named_at is not None and ended_at is not None, output
    if stall_in == "sleep":
        assert named_at - stalled_at <= 10, output
    assert ended_at - named_at >= 6, output  # the hang had to last --kill-after 8 s (from when the watch saw it)
    assert time.monotonic() - started < 200  # ended by run, not by the 300 s collective timeout
    assert _processes_with(tag) == [], output


@pytest.mark.timed
def test_a_ddp_job_killed_on_its_hang_ends_with_the_hang_as_its_verdict_not_a_crash(make_config):
    """DDP fed by DataLoader workers; rank 1 stalls before its forward. ``--on-hang kill`` ends the
    job: rank 1, asleep, leaves no word, while its peer says it got the signal. That silence is the
    kill's, not a death (it was read as a crash of rank 1): the verdict stays the hang."""
    config = make_config(broker_port=free_port(), partitions=2)
    command = [sys.executable, "-m", "rankstream", "run", "--on-hang", "kill", "--kill-after", "8", "--no-profile",
               "--", *torchrun("ddp_train.py", "--steps", "40", "--stall-rank", "1", "--stall-step", "10")]
    result = subprocess.run(command, env={**os.environ, **config_env(config)}, capture_output=True, text=True,
                            timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "--on-hang kill" in output, output
    verdicts = [line for line in result.stdout.splitlines() if re.match(r"rankstream: [A-Z]+: root cause", line)]
    assert verdicts and verdicts[-1].startswith("rankstream: HANG: root cause: rank 1 "), output


def test_a_job_that_issues_no_collective_still_gets_its_step_times_and_report(make_config):
    """No Flight Recorder entry (gloo records no send/recv; this job issues no collective at all):
    the end of the run says there was nothing to diagnose and goes on with the rest. It printed
    "the end-of-run analysis failed: BadInput ..." and nothing after it."""
    config = make_config(broker_port=free_port(), partitions=2)
    command = [sys.executable, "-m", "rankstream", "run", "--no-profile", "--", *torchrun("no_collective.py")]
    result = subprocess.run(command, env={**os.environ, **config_env(config)}, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rankstream: no collective diagnosis: " in result.stdout, result.stdout
    assert "analysis failed" not in result.stdout and re.search(r"rank 1: \d+ steps", result.stdout), result.stdout
    assert "  report " in result.stdout, result.stdout


def test_a_pipeline_of_transfers_alone_that_hangs_is_named_live_and_killed(make_config):
    """gloo records no send or recv in the Flight Recorder: a pipeline whose stage 0 stalled went
    unnoticed live (nothing moved in any group, healthy or not) and ran into gloo's timeout. The
    heartbeats' count of transfers and the stages' stacks name the stage that stopped."""
    config = make_config(broker_port=free_port(), partitions=2)
    command = [sys.executable, "-m", "rankstream", "run", "--on-hang", "kill", "--kill-after", "8", "--no-profile",
               "--", "timeout", "250", *torchrun("pipeline.py", "--steps", "400", "--stall-rank", "0",
                                                 "--stall-step", "20", "--timeout-s", "300")]
    started = time.monotonic()
    result = subprocess.run(command, env={**os.environ, **config_env(config)}, capture_output=True, text=True,
                            timeout=280)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "--on-hang kill" in output, output
    assert time.monotonic() - started < 200, output  # ended by run, not by gloo's 300 s timeout
    named = "rank 0 never posted its send to rank 1 (stalled at pipeline.py:"
    assert f"P2P_UNMATCHED: {named}" in result.stdout, output  # live
    assert f"rankstream: HANG: root cause: {named}" in result.stdout, output  # and after the job


def test_a_pipeline_of_transfers_alone_that_moves_is_left_alone(make_config):
    """Its stages spend most of their time blocked in ``recv``, and no group ever moves: only the
    count of transfers says it moves."""
    config = make_config(broker_port=free_port(), partitions=2)
    command = [sys.executable, "-m", "rankstream", "run", "--on-hang", "kill", "--kill-after", "8", "--no-profile",
               "--", *torchrun("pipeline.py", "--steps", "40", "--work-ms", "300")]
    result = subprocess.run(command, env={**os.environ, **config_env(config)}, capture_output=True, text=True,
                            timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "DONE rank 1" in output, output
    assert "P2P_UNMATCHED" not in output and "--on-hang" not in output, output


def test_a_run_name_given_twice_is_warned_about(make_config):
    """``--run NAME`` twice puts two launches in one run: the second one's findings and steps mix
    with the first's (a live probe saw the first launch's deadlock printed during the second)."""
    config = make_config(broker_port=free_port(), partitions=2)
    command = [sys.executable, "-m", "rankstream", "run", "--run", "same-name", "--no-profile", "--",
               *torchrun("no_collective.py")]
    outputs = [subprocess.run(command, env={**os.environ, **config_env(config)}, capture_output=True, text=True,
                              timeout=240).stdout for _ in range(2)]
    assert "already holds an earlier launch" not in outputs[0], outputs[0]
    assert "rankstream: warning: run same-name already holds an earlier launch's data" in outputs[1], outputs[1]


def _processes_with(tag: str, *, also: str = "") -> list[int]:
    """The live processes whose environment holds ``tag`` (and ``also``)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                text = environ.read()
            if tag.encode() in text and also.encode() in text and process_alive(int(entry)):
                found.append(int(entry))
        except (OSError, ValueError):  # not a process, or gone
            continue
    return found


@pytest.mark.timed
@pytest.mark.parametrize("death, ended", [("exit", "without a word"),
                                           ("raise", "on uncaught ValueError: bad batch on rank 1 at step 5")])
def test_a_rank_that_dies_is_named_as_the_crash_not_as_a_skip(make_config, death, ended):
    """Rank 1 dies before the loss all_reduce of step 5, at once (``os._exit``: no exit handler
    runs) or on an exception (its exit record, then atexit's goodbye); torchrun tears its peer
    down. It is the crash: it was reported as having skipped the all_reduce, a hang."""
    config = make_config(broker_port=free_port(), partitions=2)
    result = cli(config, "run", "--no-profile", "--",
                 *torchrun("plain_train.py", "--steps", "40", "--skip-rank", "1", "--skip-step", "5",
                           "--stall-in", death, "--timeout-s", "120"), check=False, timeout=300)
    assert result.returncode != 0, result.stdout + result.stderr
    assert f"rankstream: CRASH: root cause: rank 1 ended {ended}" in result.stdout, result.stdout


def test_a_rank_blocked_in_a_collective_still_ends_on_sigterm(make_config):
    """Python runs signal handlers only between bytecodes, so rankstream's flush-on-SIGTERM handler
    never ran in a rank blocked in gloo, and the rank ignored SIGTERM (torchrun's teardown, a
    user's kill); the signal watch ends it after a flush."""
    config = make_config(broker_port=free_port(), partitions=2)
    tag = f"sigterm-job-{uuid.uuid4().hex}"
    command = [sys.executable, "-m", "rankstream", "run", "--no-profile", "--",
               *torchrun("plain_train.py", "--steps", "40", "--skip-rank", "1", "--skip-step", "3", "--timeout-s", "300",
                         "--stall-in", "all_gather")]
    process = subprocess.Popen(command, env={**os.environ, **config_env(config), "RANKSTREAM_TEST_TAG": tag},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any(line.startswith("STALL") for line in list(lines)) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # both ranks are in gloo now
    ranks = _processes_with(tag, also="LOCAL_RANK=")  # the workers, not torchrun
    assert len(ranks) == 2, "".join(lines)
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while any(process_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        assert not any(process_alive(pid) for pid in ranks), "".join(lines)
    finally:
        for pid in _processes_with(tag):
            os.kill(pid, signal.SIGKILL)
        process.wait(60)


def test_two_launches_on_the_same_master_port_are_two_runs(make_config, tmp_path):
    config = make_config(broker_port=free_port())  # no broker there: the ranks spool, which is fine here
    env = {**os.environ, **config_env(config), "RANKSTREAM_PRODUCER_CLOSE_TIMEOUT_S": "0.5"}
    port = str(free_port())
    seen = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--master-port", port, str(JOBS / "init_train.py")], env=env, capture_output=True,
                              text=True, timeout=180)
        ids = {line.split()[2] for line in done.stdout.splitlines() if line.startswith("RUN_ID")}
        assert len(ids) == 1, done.stdout + done.stderr  # both ranks agree
        seen += ids
    assert len(set(seen)) == 2


def test_the_endpoint_chosen_at_up_is_used_by_later_commands(tmp_path):
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")},
           "RANKSTREAM_STATE_DIR": str(tmp_path / "state"), "RANKSTREAM_TOPIC_PREFIX": "endpoint"}

    def rankstream(*args):
        return subprocess.run([sys.executable, "-m", "rankstream", *args], env=env, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)

    up = rankstream("up", "--broker-port", str(port), "--db", str(tmp_path / "chosen.duckdb"))
    try:
        assert up.returncode == 0, up.stderr
        status = rankstream("status")
        assert f"127.0.0.1:{port}" in status.stdout and "chosen.duckdb" in status.stdout, status.stdout
        exports = rankstream("env").stdout
        assert f"export RANKSTREAM_BROKER_PORT={port}" in exports
    finally:
        rankstream("down")
    assert f"127.0.0.1:{port}" not in rankstream("status").stdout


def test_profile_opens_a_window_on_the_requested_rank_only(make_config):
    config = make_config(broker_port=free_port(), partitions=2)
    env = {**os.environ, **config_env(config)}
    job = subprocess.Popen([sys.executable, "-m", "rankstream", "run", "--no-profile", "--run", "asked", "--",
                            *torchrun("plain_train.py", "--steps", "4000")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until both ranks are stepping
            steps = cli(config, "sql", "SELECT count(DISTINCT rank) FROM trace_events WHERE run_id = 'asked' "
                                       "AND cat = 'step'", "--csv", check=False).stdout.split()
            if steps[-1:] == ["2"]:
                break
            time.sleep(1)
        asked = cli(config, "profile", "--run", "asked", "--ranks", "1", "--active", "2", timeout=180)
        assert "rank 1:" in asked.stdout and "rank 0:" not in asked.stdout, asked.stdout
        assert re.search(r"rank 1: [1-9][0-9,]* events in 2 steps", asked.stdout), asked.stdout
        profiled = cli(config, "sql", "SELECT DISTINCT rank FROM trace_events WHERE run_id = 'asked' "
                                      "AND cat = 'cpu_op'", "--csv").stdout.split()
        assert profiled[1:] == ["1"], profiled  # the other rank was never profiled
    finally:
        job.terminate()
        job.communicate(timeout=120)


def test_two_nodes_on_one_broker_make_one_run(make_config, tmp_path):
    """Two torchrun launches as two nodes (--nnodes 2, node ranks 0 and 1), each under `run`: the
    head runs the broker (bound to every address) and the materializer; the other node gets only
    `rankstream env`'s exports and its own state dir, as on another machine."""
    head = make_config(broker_port=free_port(), partitions=2)
    head_env = {**os.environ, **config_env(head)}
    up = cli(head, "up", "--bind", "0.0.0.0", "--advertise", "127.0.0.1")
    assert "anyone who reaches that port" in up.stderr
    try:
        exports = dict(line.removeprefix("export ").split("=", 1) for line in cli(head, "env").stdout.splitlines())
        assert exports["RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS"] == f"127.0.0.1:{head.broker_port}"
        other_env = {**{k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")},
                     "RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS": exports["RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS"],
                     "RANKSTREAM_TOPIC_PREFIX": exports["RANKSTREAM_TOPIC_PREFIX"],
                     "RANKSTREAM_STATE_DIR": str(tmp_path / "other-node")}
        port = str(free_port())

        def node(rank: int, env: dict) -> subprocess.Popen:
            command = [sys.executable, "-m", "rankstream", "run", "--no-profile", "--",
                       sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
                       "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port,
                       str(JOBS / "plain_train.py"), "--steps", "15"]
            return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    cwd=tmp_path)

        nodes = [node(0, head_env), node(1, other_env)]
        outputs = [n.communicate(timeout=300)[0] for n in nodes]
        assert [n.returncode for n in nodes] == [0, 0], outputs
        assert "capturing into 127.0.0.1" in outputs[1]
        run_id = run_id_of(outputs[0])
        ranks = cli(head, "sql", f"SELECT list(DISTINCT rank ORDER BY rank) FROM trace_events WHERE run_id = '{run_id}' "
                                 "AND cat = 'step'", "--csv").stdout.split("\n")[1]
        assert ranks.strip('"') == "[0, 1, 2, 3]", ranks
        runs = cli(head, "sql", "SELECT count(DISTINCT run_id) FROM ranks", "--csv").stdout.split()
        assert runs[-1] == "1"
    finally:
        cli(head, "down", check=False)


@pytest.mark.timed
def test_dump_on_hang_writes_every_rank_s_dump_and_stacks(make_config):
    config = make_config(broker_port=free_port(), partitions=2)
    command = [sys.executable, "-m", "rankstream", "run", "--on-hang", "dump", "--no-profile", "--",
               *torchrun("plain_train.py", "--steps", "40", "--skip-rank", "1", "--skip-step", "6", "--timeout-s", "300")]
    process = subprocess.Popen(command, env={**os.environ, **config_env(config)}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    folder, lines = None, []
    try:
        for line in process.stdout:
            lines.append(line)
            found = re.search(r"dumps of \d+ rank\(s\) in (\S+);", line)
            if found:
                folder = Path(found.group(1))
                break
    finally:
        process.send_signal(signal.SIGINT)  # forwarded to the whole job
        rest, _ = process.communicate(timeout=120)
    output = "".join(lines) + rest
    assert folder is not None, output
    assert sorted(p.name for p in folder.glob("rank_*")) == ["rank_0", "rank_1"], output
    stacks = (folder / "stacks_rank1.txt").read_text()
    assert "plain_train.py" in stacks  # where rank 1 is stuck (its sleep, outside any collective)
    diagnosis = subprocess.run([sys.executable, "-m", "rankstream", "diagnose", str(folder), "--prefix", "rank_",
                                "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(diagnosis.stdout)["verdict"] != "healthy", diagnosis.stdout + diagnosis.stderr
    assert process.returncode != 0
    assert "rankstream: the job was stopped: SIGINT was passed on to it" in output, output
    verdicts = [line for line in output.splitlines() if re.match(r"rankstream: [A-Z]+: root cause", line)]
    assert verdicts and verdicts[-1].startswith("rankstream: HANG: root cause: rank 1 "), output  # not a crash


def test_when_capture_cannot_start_the_job_still_runs_with_one_warning(make_config):
    with socket.socket() as taken:  # another program holds the broker's port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = make_config(broker_port=taken.getsockname()[1])
        result = cli(config, "run", "--", sys.executable, "-c", "print('the job ran')", check=False, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "running the job without it" in result.stdout and "the job ran" in result.stdout
    assert result.stdout.count("rankstream:") == 1


def _run_in_background(config, *job_args: str) -> tuple[subprocess.Popen, list[str]]:
    """``rankstream run --no-profile -- torchrun plain_train.py ...``, its output lines collected."""
    command = [sys.executable, "-m", "rankstream", "run", "--no-profile", "--", *torchrun("plain_train.py", *job_args)]
    process = subprocess.Popen(command, env={**os.environ, **config_env(config)}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    return process, lines


def _wait_for_line(lines: list[str], pattern: str, count: int = 1, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(bool(re.search(pattern, line)) for line in list(lines)) < count:
        assert time.monotonic() < deadline, f"no {pattern!r} in:\n" + "".join(lines)
        time.sleep(0.2)


def _step_marks(config, output: str) -> dict[int, int]:
    with duckdb.connect(str(config.db_path), read_only=True) as db:
        return dict(db.execute("SELECT rank, count(*) FROM trace_events WHERE run_id = ? AND cat = 'step' "
                               "GROUP BY rank", [run_id_of(output)]).fetchall())


def test_a_materializer_killed_mid_run_is_started_again_and_nothing_is_lost(make_config):
    config = make_config(broker_port=free_port(), partitions=2)
    process, lines = _run_in_background(config, "--steps", "60", "--device-ms", "150")
    _wait_for_line(lines, r"ranks at step \d+")
    killed = int((config.state_dir / "materializer.pid").read_text().split()[0])
    os.kill(killed, signal.SIGKILL)
    process.wait(timeout=180)
    output = "".join(lines)
    assert process.returncode == 0, output
    assert "the materializer stopped during the run and was started again" in output, output
    assert "HEALTHY" in output, output
    assert _step_marks(config, output) == {0: 60, 1: 60}  # every mark, the ones sent while it was down too
    assert not (config.state_dir / "materializer.pid").exists()  # the new one was stopped too: run started it


def test_what_the_ranks_spooled_at_close_is_delivered_before_the_verdict(make_config):
    """The materializer is frozen while the job ends: the ranks' last messages are unconfirmed
    when they close, so they spool them. ``run`` delivers the spools before its analyses."""
    config = make_config(broker_port=free_port(), partitions=2, **{"producer.close_timeout_s": 2.0})
    process, lines = _run_in_background(config, "--steps", "30", "--device-ms", "100")
    _wait_for_line(lines, r"ranks at step \d+")
    frozen = int((config.state_dir / "materializer.pid").read_text().split()[0])
    os.kill(frozen, signal.SIGSTOP)
    try:
        _wait_for_line(lines, r"rank \d: [\d,]+ events sent, [1-9][\d,]* bytes left in the spool", count=2)
    finally:
        os.kill(frozen, signal.SIGCONT)
    process.wait(timeout=180)
    output = "".join(lines)
    assert process.returncode == 0, output
    assert re.search(r"rankstream: delivered [\d,]+ spooled events", output), output
    assert not list((config.state_dir / "spool").rglob("*.seg")), output
    assert _step_marks(config, output) == {0: 30, 1: 30}
    assert "HEALTHY" in output, output
