"""Ctrl-C and SIGTERM to a real ``bertblocks ablate`` process: real signals to its process group (as a terminal
sends Ctrl-C), with a tiny study. Each stop is checked for its exit code (130/143), its last line (how to resume),
the runs it recorded (whole records, reused by the resume), and that no worker process is left running."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bertblocks.ablation import run_study
from bertblocks.ablation.executors import LocalExecutor
from bertblocks.ablation.interrupts import Interrupts
from tests.test_ablation import write_study

#: runs long enough (~seconds each) that the study is still going when the first record appears
TRAIN = {"task": "mlm", "steps": 100, "batch_size": 8, "seq_len": 32, "seeds": [0, 1], "eval_batches": 1}
TOTAL_RUNS = 6  # 3 variants x 2 seeds
#: the bound on every wait: startup of a spawned worker is slow on a loaded machine; a stop must take far less
TIMEOUT = 240


def _start(folder: Path, *options: str) -> tuple[subprocess.Popen[str], Path, Path]:
    study = write_study(folder, train=TRAIN)
    out = folder / "out"
    env = {**os.environ, "BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "bertblocks.cli", "ablate", str(study), "--out", str(out), *options]
    # its own session and process group: the signal reaches the main process and its workers, as Ctrl-C does
    proc = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, study, out


def _wait_for_first_record(proc: subprocess.Popen[str], out: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not list((out / "runs").glob("*.json")):
        if proc.poll() is not None:
            pytest.fail(f"the study ended before any record: {proc.communicate()}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("no run record in time")
        time.sleep(0.02)


def _finish(proc: subprocess.Popen[str]) -> str:
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the study did not stop after the signal")
    return err


def _running_in_group(pgid: int) -> list[str]:
    """Processes of the group that are still alive (a zombie has ended: it only waits to be reaped)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            alive.append(f"{entry.name} {state} {(entry / 'cmdline').read_bytes()[:80]!r}")
    return alive


def _assert_no_worker_left(pgid: int) -> None:
    deadline = time.monotonic() + 10  # the kernel delivers a parent-death SIGKILL promptly; a few seconds' slack
    while _running_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running_in_group(pgid) == []


def _records(out: Path) -> dict[str, dict]:
    records = {p.name: json.loads(p.read_text()) for p in (out / "runs").glob("*.json")}
    for record in records.values():  # whole records, as a finished run writes them
        assert record["status"] == "ok"
        assert "eval_loss" in record["metrics"]
    assert not list((out / "runs").glob(".*.tmp"))  # no record cut short
    return records


def _assert_stopped(err: str, signum: int, out: Path, study: Path, *options: str) -> dict[str, dict]:
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    recorded = _records(out)
    assert 1 <= len(recorded) < TOTAL_RUNS
    name = signal.Signals(signum).name
    assert last.startswith(f"bertblocks ablate: interrupted by {name}: {len(recorded)} of {TOTAL_RUNS} runs")
    assert f"resume: bertblocks ablate {study} --out {out}" in last
    for option in options:
        assert option in last
    assert not (out / "results.csv").exists()  # no summary of a part of the study
    return recorded


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_workers_records_the_finished_runs_and_says_how_to_resume(tmp_path, signum, code):
    proc, study, out = _start(tmp_path, "--workers", "2")
    _wait_for_first_record(proc, out)
    os.killpg(proc.pid, signum)
    err = _finish(proc)
    assert proc.returncode == code, err
    recorded = _assert_stopped(err, signum, out, study, "--workers 2")
    _assert_no_worker_left(proc.pid)
    if signum == signal.SIGINT:
        # the resume reuses every recorded run, byte for byte, and does only the rest
        result = run_study(study, out, workers=0, progress=False, echo=None)
        assert sorted(result.reused) == sorted(name.removesuffix(".json") for name in recorded)
        assert len(result.executed) == TOTAL_RUNS - len(recorded)
        assert {name: json.loads((out / "runs" / name).read_text()) for name in recorded} == recorded


def _read_stderr_until(proc: subprocess.Popen[str], text: str) -> str:
    """What the study wrote to stderr up to ``text`` (read straight from the pipe, so that the test acts the moment
    it appears)."""
    deadline, seen, fd = time.monotonic() + TIMEOUT, b"", proc.stderr.fileno()
    while text.encode() not in seen:
        if time.monotonic() > deadline or proc.poll() is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no {text!r} on stderr: {seen.decode(errors='replace')}")
        if select.select([fd], [], [], 0.05)[0]:
            seen += os.read(fd, 65536)
    return seen.decode(errors="replace")


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    proc, _, out = _start(tmp_path, "--workers", "2")
    _wait_for_first_record(proc, out)
    os.killpg(proc.pid, signal.SIGINT)
    # the second press while the first is being handled (its notice printed, the runs not yet stopped): a fixed
    # sleep instead raced the graceful stop, which a quiet machine finishes in a few milliseconds
    early = _read_stderr_until(proc, "stopping on SIGINT")
    os.killpg(proc.pid, signal.SIGINT)
    err = early + _finish(proc)
    assert proc.returncode == 130, err
    assert "stopped at once by a second SIGINT" in err
    assert "Traceback" not in err
    _records(out)  # what was recorded is whole
    _assert_no_worker_left(proc.pid)


def test_ctrl_c_stops_a_study_running_in_the_main_process(tmp_path):
    proc, study, out = _start(tmp_path, "--workers", "0")
    _wait_for_first_record(proc, out)
    os.killpg(proc.pid, signal.SIGINT)
    err = _finish(proc)
    assert proc.returncode == 130, err
    _assert_stopped(err, signal.SIGINT, out, study, "--workers 0")


def test_ctrl_c_stops_a_study_on_ray(tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    proc, study, out = _start(tmp_path, "--executor", "ray", "--workers", "2")
    _wait_for_first_record(proc, out)
    os.killpg(proc.pid, signal.SIGINT)
    err = _finish(proc)
    assert proc.returncode == 130, err
    _assert_stopped(err, signal.SIGINT, out, study, "--executor ray")
    _assert_no_worker_left(proc.pid)


def test_a_run_that_finishes_while_the_study_stops_is_still_recorded():
    """The wind-down yields a run that finishes after the stop was asked for, and never starts a queued one
    (a thread pool stands in for the process pool: the same futures, no process start-up)."""
    stop = Interrupts()
    stop.signum = signal.SIGINT  # as the handler sets it
    executor = LocalExecutor(1, stop)
    executor._pool = ThreadPoolExecutor(1)  # type: ignore[assignment]
    release = threading.Event()

    def finishing() -> dict:
        release.wait(timeout=30)
        return {"run": "finished during the stop"}

    running = executor._pool.submit(finishing)
    queued = executor._pool.submit(lambda: {"run": "must never start"})
    threading.Timer(0.3, release.set).start()
    outcomes = list(executor._wind_down({running: "a", queued: "b"}))  # type: ignore[dict-item]
    assert outcomes == [("a", {"run": "finished during the stop"})]
    assert queued.cancelled()
