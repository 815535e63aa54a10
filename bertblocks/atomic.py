"""Writing files and checkpoint folders so that a kill, a crash, a full disk or a concurrent save never leaves a
mix, and so that reading never needs to repair anything: **a read never writes**.

Every writer in bertblocks goes through this module (checkpoints, quantized folders, exports, embeddings,
ablation records and reports, CSV files); ``tests/test_atomic_save.py`` greps the package for writes that do
not.

**One file** (:func:`write_file`): the bytes go to a hidden sibling (``.NAME.tmp-PID-RANDOM``), are flushed and
``fsync``-ed, then ``os.replace`` puts them in place (atomic on POSIX) and the folder is ``fsync``-ed. A reader
sees the earlier file or the new one, whole; a failed write (disk full, file-size limit, read-only folder)
removes its temporary and leaves the earlier file as it was. Temporaries of writers that were killed are
removed by the next write of the same file (only those of processes no longer running).

**A set of files in one folder** (:func:`replace_files`, what ``save_pretrained`` and ``save_quantized`` use):
a new *generation* of the folder is built beside it and the two are swapped in one step.

1. *lock*: an exclusive ``flock`` of the parent folder (no lock file) serialises every bertblocks save into a
   folder there, for the whole save; a killed saver's lock goes with its process;
2. *build*: a hidden sibling ``.NAME.bertblocks-new-PID-RANDOM/`` receives every new file (written and
   ``fsync``-ed) and the files of the current folder that the save does not replace (a tokenizer, a README:
   hard links, or copies where links are refused; symbolic links are copied as links, never followed);
3. *swap*: under an exclusive ``flock`` of the current folder (which waits for bertblocks readers, see below),
   ``renameat2(RENAME_EXCHANGE)`` exchanges the two names in one atomic step: the path now names the new
   generation, the sibling the old one;
4. *drop*: the old generation (now the sibling) is removed with ``shutil.rmtree``, which never follows a link.

What anyone sees after a kill at any instant: the path names the old folder whole (killed before the swap) or
the new one whole (killed after it); a killed save leaves at most a hidden sibling, removed by the next save
into the folder. Readers never recover anything: there is no journal.

*Readers* (:func:`reading`, used by every bertblocks loader of a local folder: ``from_pretrained``,
``load_quantized``, the tokenizer) open the folder, take a shared ``flock`` of it, and check that the path
still names the folder they locked (else they start again). A swap needs the exclusive lock, so it waits until
the readers of the current generation are done: every file one load reads comes from one generation. Taking a
lock creates, renames and deletes nothing, and works on a read-only folder.

*Not bertblocks* (transformers): a reader opening files by path sees whole-old or whole-new at each open;
only a load that opens ``config.json`` before a swap and the weights after it (a window of one rename) can
pair the two; after an interrupted save it sees the old or the new checkpoint, never a partial one.

*Fallback*: where the swap is unavailable (not Linux, a kernel or file system without ``RENAME_EXCHANGE``, a
folder that is a mount point, a parent folder that cannot be written) the new files are staged in a hidden
subfolder of the folder and renamed into it one by one under the folder's exclusive ``flock`` (so bertblocks
readers still see whole-old or whole-new), the old entry points first and the ``commit`` file (the weight
entry point) last. A kill inside that install leaves a folder without a weight entry point, which every
reader refuses loudly: never a config of one model with the weights of another. The next save replaces it.

Durability: every file and folder is ``fsync``-ed before the step that depends on it, so the same holds
after a power cut on a file system that honours ``fsync`` (tests kill processes; they cannot cut power).
Files that another program writes into the folder *during* a save are lost with the old generation.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import ctypes.util
import errno
import functools
import io
import os
import platform
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from .errors import BertBlocksError, InputError

try:
    import fcntl
except ImportError:  # not POSIX: no folder lock
    fcntl = None  # type: ignore[assignment]

#: a new generation of folder ``NAME`` is built in ``.NAME`` + this + ``PID-RANDOM`` beside it (or, in the
#: fallback, in a subfolder of that name inside it)
GENERATION = ".bertblocks-new-"
#: what the journal-based saves of earlier versions left in a folder: never carried into a new generation
_LEGACY = re.compile(r"\.bertblocks-save(\.json|-.*)")
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]+")

#: a writer gets an open binary file and writes the content into it
Writer = Callable[[IO[bytes]], Any]

#: tests set this to a function called with a label at each step of a write (to kill the process there)
step_hook: Callable[[str], None] | None = None


class WriteError(BertBlocksError, OSError):
    """A file or folder that could not be written; the message names it and the reason, in one line.

    The earlier content (if any) is left as it was.
    """


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
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and not name.startswith(GENERATION)
    )


#: ``renameat2``'s flag that swaps the two names (``linux/fs.h``)
RENAME_EXCHANGE = 2
_AT_FDCWD = -100
#: ``renameat2``'s system call number where glibc is older than 2.28 (no ``renameat2`` symbol)
_SYSCALLS = {"x86_64": 316, "aarch64": 276, "arm64": 276, "i686": 353, "i386": 353, "ppc64le": 357, "s390x": 347}


def _find_renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    """``renameat2`` from libc (or its system call), returning 0 or an errno; ``None`` where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    function = getattr(libc, "renameat2", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        function.restype = ctypes.c_int

        def call(old_fd: int, old: bytes, new_fd: int, new: bytes, flags: int) -> int:
            return 0 if function(old_fd, old, new_fd, new, flags) == 0 else ctypes.get_errno()

        return call
    number = _SYSCALLS.get(platform.machine())
    if number is None:
        return None
    syscall = libc.syscall
    syscall.restype = ctypes.c_long

    def call_syscall(old_fd: int, old: bytes, new_fd: int, new: bytes, flags: int) -> int:
        result = syscall(
            ctypes.c_long(number), ctypes.c_int(old_fd), old, ctypes.c_int(new_fd), new, ctypes.c_uint(flags)
        )
        return 0 if result == 0 else ctypes.get_errno()

    return call_syscall


#: the swap; tests set it to ``None`` to run the fallback
renameat2 = _find_renameat2()
#: errors of ``renameat2`` that mean "not here" (the fallback is taken), not "this save failed"
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBUSY, errno.EXDEV, errno.EPERM}


