"""Checkpoint folders: a read never writes; concurrent saves and loads; planted links and journals; the fallback;
quantized folders; CSV formulas; and the structural check that every write in the package goes through
:mod:`bertblocks.atomic`.

Every concurrency case runs real processes (``os.fork``) with real ``SIGKILL``s. "Nothing changed" is checked
with :func:`tests.test_atomic_save.snapshot` (names, inode numbers, sizes, mtimes, ctimes and contents of
everything under a folder, links not followed).
"""

from __future__ import annotations

import builtins
import contextlib
import csv
import errno
import io
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import bertblocks
from bertblocks import atomic
from bertblocks.atomic import GENERATION, WriteError
from bertblocks.hf.weights import WeightsNotFoundError
from tests.conftest import TINY
from tests.test_atomic_save import (
    LABELS_A,
    LABELS_B,
    _exit_code,
    _fork,
    _hook,
    _kill_at,
    _kill_points,
    _killed,
    _model,
    _plain_view,
    _steps,
    _which,
    snapshot,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the process tests fork")

PACKAGE = Path(__file__).parents[1] / "bertblocks"
LEGACY_JOURNAL = ".bertblocks-save.json"  # what the journal-based saves of earlier versions wrote
LEGACY_STAGING = ".bertblocks-save-1-abcd1234"


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    return _model(0, LABELS_A), _model(1, LABELS_B)


def _loaded_model_is_whole(model: torch.nn.Module, pair: tuple[torch.nn.Module, torch.nn.Module]) -> str:
    """``"A"`` or ``"B"``: the loaded labels and weights are those of one model."""
    for name, labels, reference in (("A", LABELS_A, pair[0]), ("B", LABELS_B, pair[1])):
        if model.config.id2label == labels:
            assert torch.equal(model.classifier.weight, reference.classifier.weight), f"{name}'s labels, other weights"
            assert torch.equal(
                model.bert.embeddings.word_embeddings.weight, reference.bert.embeddings.word_embeddings.weight
            ), f"{name}'s labels and head, other backbone"
            return name
    raise AssertionError(f"labels of neither model: {model.config.id2label}")


def _outside(tmp_path: Path, pair: tuple[torch.nn.Module, torch.nn.Module]) -> Path:
    """A folder outside the checkpoint holding files a bad journal or link could lead a writer to."""
    outside = tmp_path / "outside"
    pair[1].save_pretrained(outside)
    (outside / "secret.txt").write_text("not the checkpoint's")
    (outside / "victim.safetensors").write_bytes(b"someone else's file")
    return outside


def _tokenizer_files(folder: Path) -> None:
    from bertblocks.hf.tokenizer import BertTokenizer

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]
    BertTokenizer.from_vocab(tokens).save_pretrained(folder)


# ------------------------------------------------------------------------------------- a read never writes
def _readers() -> dict[str, Callable[[Path], object]]:
    from bertblocks.hf.tokenizer import BertTokenizer

    return {
        "from_pretrained auto": lambda folder: bertblocks.from_pretrained(folder, head="auto"),
        "from_pretrained backbone": lambda folder: bertblocks.from_pretrained(folder),
        "task model from_pretrained": lambda folder: bertblocks.BertForSequenceClassification.from_pretrained(folder),
        "load_checkpoint": lambda folder: _model(2, LABELS_A).load_checkpoint(folder),
        "tokenizer": lambda folder: BertTokenizer.from_pretrained(folder),
        "config": lambda folder: bertblocks.load_config(folder),
    }


