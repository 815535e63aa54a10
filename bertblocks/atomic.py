"""Writing files and checkpoint folders so that a kill, a crash or a full disk never leaves a mix.

Two schemes, used by every writer in bertblocks (checkpoints, exports, embeddings, ablation reports):

**One file** (:func:`write_file`): the bytes go to a hidden sibling (``.NAME.tmp-PID-RANDOM``), are flushed and
``fsync``-ed, then ``os.replace`` puts them in place (atomic on POSIX) and the folder is ``fsync``-ed. A reader
sees the earlier file or the new one, whole; a failed write (disk full, file-size limit, read-only folder)
removes its temporary and leaves the earlier file as it was. Temporaries of writers that were killed are
removed by the next write of the same file (only those of processes no longer running).

**A set of files in one folder** (:func:`replace_files`, what ``save_pretrained`` uses): a redo journal.

1. *stage*: every new file is written and ``fsync``-ed into a hidden staging folder inside the target
   (``.bertblocks-save-PID-RANDOM/``; same file system, so renames are atomic);
2. *commit*: a small journal (``.bertblocks-save.json``, itself written by :func:`write_file`) records the
   staging folder, the files to install (the *commit file* — the checkpoint's weight entry point — last),
   the files to remove before installing (``remove_first``: the old entry points) and after (``remove_after``:
   stale shards). Writing the journal is the commit point;
3. *install*: remove ``remove_first``, rename each staged file into place, the commit file last, remove
   ``remove_after``; then delete the journal and the staging folder.

What a reader sees after a kill at any instant:

* killed before the commit: the folder is untouched (the hidden staging folder is never read, and the next
  save removes it): the **old** checkpoint, for bertblocks and for any other reader;
* killed after it: :func:`finish_interrupted_save` (run by every bertblocks load of a local folder and by
  every save into it) repeats the install, which is idempotent: the **new** checkpoint.
  A reader that does not know the journal (transformers) sees the old checkpoint, the new one, or — only
  between the removal of the old entry points and the install of the new one — a folder *without* a
  weight entry point, which it refuses loudly; never a config of one model with the weights of another,
  because the entry points go first and the new one comes last.

Durability: every file and folder is ``fsync``-ed before the step that depends on it, so the same holds
after a power cut on a file system that honours ``fsync`` (tests kill processes; they cannot cut power).
The commit and the install run under an exclusive ``flock`` of the folder itself (no lock file), which a
loader finishing an interrupted save takes too: a load never installs beside a save that is still running.
Not covered: a reader reading while a save runs may read the old config and the new weights (as with
transformers); two processes saving into one folder at once are serialised at the commit, but what each
removes as stale is decided before it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .errors import BertBlocksError, InputError

try:
    import fcntl
except ImportError:  # not POSIX: no folder lock
    fcntl = None  # type: ignore[assignment]

#: the journal of a folder's pending install (its presence means: a committed save is not yet fully installed)
JOURNAL = ".bertblocks-save.json"
#: staging folders are named this plus ``PID-RANDOM``
STAGING_PREFIX = ".bertblocks-save-"
_STAGING = re.compile(r"\.bertblocks-save-(\d+)-[0-9a-f]+")
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]+")

#: a writer gets an open binary file and writes the content into it
Writer = Callable[[IO[bytes]], Any]

#: tests set this to a function called with a label at each step of a write (to kill the process there)
step_hook: Callable[[str], None] | None = None


class WriteError(BertBlocksError, OSError):
    """A file or folder that could not be written; the message names it and the reason, in one line.

    The earlier content (if any) is left as it was.
    """


class InterruptedSaveError(BertBlocksError, OSError):
    """A folder whose interrupted save cannot be finished (a damaged journal, or no permission to write)."""


def _step(label: str) -> None:
    if step_hook is not None:
        step_hook(label)


_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file is larger than the file-size limit allows (or the disk is full)",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "it is a directory",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
}


def _error(path: Path, error: OSError, what: str = "cannot write") -> WriteError:
    reason = _REASONS.get(error.errno or 0) or error.strerror or str(error)
    return WriteError(f"{what} {path}: {reason}; nothing earlier was changed")


class _RecordingFile(io.FileIO):
    """A raw file that remembers the OS error of a failed write (libraries often report it in other words)."""

    error: OSError | None = None

    def write(self, data: Any) -> int | None:  # type: ignore[override]
        try:
            written = super().write(data)
        except OSError as e:
            self.error = e
            raise
        _step("wrote a block")  # a kill here leaves a partly written file: tests iterate over these too
        return written


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory: nothing to sync
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _token() -> str:
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def _write_new(path: Path, write: Writer, shown: Path) -> None:
    """Create ``path`` (which must not exist), fill it with ``write``, flush and ``fsync`` it.

    Raises:
        WriteError: the OS refused a write (naming ``shown``, the file the caller means); other errors of
            ``write`` propagate unchanged.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise _error(shown, e) from None
    raw = _RecordingFile(fd, "wb", closefd=True)
    try:
        with io.BufferedWriter(raw) as f:
            write(f)
            f.flush()
            os.fsync(raw.fileno())
    except BaseException as e:
        recorded = raw.error if raw.error is not None else (e if isinstance(e, OSError) else None)
        if recorded is not None and not isinstance(e, WriteError):
            raise _error(shown, recorded) from None
        raise


