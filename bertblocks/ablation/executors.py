"""Where runs execute: local worker processes (default) or a Ray cluster.

Both yield each run's outcome as soon as it finishes, in completion order, so the runner can write it to
disk at once. Both call the same :func:`bertblocks.ablation.run.execute`, so the numbers do not depend on
the executor (with the same ``threads``).

A Ray cluster is checked before anything is written: :func:`connect_ray` fails with a clear message when
Ray is not installed or the address cannot be reached.
"""

from __future__ import annotations

import multiprocessing
import pickle
import socket
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from typing import Any, Protocol

import torch

from ..errors import BertBlocksError, InputError
from .run import RunTask, execute
from .study import StudyError

#: (task, record or the exception the run raised)
Outcome = tuple[RunTask, "dict[str, Any] | BaseException"]


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

    def run(self, tasks: list[RunTask]) -> Iterator[Outcome]:
        threads = torch.get_num_threads()
        try:
            for task in tasks:
                try:
                    yield task, execute(task)
                except Exception as e:
                    yield task, e
        finally:
            torch.set_num_threads(threads)  # execute() set the run's; give the caller back its own

    def close(self) -> None:
        pass


class LocalExecutor:
    """``workers`` processes started with ``spawn`` (a fresh interpreter: no state forked from the caller)."""

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise InputError(f"workers must be at least 1; got {workers}")
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def run(self, tasks: list[RunTask]) -> Iterator[Outcome]:
        if not tasks:
            return
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)), mp_context=context)
        pending: dict[Future[dict[str, Any]], RunTask] = {self._pool.submit(execute_portably, t): t for t in tasks}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                task = pending.pop(future)
                error = future.exception()
                yield task, (error if error is not None else future.result())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class RayExecutor:
    """One Ray task per run (``num_cpus`` = the study's ``threads``) on the cluster :func:`connect_ray` joined."""

    def __init__(self, threads: int = 1) -> None:
        import ray

        self._ray = ray
        self._remote = ray.remote(num_cpus=threads, max_retries=0)(_execute_with_data)

    def run(self, tasks: list[RunTask]) -> Iterator[Outcome]:
        ray = self._ray
        if not tasks:
            return
        # the tensors travel once through the object store, not with every task
        stored = {id(t.data): ray.put(t.data) for t in tasks if t.data is not None}
        pending: dict[Any, RunTask] = {}
        for task in tasks:
            data = stored.get(id(task.data)) if task.data is not None else None
            pending[self._remote.remote(replace(task, data=None), data)] = task
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                try:
                    yield task, ray.get(ref)
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
