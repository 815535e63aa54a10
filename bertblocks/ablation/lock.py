"""One study at a time per output folder: an advisory lock on ``<out>/.study.lock``.

Two studies writing into one folder would interleave their run records and summaries, and both would exit
0 with results that mix two settings. The runner therefore takes an exclusive lock on a file in the
folder before it writes anything there, and holds it until the summaries are written. The lock is the
operating system's (``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows), so a study that is killed
releases it with its process: there is never a stale lock to delete by hand. The file also records who
holds the lock (process id, host, start time), for the message the second study prints.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..readers import read_json
from .study import StudyError

LOCK_FILE = ".study.lock"


class StudyLockedError(StudyError):
    """Another study is writing to the same output folder."""


class FolderLock:
    """An exclusive, non-blocking lock on ``folder``: ``with FolderLock(out): ...``.

    Raises:
        StudyLockedError: on entry, when another process holds the lock (with its pid, host and start).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._file: IO[str] | None = None

    def __enter__(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")
        try:
            _lock(handle)
        except OSError:
            holder = _describe(self.path)
            handle.close()
            raise StudyLockedError.single(
                "",
                f"another study is writing to {self.folder} ({holder}); wait for it to finish, or give another "
                "output folder (--out)",
            ) from None
        handle.seek(0)
        handle.truncate()
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        handle.write(json.dumps(info))
        handle.flush()
        self._file = handle
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._file is not None:
            _unlock(self._file)
            self._file.close()
            self._file = None


def _describe(path: Path) -> str:
    try:
        info: Any = read_json(path)
        return f"process {info['pid']} on {info['host']}, since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet written its name"


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock(handle: IO[str]) -> None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)

    def _unlock(handle: IO[str]) -> None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock(handle: IO[str]) -> None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(handle: IO[str]) -> None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