def _check_target(path: Path) -> None:
    if path.is_dir():
        raise WriteError(f"cannot write {path}: it is a directory")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise WriteError(f"cannot write {path}: {parent} is a file, not a directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _error(parent, e, "cannot create the folder") from None


def remove_stale_temporaries(path: Path) -> None:
    """Remove temporaries of ``path`` left by writers that were killed (processes no longer running)."""
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            match = _TEMPORARY.fullmatch(entry.name)
            if match and match["name"] == path.name and not _alive(int(match["pid"])):
                entry.unlink(missing_ok=True)


def write_file(path: str | Path, write: Writer) -> Path:
    """Write one file atomically: a hidden temporary beside it, ``fsync``, then ``os.replace``.

    Args:
        path: the file; its folder is created if needed.
        write: fills the open binary file (``lambda f: f.write(data)``, ``lambda f: torch.save(obj, f)``).

    Returns:
        ``path``.

    Raises:
        WriteError: ``path`` is a directory, or the OS refused a write (disk full, file-size limit,
            read-only or unwritable folder): one line naming the file and the reason; the earlier file,
            if any, is unchanged.
    """
    path = Path(path)
    _check_target(path)
    remove_stale_temporaries(path)
    temporary = path.with_name(f".{path.name}.tmp-{_token()}")
    try:
        _write_new(temporary, write, path)
        _step(f"written {path.name}")
        try:
            os.replace(temporary, path)
        except OSError as e:
            raise _error(path, e) from None
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    _step(f"replaced {path.name}")
    return path


def write_bytes(path: str | Path, data: bytes) -> Path:
    """:func:`write_file` with these bytes."""
    return write_file(path, lambda f: f.write(data))


def write_text(path: str | Path, text: str) -> Path:
    """:func:`write_file` with this text, UTF-8."""
    return write_bytes(path, text.encode("utf-8"))


# ------------------------------------------------------------------------------------------- folders
def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _read_journal(directory: Path) -> dict[str, Any] | None:
    path = directory / JOURNAL
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InterruptedSaveError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        journal = json.loads(text)
        lists = [journal[k] for k in ("install", "remove_first", "remove_after")]
        names = [n for names in lists for n in names]
        valid = (
            isinstance(journal, dict)
            and isinstance(journal.get("staging"), str)
            and _STAGING.fullmatch(journal["staging"]) is not None
            and all(isinstance(names, list) for names in lists)
            and all(_plain_name(n) and n != JOURNAL for n in names)
            and bool(journal["install"])
        )
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise InterruptedSaveError(
            f"{path} is not a bertblocks save journal (it records an interrupted save); remove it if the "
            "folder holds a complete checkpoint"
        )
    return journal


def finish_interrupted_save(directory: str | Path) -> bool:
    """Finish the install of a save that was killed after its commit (see the module docstring).

    Cheap when there is nothing to do (one ``stat``). Idempotent: a kill while finishing is finished by the
    next call.

    Returns:
        ``True`` if an interrupted save was finished.

    Raises:
        InterruptedSaveError: the journal is damaged, or the folder cannot be written (read-only): the
            message says what to do.
    """
    directory = Path(directory)
    if not (directory / JOURNAL).exists():
        return False
    with _locked(directory):  # a save still installing holds the lock: wait for it, never install beside it
        return _finish(directory)


def _finish(directory: Path) -> bool:
    journal = _read_journal(directory)
    if journal is None:
        return False
    try:
        _install(directory, journal)
    except InterruptedSaveError:
        raise
    except OSError as e:
        raise InterruptedSaveError(
            f"{directory} holds a save that was interrupted after its commit, and it cannot be finished "
            f"({e.strerror or e}); finish it by loading the folder once with write permission"
        ) from None
    return True


def _install(directory: Path, journal: Mapping[str, Any]) -> None:
    staging = directory / journal["staging"]
    install: list[str] = journal["install"]
    if not staging.is_dir():  # the journal is removed before its staging folder: never so after a kill
        raise InterruptedSaveError(
            f"{directory / JOURNAL} names a staging folder {staging.name} that is missing; remove the journal "
            "if the folder holds a complete checkpoint"
        )
    if (staging / install[-1]).exists():
        # the commit file is not installed yet: the old entry points go first, so that no reader ever
        # pairs the new config with the old weights (it finds no weights until the commit file is in place)
        for name in journal["remove_first"]:
            (directory / name).unlink(missing_ok=True)
            _step(f"removed {name}")
        _fsync_dir(directory)
        for name in install:
            if (staging / name).exists():
                os.replace(staging / name, directory / name)
                _step(f"installed {name}")
        _fsync_dir(directory)
    for name in journal["remove_after"]:
        (directory / name).unlink(missing_ok=True)
        _step(f"removed {name}")
    _fsync_dir(directory)
    (directory / JOURNAL).unlink(missing_ok=True)
    _fsync_dir(directory)
    _step("journal removed")
    shutil.rmtree(staging, ignore_errors=True)


def remove_orphans(directory: Path) -> None:
    """Remove staging folders of saves killed before their commit (by processes no longer running)."""
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            match = _STAGING.fullmatch(entry.name)
            if match and entry.is_dir() and not _alive(int(match[1])):
                shutil.rmtree(entry, ignore_errors=True)
    remove_stale_temporaries(directory / JOURNAL)


def replace_files(
    directory: str | Path,
    files: Mapping[str, Writer],
    *,
    commit: str,
    remove_first: Iterable[str] = (),
    remove_after: Iterable[str] = (),
) -> list[Path]:
    """Replace a set of files in ``directory`` as one: after a kill at any step, the old set or the new one.

    Args:
        directory: the folder (created if needed); files of it not named here are left alone.
        files: file name → writer, in install order; ``commit`` is installed last.
        commit: the name a reader looks for first (the weight entry point): installed last.
        remove_first: files to remove before installing (old entry points, so that no reader mixes).
        remove_after: files to remove once the new ones are in place (stale shards).

    Returns:
        The paths written, in install order.

    Raises:
        WriteError: the folder is a file, or cannot be written (read-only, disk full): nothing changed.
        InterruptedSaveError: an earlier interrupted save there cannot be finished.
    """
    directory = Path(directory)
    names = [n for n in files if n != commit] + [commit]
    if commit not in files or not all(_plain_name(n) and n != JOURNAL for n in names):
        raise InputError(f"replace_files: {names} must be plain file names including commit {commit!r}")
    removed_first = [n for n in dict.fromkeys(remove_first) if n not in names[:-1]]
    removed_after = [n for n in dict.fromkeys(remove_after) if n not in names]
    if directory.exists() and not directory.is_dir():
        raise WriteError(f"cannot write {directory}: it is a file, not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _error(directory, e, "cannot create the folder") from None
    finish_interrupted_save(directory)
    remove_orphans(directory)
    staging = directory / f"{STAGING_PREFIX}{_token()}"
    try:
        staging.mkdir()
    except OSError as e:
        raise _error(directory, e) from None
    _step("staging created")
    journal = {"staging": staging.name, "install": names, "remove_first": removed_first, "remove_after": removed_after}
    try:
        for name in names:
            _write_new(staging / name, files[name], directory / name)
            _step(f"staged {name}")
        _fsync_dir(staging)
        # commit and install under the folder's lock: a loader finishing an interrupted save waits for it
        with _locked(directory):
            _finish(directory)
            write_text(directory / JOURNAL, json.dumps(journal, indent=1) + "\n")  # the commit point
            try:
                _install(directory, journal)
            except OSError as e:
                raise WriteError(
                    f"cannot finish writing {directory} ({e.strerror or e}); the save is committed and the next "
                    "load or save of the folder finishes it"
                ) from None
    except BaseException:
        if not (directory / JOURNAL).exists():  # not committed: the staged files go
            shutil.rmtree(staging, ignore_errors=True)
        raise
    return [directory / name for name in names]


def _lock(directory: Path) -> int | None:
    if fcntl is None:
        return None
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # a file system without locks: go on unlocked
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the folder itself (no lock file), released when the process ends, even killed."""
    fd = _lock(directory)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


__all__ = [
    "JOURNAL",
    "STAGING_PREFIX",
    "InterruptedSaveError",
    "WriteError",
    "Writer",
    "finish_interrupted_save",
    "remove_orphans",
    "remove_stale_temporaries",
    "replace_files",
    "write_bytes",
    "write_file",
    "write_text",
]