@pytest.mark.parametrize("reader", sorted(_readers()))
def test_a_load_changes_nothing_even_with_a_journal_whose_staging_links_outside(tmp_path, pair, reader):
    # earlier versions replayed the journal on load: this one moved outside/model.safetensors into the folder
    outside = _outside(tmp_path, pair)
    folder = tmp_path / "ckpt"
    pair[0].save_pretrained(folder)
    _tokenizer_files(folder)
    (folder / LEGACY_STAGING).symlink_to(outside, target_is_directory=True)
    journal = {"staging": LEGACY_STAGING, "install": ["config.json", "model.safetensors"]}
    (folder / LEGACY_JOURNAL).write_text(json.dumps({**journal, "remove_first": [], "remove_after": []}))
    (folder / "notes.txt").symlink_to(outside / "secret.txt")
    before, outside_before = snapshot(folder), snapshot(outside)
    with _no_writes_under(tmp_path) as attempts:
        loaded = _readers()[reader](folder)
    assert attempts == []  # not even a temporary that is gone again by the end
    assert snapshot(folder) == before
    assert snapshot(outside) == outside_before
    if hasattr(loaded, "config") and hasattr(loaded, "classifier"):
        assert _loaded_model_is_whole(loaded, pair) == "A"


def test_load_quantized_changes_nothing(tmp_path):
    from bertblocks.models.quantize import load_quantized, quantize, save_quantized

    folder = tmp_path / "int8"
    save_quantized(quantize(bertblocks.create_model(TINY).eval()), folder)
    (folder / LEGACY_JOURNAL).write_text('{"staging": "x", "install": ["model.int8.safetensors"]}')
    before = snapshot(folder)
    with _no_writes_under(tmp_path) as attempts:
        load_quantized(folder)
    assert attempts == []
    assert snapshot(folder) == before


#: the calls that create, rename or delete a file or folder
_MUTATORS = {
    os: ("rename", "replace", "unlink", "remove", "rmdir", "mkdir", "makedirs", "link", "symlink", "truncate"),
    shutil: ("rmtree", "move", "copy", "copy2", "copyfile", "copytree"),
}


