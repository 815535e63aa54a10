"""Where runs execute: local worker processes (default) or a Ray cluster.

Both yield each run's outcome as soon as it finishes, in completion order, so the runner can write it to
disk at once. Both call the same :func:`bertblocks.ablation.run.execute`, so the numbers do not depend on
the executor (with the same ``threads``).

A Ray cluster is checked before anything is written: :func:`connect_ray` fails with a clear message when
Ray is not installed or the address cannot be reached.

Each executor takes the study's :class:`~bertblocks.ablation.interrupts.Interrupts`: once a stop is asked for
(Ctrl-C, SIGTERM) it starts no run, stops those in progress, yields every run that finished, and returns
(see :mod:`bertblocks.ablation.interrupts`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import socket
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from typing import Any, Protocol

import torch

from ..errors import BertBlocksError, InputError
from .interrupts import Interrupts, RunInterrupted, init_worker, worker_run
from .run import RunTask, execute
from .study import StudyError

#: (task, record or the exception the run raised)
Outcome = tuple[RunTask, "dict[str, Any] | BaseException"]

#: how often a waiting executor looks whether a stop was asked for (seconds)
POLL_SECONDS = 0.2
#: how long the runs in progress get to end after a stop before their workers are killed (seconds)
STOP_GRACE_SECONDS = 10.0


class RunFailedError(BertBlocksError):
    """A run's error whose own class cannot cross back from a worker process (pickle rebuilds an exception by
    calling its class with ``args``, which fails for classes such as ``UnknownComponentError(kind, name, …)``;
    the pool would then break and every other run with it): its class name and message instead."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        return self.message


def describe(error: BaseException) -> str:
    """``Type: message`` of a run's error (the original type for a :class:`RunFailedError`)."""
    name = error.type_name if isinstance(error, RunFailedError) else type(error).__name__
    return f"{name}: {error}"


def execute_portably(task: RunTask) -> dict[str, Any]:
    """:func:`execute` for a worker process: an error that pickle could not bring back comes back as a
    :class:`RunFailedError`."""
    try:
        with worker_run():  # a SIGTERM (the study stopping) raises RunInterrupted in the run, not after it
            return execute(task)
    except Exception as e:
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:
            raise RunFailedError(type(e).__name__, str(e)) from None
        raise


class Executor(Protocol):
    """Runs tasks and yields ``(task, record | exception)`` as each finishes."""

    def run(self, tasks: list[RunTask]) -> Iterator[Outcome]: ...

    def close(self) -> None: ...


class InlineExecutor:
    """Runs in the calling process, one after another (``workers=0``): for debugging and quick tests."""

    def __init__(self, stop: Interrupts | None = None) -> None:
        self._stop = stop or Interrupts()

    def run(self, tasks: list[RunTask]) -> Iterator[Outcome]:
        threads = torch.get_num_threads()
        try:
            for task in tasks:
                outcome: dict[str, Any] | BaseException
                try:
                    with self._stop.abortable():  # the signal handler raises RunInterrupted in the run
                        outcome = execute(task)
                except RunInterrupted:
                    return
                except Exception as e:
                    outcome = e
                yield task, outcome
        finally:
            torch.set_num_threads(threads)  # execute() set the run's; give the caller back its own

    def close(self) -> None:
        pass