def _exchange(parent: Path, a: str, b: str) -> int:
    """Swap the names ``a`` and ``b`` in ``parent`` atomically; 0, or the errno."""
    if renameat2 is None:
        return errno.ENOSYS
    try:
        fd = os.open(parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        return e.errno or errno.EIO
    try:
        return renameat2(fd, os.fsencode(a), fd, os.fsencode(b), RENAME_EXCHANGE)
    finally:
        os.close(fd)


def _open_dir(directory: Path) -> int | None:
    try:
        return os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None


def _flock(fd: int | None, mode: int) -> bool:
    if fd is None or fcntl is None:
        return False
    try:
        fcntl.flock(fd, mode)
    except OSError:  # a file system without locks: go on unlocked
        return False
    return True


@contextlib.contextmanager
def _locked(directory: Path, shared: bool = False) -> Iterator[int | None]:
    """A ``flock`` of the folder itself (no lock file), released when the process ends, even killed; yields
    the folder's open descriptor (``None`` where it cannot be opened)."""
    fd = _open_dir(directory)
    try:
        _flock(fd, fcntl.LOCK_SH if shared and fcntl else fcntl.LOCK_EX if fcntl else 0)
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def reading(directory: str | Path) -> Iterator[None]:
    """Read a folder as one generation: while inside, no bertblocks save swaps it or installs into it.

    Takes a shared ``flock`` of the folder and checks that the path still names the folder locked (a save may
    have swapped it meanwhile: then it starts again). Creates, renames and deletes nothing; where the path is not
    a local folder, or locks are not available, it does nothing. A child forked inside shares the lock (as with
    any ``flock``): a save in that child would wait for itself, so fork before, not inside.
    """
    path = Path(directory)
    fd: int | None = None
    for _ in range(1000):  # each retry follows a completed swap: never more than a few
        fd = _open_dir(path)
        if fd is None or not _flock(fd, fcntl.LOCK_SH if fcntl else 0):
            break
        try:
            now = os.stat(path)
        except OSError:
            now = None
        locked = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (locked.st_dev, locked.st_ino):
            break
        os.close(fd)
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


F = TypeVar("F", bound=Callable[..., Any])


def reads_folder(function: F) -> F:
    """Decorate a loader whose first argument is a folder: the whole call holds :func:`reading` of it."""

    @functools.wraps(function)
    def wrapper(directory: Any, *args: Any, **kwargs: Any) -> Any:
        with reading(directory):
            return function(directory, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _generation_name(name: str) -> str:
    return f".{name}{GENERATION}{_token()}"


def _remove_tree(path: Path) -> None:
    """Remove a folder this module made (never follows a link: ``rmtree`` refuses one, and removes links inside
    a folder as links)."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)


def _remove_orphans(parent: Path, prefix: str) -> None:
    """Remove the generations of killed saves (``prefix*`` folders in ``parent``). Called under the lock that
    every save of the folder holds throughout, so none of them belongs to a running save; a reader still in one
    (an old generation) is waited for."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False):
                with _locked(Path(entry.path)):
                    _remove_tree(Path(entry.path))


def _carry(source: Path, target: Path) -> None:
    """Put ``source`` (a file, link or folder of the current generation) at ``target`` in the new one without
    following any link: a hard link (a copy where links are refused), a link as a link, a folder recursively."""
    info = os.lstat(source)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(source), target)
    elif stat.S_ISDIR(info.st_mode):
        os.mkdir(target)
        for entry in os.scandir(source):
            _carry(Path(entry.path), target / entry.name)
        os.chmod(target, stat.S_IMODE(info.st_mode))
    elif stat.S_ISREG(info.st_mode):
        try:
            os.link(source, target, follow_symlinks=False)
        except OSError:  # no hard links here (or not allowed for this file): a copy
            shutil.copy2(source, target, follow_symlinks=False)
    # sockets, pipes and devices are not carried


def replace_files(
    directory: str | Path,
    files: Mapping[str, Writer],
    *,
    commit: str,
    stale: Callable[[Path], Iterable[str]] = lambda folder: (),
    entry_points: Collection[str] = (),
) -> list[Path]:
    """Replace a set of files in ``directory`` as one: after a kill at any step, the old set or the new one
    (see the module docstring for the scheme and its fallback).

    Args:
        directory: the folder (created if needed; a link to a folder saves into the folder it names). Files of
            it not named here and not ``stale`` are carried into the new generation.
        files: file name → writer.
        commit: the name a reader looks for first (the weight entry point): installed last in the fallback.
        stale: called under the save's lock with the current folder: names of its files that the new set makes
            stale (an earlier save's shards): not carried over.
        entry_points: names that lead a reader to weights; in the fallback the stale ones are removed before
            anything is installed, so that no reader pairs the new config with the old weights.

    Returns:
        The paths written.

    Raises:
        WriteError: the folder is a file, or cannot be written (read-only, disk full): nothing changed.
    """
    names = [n for n in files if n != commit] + [commit]
    if commit not in files or not all(_plain_name(n) for n in names):
        raise InputError(f"replace_files: {names} must be plain file names including commit {commit!r}")
    given = Path(directory)
    if given.exists() and not given.is_dir():
        raise WriteError(f"cannot write {given}: it is a file, not a directory")
    target = Path(os.path.realpath(given))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _error(target.parent, e, "cannot create the folder") from None
    # every save of a folder holds its parent's lock throughout: saves of one folder run one after the other
    with _locked(target.parent):
        exists = target.is_dir()
        if not exists or _can_swap(target):
            done = _swap_in(target, files, names, stale, exists, given)
            if done is not None:
                return done
        return _install_in_place(target, files, names, stale, entry_points, given)


def _can_swap(target: Path) -> bool:
    """Whether the swap may be tried: ``renameat2`` exists, the folder is not a mount point, and both it and
    its parent may be written (a folder made read-only is refused, as an in-place write would be)."""
    return (
        renameat2 is not None
        and not os.path.ismount(target)
        and os.access(target, os.W_OK | os.X_OK)
        and os.access(target.parent, os.W_OK | os.X_OK)
    )


def _swap_in(
    target: Path,
    files: Mapping[str, Writer],
    names: Sequence[str],
    stale: Callable[[Path], Iterable[str]],
    exists: bool,
    shown: Path,
) -> list[Path] | None:
    """Build the new generation beside ``target`` and swap it in; ``None`` if the swap turned out unsupported
    here (the built generation is gone and nothing changed: the caller takes the fallback)."""
    parent = target.parent
    _remove_orphans(parent, f".{target.name}{GENERATION}")
    new = parent / _generation_name(target.name)
    try:
        new.mkdir()
    except OSError as e:
        raise _error(shown, e) from None
    _step("generation created")
    try:
        if exists:
            replaced = {*names, *stale(target)}
            for entry in os.scandir(target):
                if not (entry.name in replaced or _LEGACY.fullmatch(entry.name) or _TEMPORARY.fullmatch(entry.name)):
                    _carry(Path(entry.path), new / entry.name)
            _step("carried over")
            with contextlib.suppress(OSError):
                os.chmod(new, stat.S_IMODE(os.stat(target).st_mode))
        for name in names:
            _write_new(new / name, files[name], shown / name)
            _step(f"staged {name}")
        _fsync_dir(new)
        if not exists:
            try:
                os.rename(new, target)
            except OSError as e:
                raise _error(shown, e) from None
            _fsync_dir(parent)
            _step("exchanged")
            return [target / name for name in files]
        # the swap waits for bertblocks readers of the current generation (they hold a shared lock of it), and
        # keeps the exclusive lock of the old generation while removing it
        with _locked(target):
            error = _exchange(parent, new.name, target.name)
            if error in _UNSUPPORTED:
                _remove_tree(new)
                return None
            if error:
                reason = _REASONS.get(error) or os.strerror(error)
                raise WriteError(f"cannot write {shown}: {reason}; nothing earlier was changed")
            _fsync_dir(parent)
            _step("exchanged")
            _remove_tree(new)  # the old generation, now under the sibling's name
            _step("old generation removed")
    except BaseException:
        _remove_tree(new)  # the unfinished new generation, or (after the swap) the old one
        raise
    return [target / name for name in files]


def _install_in_place(
    target: Path,
    files: Mapping[str, Writer],
    names: Sequence[str],
    stale: Callable[[Path], Iterable[str]],
    entry_points: Collection[str],
    shown: Path,
) -> list[Path]:
    """The fallback: stage inside the folder, then rename into it under its exclusive lock (entry points
    first out, ``commit`` last in)."""
    _remove_orphans(target, GENERATION)
    staging = target / _generation_name("")[1:]
    try:
        staging.mkdir()
    except OSError as e:
        raise _error(shown, e) from None
    _step("generation created")
    try:
        for name in names:
            _write_new(staging / name, files[name], shown / name)
            _step(f"staged {name}")
        _fsync_dir(staging)
        with _locked(target):
            old = [n for n in dict.fromkeys(stale(target)) if n not in names]
            first = [n for n in (*old, *names[:-1]) if n in entry_points]
            try:
                for name in first:
                    (target / name).unlink(missing_ok=True)
                    _step(f"removed {name}")
                _fsync_dir(target)
                for name in names:
                    os.replace(staging / name, target / name)
                    _step(f"installed {name}")
                _fsync_dir(target)
                for name in old:
                    if name not in first:
                        (target / name).unlink(missing_ok=True)
                        _step(f"removed {name}")
                _fsync_dir(target)
            except OSError as e:
                raise _error(shown, e) from None
    finally:
        _remove_tree(staging)
    return [target / name for name in files]


# ------------------------------------------------------------------------------------------- CSV
#: first characters that make a spreadsheet read a cell as a formula (OWASP's list: tab and CR too)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


#: a plain number (``-0.5``, ``+1e-3``): a spreadsheet reads it as a number, not a formula
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def neutralise_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: a string starting like a formula (``=``, ``+``, ``-``, ``@``, tab,
    carriage return) gets a leading ``'``, as OWASP recommends and as spreadsheets mark text themselves; a plain
    number written as text (``-0.5``), numbers and other values are unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def write_csv(path: str | Path, rows: Iterable[Sequence[Any]]) -> Path:
    """Write rows as CSV atomically (:func:`write_file`), every string cell through :func:`neutralise_cell`:
    a name such as ``=2+3`` or ``=cmd|...`` is text in a spreadsheet, never a live formula."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    for row in rows:
        writer.writerow([neutralise_cell(v) for v in row])
    return write_text(path, buffer.getvalue())


__all__ = [
    "FORMULA_STARTS",
    "GENERATION",
    "RENAME_EXCHANGE",
    "WriteError",
    "Writer",
    "neutralise_cell",
    "reading",
    "reads_folder",
    "remove_stale_temporaries",
    "replace_files",
    "write_bytes",
    "write_csv",
    "write_file",
    "write_text",
]