@contextlib.contextmanager
def _no_writes_under(root: Path) -> Iterator[list[str]]:
    """Record every call (``os.rename``, ``os.unlink``, ``shutil.rmtree``, ``open`` for writing, …) that would
    change something under ``root``, and refuse it; yields the list of those calls."""
    attempts: list[str] = []
    inside = str(root.resolve())
    real_open = os.open

    def touches(args: tuple[object, ...]) -> bool:
        return any(isinstance(a, str | Path) and os.path.abspath(a).startswith(inside) for a in args)

    def guard(module: object, name: str, function: Callable[..., object]) -> Callable[..., object]:
        def guarded(*args: object, **kwargs: object) -> object:
            if touches(args):
                attempts.append(f"{name}{args}")
                raise PermissionError(f"a reader called {name}{args}")
            return function(*args, **kwargs)

        return guarded

    def guarded_open(path: object, flags: int, *args: object, **kwargs: object) -> int:
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        if writing and touches((path,)):
            attempts.append(f"os.open{(path, flags)}")
            raise PermissionError(f"a reader opened {path} for writing")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    real_io_open = io.open

    def guarded_io_open(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if any(c in mode for c in "wax+") and touches((file,)):
            attempts.append(f"open{(file, mode)}")
            raise PermissionError(f"a reader opened {file} for writing")
        return real_io_open(file, mode, *args, **kwargs)  # type: ignore[call-overload]

    with pytest.MonkeyPatch.context() as patch:
        for module, names in _MUTATORS.items():
            for name in names:
                patch.setattr(module, name, guard(module, name, getattr(module, name)))
        patch.setattr(os, "open", guarded_open)
        patch.setattr(io, "open", guarded_io_open)  # what Path.open, write_text and write_bytes use
        patch.setattr(builtins, "open", guarded_io_open)
        yield attempts


def test_the_write_guard_sees_writes():
    # the guard itself: a write under the root is recorded and refused, one elsewhere is not
    root = Path(tempfile.mkdtemp())
    try:
        with _no_writes_under(root) as attempts:
            with pytest.raises(PermissionError):
                (root / "x").write_text("x")
            with pytest.raises(PermissionError):
                os.mkdir(root / "d")
        assert len(attempts) == 2
    finally:
        shutil.rmtree(root)


def _journal(**fields: object) -> bytes:
    return json.dumps({"staging": LEGACY_STAGING, "remove_first": [], "remove_after": [], **fields}).encode()


PLANTED_JOURNALS = {
    # earlier versions deleted the good model.safetensors reading this (its remove_after ran anyway)
    "commit file nowhere": _journal(install=["nothere.safetensors"], remove_after=["model.safetensors"]),
    # earlier versions: raw UnicodeDecodeError / RecursionError / ValueError (the CLI's exit 4, "a bug")
    "not UTF-8": b'{"staging": "\xff\xfe"}',
    "200k deep": b"[" * 200_000 + b"]" * 200_000,
    "a NUL byte in a name": _journal(install=["model\u0000.safetensors"]),
}


@pytest.mark.parametrize("journal", sorted(PLANTED_JOURNALS))
def test_a_planted_journal_is_just_a_file_to_a_load(tmp_path, pair, journal):
    folder = tmp_path / "ckpt"
    pair[0].save_pretrained(folder)
    (folder / LEGACY_STAGING).mkdir()
    (folder / LEGACY_JOURNAL).write_bytes(PLANTED_JOURNALS[journal])
    before = snapshot(folder)
    assert _loaded_model_is_whole(bertblocks.from_pretrained(folder, head="auto"), pair) == "A"
    assert snapshot(folder) == before


def test_a_save_touches_nothing_outside_the_folder_whatever_links_it_holds(tmp_path, pair):
    outside = _outside(tmp_path, pair)
    folder = tmp_path / "ckpt"
    pair[0].save_pretrained(folder)
    (folder / "notes.txt").symlink_to(outside / "secret.txt")
    (folder / "data").symlink_to(outside, target_is_directory=True)
    (folder / "model-00001-of-00002.safetensors").symlink_to(outside / "victim.safetensors")  # a stale shard
    (folder / "sub").mkdir()
    (folder / "sub" / "deep").symlink_to(outside / "secret.txt")
    (folder / LEGACY_STAGING).symlink_to(outside, target_is_directory=True)
    (folder / LEGACY_JOURNAL).write_bytes(_journal(install=["model.safetensors"], remove_after=["secret.txt"]))
    # a link beside the folder named like a killed save's generation: never followed, never removed through
    (tmp_path / f".ckpt{GENERATION}1-abcd").symlink_to(outside, target_is_directory=True)
    outside_before = snapshot(outside)
    pair[1].save_pretrained(folder, max_shard_size=20_000)
    pair[0].save_pretrained(folder)
    assert snapshot(outside) == outside_before
    assert os.readlink(folder / "notes.txt") == str(outside / "secret.txt")
    assert os.readlink(folder / "data") == str(outside)
    assert os.readlink(folder / "sub" / "deep") == str(outside / "secret.txt")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "data", "model.safetensors", "notes.txt", "sub"]
    assert (tmp_path / f".ckpt{GENERATION}1-abcd").is_symlink()
    assert _loaded_model_is_whole(bertblocks.from_pretrained(folder, head="auto"), pair) == "A"


def test_a_save_keeps_the_files_the_user_keeps_there_and_the_folder_mode(tmp_path, pair):
    folder = tmp_path / "ckpt"
    pair[0].save_pretrained(folder)
    _tokenizer_files(folder)
    (folder / "README.md").write_text("# my model\n")
    (folder / "onnx").mkdir()
    (folder / "onnx" / "model.onnx").write_bytes(b"onnx bytes")
    folder.chmod(0o750)
    kept = {name: (folder / name).read_bytes() for name in ("README.md", "tokenizer.json", "vocab.txt")}
    pair[1].save_pretrained(folder, max_shard_size=20_000)
    assert {name: (folder / name).read_bytes() for name in kept} == kept
    assert (folder / "onnx" / "model.onnx").read_bytes() == b"onnx bytes"
    assert folder.stat().st_mode & 0o777 == 0o750
    assert not [p for p in tmp_path.iterdir() if GENERATION in p.name]  # the old generation is gone
    assert _loaded_model_is_whole(bertblocks.from_pretrained(folder, head="auto"), pair) == "B"