class LocalExecutor:
    """``workers`` processes started with ``spawn`` (a fresh interpreter: no state forked from the caller)."""

    def __init__(self, workers: int = 1, stop: Interrupts | None = None) -> None:
        if workers < 1:
            raise InputError(f"workers must be at least 1; got {workers}")
        self.workers = workers
        self._stop = stop or Interrupts()
        self._pool: ProcessPoolExecutor | None = None
        self._workers: dict[int, multiprocessing.process.BaseProcess] = {}

    def run(self, tasks: list[RunTask]) -> Iterator[Outcome]:
        if not tasks or self._stop.requested:
            return
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(
            max_workers=min(self.workers, len(tasks)),
            mp_context=context,
            initializer=init_worker,
            initargs=(os.getpid(),),
        )
        self._stop.on_force(self._kill)
        pending: dict[Future[dict[str, Any]], RunTask] = {self._pool.submit(execute_portably, t): t for t in tasks}
        # the pool's own table of its processes (no public accessor; the pool drops it at shutdown, when a stop
        # still has to reach them), filled by the submits above
        self._workers = getattr(self._pool, "_processes", None) or {}
        while pending:
            # with a timeout: a stop is a flag the signal handler sets, looked at here
            done, _ = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            yield from _finished(done, pending)
            if self._stop.requested and pending:
                yield from self._wind_down(pending)
                return

    def _wind_down(self, pending: dict[Future[dict[str, Any]], RunTask]) -> Iterator[Outcome]:
        """Start nothing more, SIGTERM the workers (each ends its run with RunInterrupted), yield what finished
        meanwhile, then kill the workers: they hold nothing more (every outcome is in), and a clean exit of a
        process that imported torch takes seconds. One still busy after :data:`STOP_GRACE_SECONDS` is killed
        all the same (its run is lost; it runs again on resume)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for process in self._processes():
            process.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while pending and time.monotonic() < deadline:
            wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            # swept, not taken from wait(): a future the shutdown cancels wakes no waiter
            yield from _finished({f for f in pending if f.done()}, pending)
        self._kill()
        for process in self._processes():
            process.join(timeout=STOP_GRACE_SECONDS)  # reaped: no zombie is left behind

    def _processes(self) -> list[multiprocessing.process.BaseProcess]:
        return list(self._workers.values())

    def _kill(self) -> None:
        """SIGKILL every worker (safe in a signal handler: a second Ctrl-C)."""
        for process in self._processes():
            if process.pid is not None:
                with contextlib.suppress(OSError):  # already gone
                    os.kill(process.pid, 9)  # SIGKILL (signal.SIGKILL does not exist on Windows)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _finished(done: set[Future[dict[str, Any]]], pending: dict[Future[dict[str, Any]], RunTask]) -> Iterator[Outcome]:
    for future in done:
        task = pending.pop(future)
        if future.cancelled():  # never started: the study stopped first
            continue
        error = future.exception()
        yield task, (error if error is not None else future.result())


class RayExecutor:
    """One Ray task per run (``num_cpus`` = the study's ``threads``) on the cluster :func:`connect_ray` joined."""

    def __init__(self, threads: int = 1, stop: Interrupts | None = None) -> None:
        import ray

        self._ray = ray
        self._stop = stop or Interrupts()
        self._remote = ray.remote(num_cpus=threads, max_retries=0)(_execute_with_data)

    def run(self, tasks: list[RunTask]) -> Iterator[Outcome]:
        ray = self._ray
        if not tasks or self._stop.requested:
            return
        # the tensors travel once through the object store, not with every task
        stored = {id(t.data): ray.put(t.data) for t in tasks if t.data is not None}
        pending: dict[Any, RunTask] = {}
        for task in tasks:
            data = stored.get(id(task.data)) if task.data is not None else None
            pending[self._remote.remote(replace(task, data=None), data)] = task
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
            yield from self._finished(done, pending)
            if self._stop.requested and pending:
                # what finished is yielded; the rest is cancelled (force: the worker running it is killed)
                done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
                yield from self._finished(done, pending)
                for ref in pending:
                    ray.cancel(ref, force=True)
                return

    def _finished(self, done: list[Any], pending: dict[Any, RunTask]) -> Iterator[Outcome]:
        for ref in done:
            task = pending.pop(ref)
            try:
                yield task, self._ray.get(ref)
            except Exception as e:  # a run's own error, re-raised by Ray around it
                yield task, getattr(e, "cause", None) or e

    def close(self) -> None:
        pass  # the cluster connection belongs to whoever opened it (connect_ray's caller)


def _execute_with_data(task: RunTask, data: Any) -> dict[str, Any]:
    # Ray resolves an object ref given as a top-level argument before the call: `data` arrives as tensors.
    return execute_portably(replace(task, data=data))


def connect_ray(address: str | None, num_cpus: int | None = None) -> bool:
    """Join the Ray cluster at ``address`` (``None``: an already started one in this process, else a new local
    instance). Returns whether this call started the connection (the caller then shuts it down).

    Raises:
        StudyError: Ray is not installed, or the cluster cannot be reached (checked before any file is written).
    """
    try:
        import ray
    except ImportError:
        raise StudyError.single(
            "executor", "the ray executor needs Ray: pip install -e '.[ray]' in the bertblocks checkout"
        ) from None
    if address and address not in ("auto", "local"):
        _check_reachable(address)  # first, even when connected: the address asked for must answer
    if ray.is_initialized():
        return False
    try:
        if address:
            ray.init(address=address, log_to_driver=False, include_dashboard=False)
        else:
            ray.init(num_cpus=num_cpus, log_to_driver=False, include_dashboard=False)
    except Exception as e:
        raise StudyError.single("executor", f"cannot connect to the Ray cluster at {address or 'local'}: {e}") from None
    return True


def _check_reachable(address: str, timeout: float = 3.0) -> None:
    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise StudyError.single(
            "executor", f"Ray address {address!r} is not of the form HOST:PORT (or ray://HOST:PORT)"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise StudyError.single(
            "executor",
            f"cannot reach the Ray cluster at {address} ({e.strerror or e}); start one with `ray start --head` "
            "and pass the address it prints, or leave --ray-address out for a local instance",
        ) from None
