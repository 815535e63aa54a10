"""Ctrl-C and SIGTERM during a study: stop the runs within seconds, keep every run that finished.

What a user sees (``bertblocks ablate``, any executor, any ``--workers``):

1. The first SIGINT (Ctrl-C) or SIGTERM prints one line saying the study is stopping. No new run starts; the
   runs in progress are stopped (local workers get SIGTERM and end their run at once; Ray tasks are cancelled);
   every run that finished — also one that finishes while the others stop — is written to ``runs/`` as usual.
   The command then exits 130 (SIGINT) or 143 (SIGTERM) with one line saying how to resume: the same command
   again, which reuses every recorded run (their fingerprints match).
2. A second signal stops at once: the worker processes are killed and the process exits (same codes) without
   waiting for anything. Runs recorded until then stay recorded.

How: the runner installs :class:`Interrupts` (the main process's handlers) around the runs. Its handler only
sets a flag that the executors poll between runs (so a record is never cut short by the signal); only a run
executing in the main process itself (``--workers 0``) is aborted from the handler, by raising
:class:`RunInterrupted` inside it. Local worker processes ignore SIGINT (a terminal sends Ctrl-C to the whole
process group; what it means is the main process's decision) and answer SIGTERM by raising
:class:`RunInterrupted` in the run they execute; they are also killed with their parent if it dies
(``PR_SET_PDEATHSIG`` on Linux), so no worker outlives a study killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from ..errors import BertBlocksError

#: the signals that stop a study, by exit code (128 + the signal's number, as a shell reports it)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(BaseException):
    """A run stopped because the study is stopping (a BaseException, so no ``except Exception`` records it as a
    failed run)."""

    def __str__(self) -> str:
        return "the run was stopped by SIGTERM"


class StudyInterruptedError(BertBlocksError):
    """The study stopped on a signal; the finished runs are recorded and a rerun resumes.

    Attributes:
        signum: the signal (SIGINT or SIGTERM).
        exit_code: 128 + ``signum`` (130, 143), what a shell reports for a program the signal stopped.
        out_dir: the study's output folder.
        recorded: runs recorded in ``out_dir/runs`` (this call's and earlier ones).
        total: runs the study has.
    """

    def __init__(self, signum: int, out_dir: Any, recorded: int, total: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        self.out_dir = out_dir
        self.recorded = recorded
        self.total = total
        name = signal.Signals(signum).name
        super().__init__(
            f"interrupted by {name}: {recorded} of {total} runs are recorded in {out_dir}; "
            "run the same command again to resume"
        )


class Interrupts:
    """The stop request of a running study: installed as the SIGINT/SIGTERM handler of the main thread
    (:meth:`install` / :meth:`restore`), read by the executors.

    Outside the main thread (a study started from a worker thread) no handler can be installed: the request
    then never comes, as before.
    """

    def __init__(self, notice: Callable[[str], None] | None = None) -> None:
        self.signum: int | None = None
        self._notice = notice
        self._previous: dict[int, Any] = {}
        self._abortable = False
        self._on_force: list[Callable[[], None]] = []
        self._settled = False
        self._wakeup: tuple[int, int] | None = None  # (read, write) ends of the pipe counting deliveries
        self._previous_wakeup = -1

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self.signum is not None

    def install(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            # Python writes one byte per delivered signal to the wakeup fd. Ray's signal checks can run a handler
            # twice for one delivery; the bytes tell a second Ctrl-C from the same one handled again.
            read, write = os.pipe()
            os.set_blocking(read, False)
            os.set_blocking(write, False)
            self._wakeup = (read, write)
            self._previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def settle(self) -> None:
        """The runs are over (stopped or done): from here a further signal after a stop is ignored, so the
        cleanup that is left (closing the pools, Ray's shutdown, which signals its driver again) completes."""
        self._settled = True

    def on_force(self, kill: Callable[[], None]) -> None:
        """Call ``kill`` (it must be safe in a signal handler: ``os.kill``) when a second signal stops at once."""
        self._on_force.append(kill)

    @contextmanager
    def abortable(self) -> Iterator[None]:
        """While inside, a stop request raises :class:`RunInterrupted` here (a run in this very process)."""
        if self.requested:
            raise RunInterrupted
        self._abortable = True
        try:
            yield
        finally:
            self._abortable = False

    def _deliveries(self) -> int | None:
        """Signals delivered since the last look (None: not counted)."""
        if self._wakeup is None:
            return None
        try:
            return len(os.read(self._wakeup[0], 4096))
        except BlockingIOError:
            return 0
        except OSError:
            return None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        delivered = self._deliveries()
        if self.requested and (delivered == 0 or self._settled):
            return  # the delivery already handled, handled again; or the runs are already stopped
        if self.requested or (delivered is not None and delivered > 1):  # a second signal: stop at once
            for kill in self._on_force:
                with contextlib.suppress(Exception):  # one process already gone: the others are still killed
                    kill()
            _say(f"stopped at once by a second {name}: runs in progress are lost, finished runs are recorded\n")
            os._exit(128 + signum)
        self.signum = signum
        if self._notice is not None:
            self._notice(name)
        if self._abortable:
            self._abortable = False
            raise RunInterrupted


def stopping_notice(name: str) -> None:
    """The line the first signal prints (written directly to the file descriptor: a handler may have interrupted
    a write to ``sys.stderr``, which must not be re-entered)."""
    _say(f"\nstopping on {name}: recording the finished runs, stopping the others (again to stop at once)\n")


def _say(text: str) -> None:
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no real stderr (a test's capture)
        os.write(sys.stderr.fileno(), text.encode())


# ---------------------------------------------------------------------------------------- in a worker process
_worker_stop = False
_worker_running = False


def init_worker(parent: int) -> None:
    """The initializer of a local worker process: leave Ctrl-C to the main process, end the current run on
    SIGTERM, and die with the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _worker_sigterm)
    _die_with_parent(parent)


def _worker_sigterm(signum: int, frame: FrameType | None) -> None:
    global _worker_stop
    _worker_stop = True
    if _worker_running:  # raised only inside a run: never while a finished run's record is being sent back
        raise RunInterrupted


@contextmanager
def worker_run() -> Iterator[None]:
    """Around a run in a worker: a SIGTERM raises :class:`RunInterrupted` in it; after one, no run starts."""
    global _worker_running
    if _worker_stop:
        raise RunInterrupted
    _worker_running = True
    try:
        yield
    finally:
        _worker_running = False


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (even by SIGKILL), so no worker trains on alone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