# ------------------------------------------------------------------------------------------- concurrency
def test_two_processes_saving_into_one_folder_at_once_leave_one_whole_model(tmp_path, pair):
    # earlier versions: model A's weights with model B's id2label, 10 times in 10
    pair[0].save_pretrained(tmp_path / "ref-a", max_shard_size=20_000)
    pair[1].save_pretrained(tmp_path / "ref-b")
    refs = _plain_view(tmp_path / "ref-a"), _plain_view(tmp_path / "ref-b")
    for attempt in range(3):
        folder = tmp_path / f"ckpt{attempt}"
        pair[1].save_pretrained(folder)
        go = os.pipe()
        pids = []
        for index in (0, 1):
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    os.read(go[0], 1)  # both start together
                    for _ in range(4):
                        if index == 0:
                            pair[0].save_pretrained(folder, max_shard_size=20_000)
                        else:
                            pair[1].save_pretrained(folder)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        os.write(go[1], b"xx")
        for pid in pids:
            assert _exit_code(os.waitpid(pid, 0)[1]) == 0
        _which(_plain_view(folder), *refs)  # whole A (sharded) or whole B, and no other weight file
        _loaded_model_is_whole(bertblocks.from_pretrained(folder, head="auto"), pair)
        assert not [p for p in tmp_path.iterdir() if GENERATION in p.name]


def test_loads_while_another_process_saves_each_read_one_whole_model(tmp_path, pair):
    # earlier versions paired one model's config with the other's weights in almost every try
    folder = tmp_path / "ckpt"
    pair[0].save_pretrained(folder)
    progress = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            while True:
                pair[1].save_pretrained(folder, max_shard_size=20_000)
                pair[0].save_pretrained(folder)
                os.write(progress[1], b".")
        finally:
            os._exit(3)
    seen = []
    try:
        os.read(progress[0], 1)
        for _ in range(20):
            seen.append(_loaded_model_is_whole(bertblocks.from_pretrained(folder, head="auto"), pair))
    finally:
        os.kill(pid, signal.SIGKILL)
        assert _killed(os.waitpid(pid, 0)[1])
    assert len(seen) == 20


# ---------------------------------------------------------------------------------------------- fallback
def test_the_fallback_without_the_swap_leaves_old_new_or_no_entry_point(tmp_path, pair, monkeypatch):
    monkeypatch.setattr(atomic, "renameat2", None)  # forked children inherit it
    pair[0].save_pretrained(tmp_path / "ref-a")
    pair[1].save_pretrained(tmp_path / "ref-b", max_shard_size=20_000)
    old, new = _plain_view(tmp_path / "ref-a"), _plain_view(tmp_path / "ref-b")
    probe = tmp_path / "probe"
    shutil.copytree(tmp_path / "ref-a", probe)
    steps = _steps(lambda: pair[1].save_pretrained(probe, max_shard_size=20_000))
    assert "exchanged" not in steps
    outcomes = []
    for k in _kill_points(steps):
        folder = tmp_path / f"k{k}"
        shutil.copytree(tmp_path / "ref-a", folder)

        def save(folder: Path = folder, k: int = k) -> None:
            with _hook(_kill_at(k)):
                pair[1].save_pretrained(folder, max_shard_size=20_000)

        status = _fork(save)
        assert _killed(status) if k < len(steps) else _exit_code(status) == 0
        view = _plain_view(folder)
        before = snapshot(folder)
        if view[1] is None:  # killed inside the install: every reader refuses, loudly
            with pytest.raises(WeightsNotFoundError):
                bertblocks.from_pretrained(folder, head="auto")
            outcomes.append("none")
        else:
            outcomes.append(_which(view, old, new, names=False))
            bertblocks.from_pretrained(folder, head="auto")
        assert snapshot(folder) == before
    assert outcomes[0] == "old"
    assert outcomes[-1] == "new"
    order = {"old": 0, "none": 1, "new": 2}
    assert [order[o] for o in outcomes] == sorted(order[o] for o in outcomes), outcomes
    pair[0].save_pretrained(tmp_path / "k0")  # the next save removes what a killed one staged
    assert not [p for p in (tmp_path / "k0").iterdir() if p.name.startswith(GENERATION)]


def test_a_swap_the_file_system_refuses_falls_back_and_leaves_nothing_beside(tmp_path, pair, monkeypatch):
    calls = []

    def refused(*args: object) -> int:
        calls.append(args)
        return errno.EINVAL  # a file system without RENAME_EXCHANGE

    folder = tmp_path / "ckpt"
    pair[0].save_pretrained(folder)
    (folder / "README.md").write_text("kept")
    monkeypatch.setattr(atomic, "renameat2", refused)
    pair[1].save_pretrained(folder, max_shard_size=20_000)
    assert calls
    assert _loaded_model_is_whole(bertblocks.from_pretrained(folder, head="auto"), pair) == "B"
    assert (folder / "README.md").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert not [p for p in folder.iterdir() if p.name.startswith(GENERATION)]


# --------------------------------------------------------------------------------------- quantized folders
@pytest.fixture(scope="module")
def quantized() -> tuple[torch.nn.Module, torch.nn.Module]:
    from bertblocks.models.quantize import quantize

    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(quantize(bertblocks.create_model(TINY).eval()))
    return models[0], models[1]


def _which_quantized(folder: Path, quantized: tuple[torch.nn.Module, torch.nn.Module]) -> str:
    from bertblocks.models.quantize import load_quantized

    state = load_quantized(folder).state_dict()
    for name, reference in zip(("old", "new"), quantized, strict=True):
        expected = reference.state_dict()
        if state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state):
            return name
    raise AssertionError("the loaded int8 model is neither the old nor the new one")


def test_a_kill_at_any_step_of_save_quantized_leaves_the_old_or_the_new_folder(tmp_path, quantized):
    # earlier versions rewrote config.yaml and the manifest in place first: a kill lost the good folder
    from bertblocks.models.quantize import save_quantized

    save_quantized(quantized[0], tmp_path / "ref")
    (tmp_path / "ref" / "README.md").write_text("kept")
    shutil.copytree(tmp_path / "ref", tmp_path / "probe")
    steps = _steps(lambda: save_quantized(quantized[1], tmp_path / "probe"))
    outcomes = []
    for k in _kill_points(steps):
        folder = tmp_path / f"k{k}"
        shutil.copytree(tmp_path / "ref", folder)

        def save(folder: Path = folder, k: int = k) -> None:
            with _hook(_kill_at(k)):
                save_quantized(quantized[1], folder)

        status = _fork(save)
        assert _killed(status) if k < len(steps) else _exit_code(status) == 0
        before = snapshot(folder)
        outcomes.append(_which_quantized(folder, quantized))
        assert snapshot(folder) == before
        assert (folder / "README.md").read_text() == "kept"
    commit = steps.index("exchanged")
    assert outcomes == ["old" if k < commit else "new" for k in _kill_points(steps)], outcomes


def test_a_full_disk_during_save_quantized_is_a_one_line_write_error_and_keeps_the_folder(tmp_path, quantized):
    # earlier versions: a raw SafetensorError, after config.yaml and the manifest were already replaced
    from bertblocks.models.quantize import save_quantized

    folder = tmp_path / "int8"
    save_quantized(quantized[0], folder)
    before = snapshot(folder)
    errors = tmp_path / "stderr"

    def save() -> int:
        try:
            save_quantized(quantized[1], folder)
        except WriteError as e:
            print(e, file=sys.stderr)
            return 1
        return 0

    status = _fork(save, file_size_limit=4096, stderr=errors)
    message = errors.read_text().strip().splitlines()
    assert _exit_code(status) == 1, message
    assert len(message) == 1, message
    assert "file-size limit" in message[0]
    assert "model.int8.safetensors" in message[0]
    assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int8", "stderr"]


# ---------------------------------------------------------------------------------------------------- CSV
FORMULAS = ["=2+3", "=cmd|' /C calc'!A0", "+1+1", "-1+2", "@SUM(A1:A2)", "\t=1", "\r=1"]


def test_results_csv_writes_formula_like_names_as_text(tmp_path):
    from bertblocks.ablation import report

    names = [*FORMULAS, "plain", "-0.5", "1e3"]
    records = [{"variant": n, "seed": 0, "metrics": {"params": 1.0, "eval_loss": -0.25}} for n in names]
    report.write_csv(tmp_path / "results.csv", report.summarize([(n, {}) for n in names], records))
    with open(tmp_path / "results.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    written = {row["variant"] for row in rows}
    assert written == {"'" + n for n in FORMULAS} | {"plain", "-0.5", "1e3"}
    assert {row["eval_loss"] for row in rows} == {"-0.25"}  # numbers stay numbers


def test_neutralise_cell_marks_every_formula_start_and_nothing_else():
    assert [atomic.neutralise_cell(v) for v in FORMULAS] == ["'" + v for v in FORMULAS]
    assert [atomic.neutralise_cell(v) for v in ("a=b", "-1.5", "+2", "", 3, -1.0, None)] == [
        "a=b",
        "-1.5",
        "+2",
        "",
        3,
        -1.0,
        None,
    ]


# ------------------------------------------------------------------------------- every write goes through
#: direct writes to a file; the package writes only through bertblocks.atomic
DIRECT_WRITES = re.compile(
    r"""open\([^)]*["'][rbt]*[wax+][rbt+]*["']"""  # open(..., "w") and the other writing modes
    r"|\.write_text\(|\.write_bytes\("
    r"|\btorch\.save\(|\bsave_file\(|\bsave_model\(|\bjson\.dump\(|\byaml\.(safe_)?dump\([^)]*,\s*\w"
    r"|\bshutil\.(move|copy\w*)\(|\bos\.(replace|rename|renames)\(|\.savefig\(|\.backend\.save\("
)
#: (file, line) → why it may write directly. Only what cannot go through bertblocks.atomic.
ALLOWED = {
    # the study's lock file is locked by its inode, so it is opened in place (a replaced file is another lock)
    ("ablation/lock.py", 'handle = open(self.path, "a+", encoding="utf-8")'),
    # a Writer: writes into the open file bertblocks.atomic hands it, not to a path
    ("hf/weights.py", "return lambda f: torch.save(dict(shard), f)"),
    (
        "integrations/trainer.py",
        "write_file(path, lambda f: torch.save(self.args, f))",
    ),
    # into memory: the run's weights travel back to the runner as bytes (which writes them atomically)
    ("ablation/training.py", "torch.save(model.state_dict(), buffer)"),
    # into memory: the figure's bytes are then written atomically
    ("ablation/report.py", 'fig.savefig(image, dpi=110, format="png")'),
}


def direct_writes(package: Path) -> list[str]:
    """``file:line: text`` of every direct write under ``package`` outside atomic.py and the allow-list."""
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative == "atomic.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            text = line.strip()
            if DIRECT_WRITES.search(text) and not text.startswith(("#", ">>>")) and (relative, text) not in ALLOWED:
                found.append(f"{relative}:{number}: {text}")
    return found


def test_every_write_in_the_package_goes_through_bertblocks_atomic():
    assert direct_writes(PACKAGE) == []


def test_every_allowed_direct_write_still_exists():
    lines = {
        (p.relative_to(PACKAGE).as_posix(), line.strip())
        for p in PACKAGE.rglob("*.py")
        for line in p.read_text(encoding="utf-8").splitlines()
    }
    assert lines >= ALLOWED, sorted(ALLOWED - lines)


def test_the_write_check_catches_a_planted_bypass(tmp_path):
    package = tmp_path / "bertblocks"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    bypasses = [
        'open(path, "w").write(text)',
        'with open(path, mode="ab") as f:',
        "Path(path).write_text(text)",
        "path.write_bytes(data)",
        "torch.save(state, path)",
        "save_file(tensors, str(path))",
        "json.dump(data, handle)",
        "shutil.move(a, b)",
        "os.replace(tmp, path)",
        "os.rename(tmp, path)",
    ]
    (package / "families" / "planted.py").write_text("\n".join(f"    {b}" for b in bypasses) + "\n")
    found = direct_writes(package)
    assert found == [f"families/planted.py:{i}: {b}" for i, b in enumerate(bypasses, 1)]
