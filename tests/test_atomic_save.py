"""Checkpoint, export and report writes are atomic: real SIGKILLs at every step, a full disk, bad targets.

A forked child saves model B over a folder holding model A and SIGKILLs itself at step ``k`` of the write
sequence (:data:`bertblocks.atomic.step_hook`: the new generation, every staged file, every block written to
the OS, the swap, the removal of the old generation), for every ``k``; then the folder is read twice: as a
reader that knows nothing of bertblocks would (transformers: config.json and the weight entry point), and
through bertblocks' loader, which must leave the folder exactly as it found it. Each must be all A or all B,
never A's labels with B's weights, and never a stale weight file. Another test kills a saving loop after
random delays, so kills also land inside library code. tests/test_atomic_folders.py has the concurrent,
planted-link and fallback cases.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import bertblocks
from bertblocks import atomic
from bertblocks.atomic import GENERATION, WriteError
from bertblocks.hf.weights import CheckpointError, read_state_dict
from tests.conftest import TINY

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill tests fork")

LABELS_A = {0: "negative", 1: "positive"}
LABELS_B = {0: "no", 1: "yes"}


def _model(seed: int, labels: dict[int, str]) -> torch.nn.Module:
    torch.manual_seed(seed)
    return bertblocks.create_model({**TINY, "id2label": labels}, head="sequence_classification").eval()


@pytest.fixture(scope="module")
def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    return _model(0, LABELS_A), _model(1, LABELS_B)


# ------------------------------------------------------------------------------------------ helpers
def _fork(fn: Callable[[], int | None], *, file_size_limit: int | None = None, stderr: Path | None = None) -> int:
    """Run ``fn`` in a forked child; its wait status. ``file_size_limit``: RLIMIT_FSIZE (SIGXFSZ ignored)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            if stderr is not None:
                fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 2)
                sys.stderr = os.fdopen(2, "w", buffering=1)
            if file_size_limit is not None:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
            code = int(fn() or 0)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def _killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _exit_code(status: int) -> int:
    assert os.WIFEXITED(status), f"child died of signal {os.WTERMSIG(status)}"
    return os.WEXITSTATUS(status)


@contextmanager
def _hook(fn: Callable[[str], None]) -> Iterator[None]:
    previous, atomic.step_hook = atomic.step_hook, fn
    try:
        yield
    finally:
        atomic.step_hook = previous


def _steps(write: Callable[[], object]) -> list[str]:
    """The labels of every step ``write`` goes through."""
    labels: list[str] = []
    with _hook(labels.append):
        write()
    return labels


def _kill_at(k: int) -> Callable[[str], None]:
    count = iter(range(10**9))

    def hook(label: str) -> None:
        if next(count) == k:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


Snapshot = tuple[dict, dict[str, torch.Tensor] | None, list[str]]


def _plain_view(folder: Path) -> Snapshot:
    """What a reader that knows no journal (transformers) finds: config.json, the weights its entry point
    leads to (``None``: no entry point), and the visible file names."""
    config = json.loads((folder / "config.json").read_text())
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (folder / single).is_file():
            return config, read_state_dict([folder / single]), names
        if (folder / index).is_file():
            shards = dict.fromkeys(json.loads((folder / index).read_text())["weight_map"].values())
            return config, read_state_dict([folder / s for s in shards]), names
    return config, None, names


def _same(a: Snapshot, b: Snapshot, names: bool = True) -> bool:
    (config_a, weights_a, names_a), (config_b, weights_b, names_b) = a, b
    if config_a != config_b or (names and names_a != names_b) or weights_a is None or weights_b is None:
        return False
    return weights_a.keys() == weights_b.keys() and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def _which(view: Snapshot, old: Snapshot, new: Snapshot, names: bool = True) -> str:
    """``"old"`` or ``"new"``: the view is that checkpoint whole (``names``: and no other weight file is
    there; a plain reader mid-install may still find stale shards that no entry point leads to)."""
    if _same(view, old, names):
        return "old"
    if _same(view, new, names):
        return "new"
    config, weights, names = view
    raise AssertionError(
        f"a mix: labels {config.get('id2label')}, files {names}, "
        f"weights {'none' if weights is None else sorted(weights)[:3]}"
    )


SCENARIOS = {
    "single-to-single": ({}, {}),
    "single-to-sharded": ({}, {"max_shard_size": 20_000}),
    "sharded-to-fewer-shards": ({"max_shard_size": 12_000}, {"max_shard_size": 30_000}),
    "sharded-to-single": ({"max_shard_size": 20_000}, {}),
    "safetensors-to-bin": ({}, {"safe_serialization": False}),
    "bin-to-sharded-safetensors": ({"safe_serialization": False}, {"max_shard_size": 20_000}),
}


# ------------------------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_kill_at_any_step_of_save_pretrained_leaves_the_old_or_the_new_checkpoint(tmp_path, models, scenario):
    model_a, model_b = models
    old_options, new_options = SCENARIOS[scenario]
    model_a.save_pretrained(tmp_path / "ref-a", **old_options)
    model_b.save_pretrained(tmp_path / "ref-b", **new_options)
    old, new = _plain_view(tmp_path / "ref-a"), _plain_view(tmp_path / "ref-b")
    assert old[0]["id2label"] != new[0]["id2label"]

    probe = tmp_path / "probe"
    model_a.save_pretrained(probe, **old_options)
    steps = _steps(lambda: model_b.save_pretrained(probe, **new_options))
    assert _plain_view(probe)[2] == new[2]
    assert "wrote a block" in steps
    assert "exchanged" in steps

    outcomes = []
    points = _kill_points(steps)
    for k in points:
        folder = tmp_path / f"k{k}"
        shutil.copytree(tmp_path / "ref-a", folder)

        def save(folder: Path = folder, k: int = k) -> None:
            with _hook(_kill_at(k)):
                model_b.save_pretrained(folder, **new_options)

        status = _fork(save)
        if k < len(steps):
            assert _killed(status), f"step {k} ({steps[k]}): the child was not killed"
        else:
            assert _exit_code(status) == 0
        where = f"killed at step {k} ({steps[k] if k < len(steps) else 'none'})"
        # a reader that knows nothing of bertblocks: the old or the new checkpoint, whole, and nothing else
        plain = _which(_plain_view(folder), old, new)
        # bertblocks' loader reads the same, and changes nothing
        before = snapshot(folder)
        loaded = bertblocks.from_pretrained(folder, head="auto")
        assert snapshot(folder) == before, where
        after = _which(_plain_view(folder), old, new)
        assert plain == after, where
        assert loaded.config.id2label == (LABELS_A if after == "old" else LABELS_B), where
        reference = model_a if after == "old" else model_b
        assert torch.equal(loaded.classifier.weight, reference.classifier.weight), where
        outcomes.append(after)
    # killed before the swap: old; from then on: new
    commit = steps.index("exchanged")
    assert outcomes == ["old" if k < commit else "new" for k in points], outcomes

    # the next save into a folder left by a killed one removes the orphaned generation beside it
    def orphans() -> list[str]:
        return [p.name for p in tmp_path.iterdir() if p.name.startswith(f".k0{GENERATION}")]

    assert orphans()
    model_b.save_pretrained(tmp_path / "k0")
    assert not orphans()


def snapshot(folder: Path) -> dict[str, tuple[int, int, int, int, bytes | str]]:
    """Every entry under ``folder`` (not following links): inode, size, mtime, ctime, and contents (a link's
    target). Equal before and after means nothing was created, renamed, deleted or rewritten."""
    entries: dict[str, tuple[int, int, int, int, bytes | str]] = {}
    for root, dirs, names in os.walk(folder):
        for name in sorted([*dirs, *names]):
            path = Path(root) / name
            info = path.lstat()
            content: bytes | str = (
                os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else b""
            )
            key = str(path.relative_to(folder))
            entries[key] = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, content)
    top = folder.lstat()
    entries["."] = (top.st_ino, top.st_size, top.st_mtime_ns, top.st_ctime_ns, b"")
    return entries


def _kill_points(steps: list[str]) -> list[int]:
    """Every step (and the end), except that of a run of blocks written into one file only the first and the
    last are taken: those between leave the same state, a partly written staged file (the single-file test
    below kills after every block)."""
    block = "wrote a block"
    return [
        k
        for k in range(len(steps) + 1)
        if k == len(steps)
        or steps[k] != block
        or k == 0
        or steps[k - 1] != block
        or k + 1 == len(steps)
        or steps[k + 1] != block
    ]


def test_kills_after_random_delays_of_a_saving_loop_never_leave_a_mix(tmp_path, models):
    model_a, model_b = models
    model_a.save_pretrained(tmp_path / "ref-a")
    model_b.save_pretrained(tmp_path / "ref-b", max_shard_size=20_000)
    old, new = _plain_view(tmp_path / "ref-a"), _plain_view(tmp_path / "ref-b")
    folder = tmp_path / "loop"
    model_a.save_pretrained(folder)
    start = time.perf_counter()
    model_b.save_pretrained(folder, max_shard_size=20_000)
    model_a.save_pretrained(folder)
    one_save = (time.perf_counter() - start) / 2
    rng = random.Random(0)
    seen = set()
    for _ in range(25):
        # the child saves in a loop, B (sharded) then A (single file), and reports each save it finishes; the
        # parent waits for 1-3 of them (so that kills land in both saves, however slow the machine), then
        # kills it after a random delay of up to one save
        progress = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                while True:
                    model_b.save_pretrained(folder, max_shard_size=20_000)
                    os.write(progress[1], b".")
                    model_a.save_pretrained(folder)
                    os.write(progress[1], b".")
            finally:
                os._exit(3)
        os.close(progress[1])
        wanted = rng.randint(1, 3)
        while wanted > 0:
            wanted -= len(os.read(progress[0], wanted))
        time.sleep(rng.uniform(0, one_save))
        os.kill(pid, signal.SIGKILL)
        assert _killed(os.waitpid(pid, 0)[1])
        os.close(progress[0])
        # whole A or whole B (here "old" and "new" name the two models, not the order of the saves)
        view = _plain_view(folder)
        plain = _which(view, old, new)  # a reader that knows nothing of bertblocks: one model, whole
        before = snapshot(folder)
        bertblocks.from_pretrained(folder, head="auto")
        assert snapshot(folder) == before  # the load read only
        after = _which(_plain_view(folder), old, new)
        assert after == plain
        seen.add(after)
    assert seen == {"old", "new"}  # the kills landed in both saves


def test_a_swap_waits_for_a_reader_of_the_current_generation(tmp_path, models):
    # a reader holds the folder (as from_pretrained does while it reads config and weights); a save in another
    # process builds its generation but must not swap it in until the reader is done
    model_a, model_b = models
    folder = tmp_path / "ckpt"
    model_a.save_pretrained(folder)
    built, go = os.pipe(), os.pipe()

    def save() -> None:
        def hook(label: str) -> None:
            if label == "staged model.safetensors":
                os.write(built[1], b"x")

        os.read(go[0], 1)  # forked before the reader locks: a child would inherit the reader's lock
        with _hook(hook):
            model_b.save_pretrained(folder)

    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            save()
            code = 0
        finally:
            os._exit(code)
    with atomic.reading(folder):
        os.write(go[1], b"x")
        assert os.read(built[0], 1) == b"x"  # the new generation is complete
        time.sleep(0.5)
        # still the old generation, whole, however long the reader takes
        assert bertblocks.from_pretrained(folder, head="auto").config.id2label == LABELS_A
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the save swapped the folder under a reader"
    assert _exit_code(os.waitpid(pid, 0)[1]) == 0
    assert bertblocks.from_pretrained(folder, head="auto").config.id2label == LABELS_B
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


def test_a_full_disk_during_save_leaves_the_old_checkpoint_and_a_one_line_error(tmp_path, models):
    model_a, model_b = models
    model_a.save_pretrained(tmp_path / "ref-a")
    folder = tmp_path / "ckpt"
    model_a.save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")  # files of others stay
    before = _plain_view(folder)
    errors = tmp_path / "stderr"

    def save() -> int:
        try:
            model_b.save_pretrained(folder)
        except WriteError as e:
            print(str(e), file=sys.stderr)
            return 1
        return 0

    status = _fork(save, file_size_limit=20_000, stderr=errors)
    assert _exit_code(status) == 1, errors.read_text()
    message = errors.read_text().strip()
    assert len(message.splitlines()) == 1, message
    assert "file-size limit" in message
    assert "model.safetensors" in message
    assert _same(_plain_view(folder), before)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_saving_into_a_file_or_a_read_only_folder_is_a_clean_error(tmp_path, models):
    model_a, _ = models
    (tmp_path / "file").write_text("x")
    with pytest.raises(WriteError, match="is a file, not a directory"):
        model_a.save_pretrained(tmp_path / "file")
    with pytest.raises(WriteError, match=r"permission denied|read-only"):
        model_a.save_pretrained(_read_only_folder(tmp_path))


def _read_only_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        (folder / "probe").touch()
    except OSError:
        return folder
    (folder / "probe").unlink()  # root writes anyway: take a folder no one may create files in
    if not os.access("/sys", os.F_OK):
        pytest.skip("no folder here refuses writes to this user")
    return Path("/sys")


def test_resaving_sharded_or_as_bin_removes_the_old_weight_files_and_keeps_others(tmp_path, models):
    model_a, model_b = models
    folder = tmp_path / "ckpt"
    model_a.save_pretrained(folder)
    (folder / "vocab.txt").write_text("[PAD]\n")
    model_b.save_pretrained(folder, max_shard_size=20_000)
    names = sorted(p.name for p in folder.iterdir())
    assert "model.safetensors" not in names
    assert "model.safetensors.index.json" in names
    assert "vocab.txt" in names
    assert bertblocks.from_pretrained(folder, head="auto").config.id2label == LABELS_B
    model_a.save_pretrained(folder, safe_serialization=False)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "pytorch_model.bin", "vocab.txt"]
    assert bertblocks.from_pretrained(folder, head="auto").config.id2label == LABELS_A


def test_config_json_records_the_dtype_as_transformers_does(tmp_path, models):
    transformers = pytest.importorskip("transformers")
    model_a, _ = models
    model_a.save_pretrained(tmp_path / "fp32")
    config = json.loads((tmp_path / "fp32" / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "float32"
    half = _model(0, LABELS_A).to(torch.bfloat16)
    half.save_pretrained(tmp_path / "bf16")
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "bf16", dtype="auto")
    assert hf.dtype == torch.bfloat16


# ------------------------------------------------------------------------------- loading refuses
def test_a_tensor_in_two_shards_is_an_error_naming_both(tmp_path, models):
    model_a, _ = models
    folder = tmp_path / "ckpt"
    model_a.save_pretrained(folder, max_shard_size=20_000)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    from bertblocks.hf.weight_files import read_safetensors, write_safetensors

    first = read_safetensors(folder / shards[0])
    second = {k: v.clone() for k, v in read_safetensors(folder / shards[1]).items()}  # unmapped: rewritten below
    name = next(iter(first))
    data = {**second, name: first[name].clone()}
    with open(folder / shards[1], "wb") as f:
        write_safetensors(f, data, {"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"{name}' is in two shards") as error:
        bertblocks.from_pretrained(folder, head="auto")
    assert shards[0] in str(error.value)
    assert shards[1] in str(error.value)


def test_an_index_naming_a_tensor_twice_is_refused(tmp_path, models):
    model_a, _ = models
    folder = tmp_path / "ckpt"
    model_a.save_pretrained(folder, max_shard_size=20_000)
    path = folder / "model.safetensors.index.json"
    text = path.read_text()
    index = json.loads(text)
    name, shard = next(iter(index["weight_map"].items()))
    path.write_text(text.replace('"weight_map": {', f'"weight_map": {{\n    "{name}": "{shard}",', 1))
    with pytest.raises(CheckpointError, match="named twice"):
        bertblocks.from_pretrained(folder, head="auto")


def test_a_safetensors_index_never_leads_to_unpickling(tmp_path, models):
    model_a, _ = models
    folder = tmp_path / "ckpt"
    model_a.save_pretrained(folder, max_shard_size=20_000)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    victim = sorted(set(index["weight_map"].values()))[0]
    torch.save(read_state_dict([folder / victim]), folder / "evil.bin")
    index["weight_map"] = {k: ("evil.bin" if v == victim else v) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"not \.safetensors files: \['evil.bin'\]"):
        bertblocks.from_pretrained(folder, head="auto")
    # a pickle renamed .safetensors is read as safetensors (and refused), never unpickled
    (folder / "evil.bin").rename(folder / victim)
    index["weight_map"] = {k: (victim if v == "evil.bin" else v) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        bertblocks.from_pretrained(folder, head="auto")


def test_a_journal_of_an_earlier_version_is_ignored_by_a_load_and_dropped_by_a_save(tmp_path, models):
    # earlier versions replayed this journal on load; now a load reads only, and a save leaves it behind
    model_a, model_b = models
    folder = tmp_path / "ckpt"
    model_a.save_pretrained(folder)
    journal = ".bertblocks-save.json"
    (folder / journal).write_text('{"staging": "../../etc", "install": ["x"], "remove_first": [], "remove_after": []}')
    before = snapshot(folder)
    assert bertblocks.from_pretrained(folder, head="auto").config.id2label == LABELS_A
    assert snapshot(folder) == before
    model_b.save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


# ------------------------------------------------------------------------------ single files
def _kill_each_step(tmp_path: Path, write: Callable[[Path], object], old: bytes) -> list[bytes]:
    """Kill ``write(path)`` (over a file holding ``old``) at every step; the file's contents after each."""
    probe = tmp_path / "probe.out"
    probe.write_bytes(old)
    steps = _steps(lambda: write(probe))
    assert steps[-1] == f"replaced {probe.name}"
    assert "wrote a block" in steps
    results = []
    for k in range(len(steps) + 1):
        path = tmp_path / f"k{k}" / "out.file"
        path.parent.mkdir()
        path.write_bytes(old)

        def run(path: Path = path, k: int = k) -> None:
            with _hook(_kill_at(k)):
                write(path)

        status = _fork(run)
        assert _killed(status) if k < len(steps) else _exit_code(status) == 0
        results.append(path.read_bytes())
        # a later write removes the temporaries of the killed writer
        atomic.write_bytes(path, old)
        assert [p.name for p in path.parent.iterdir()] == ["out.file"]
    return results


def test_a_kill_at_any_step_of_a_file_write_leaves_the_old_or_the_new_file(tmp_path):
    new = os.urandom(100_000)  # several blocks: kills land mid-file too
    results = _kill_each_step(tmp_path, lambda path: atomic.write_bytes(path, new), b"old contents")
    assert results[:-2] == [b"old contents"] * (len(results) - 2)
    assert results[-2:] == [new, new]


def test_a_kill_at_any_step_of_an_export_leaves_the_earlier_export(tmp_path, models):
    from bertblocks.models.export import export_program, save_program

    _, model_b = models
    old = b"an earlier export"
    program = export_program(model_b)
    results = _kill_each_step(tmp_path, lambda path: save_program(program, path), old)
    assert all(r == old for r in results[:-2])
    for r in results[-2:]:
        (tmp_path / "new.pt2").write_bytes(r)
        loaded = torch.export.load(str(tmp_path / "new.pt2"))
        assert torch.equal(loaded.state_dict["classifier.weight"], model_b.classifier.weight)


def test_a_kill_at_any_step_of_the_ablation_report_leaves_the_earlier_report(tmp_path):
    from bertblocks.ablation import report

    def summaries(seed: int) -> list[report.VariantSummary]:
        records = [
            {"variant": "v", "seed": s, "metrics": {"params": 10.0, "eval_loss": seed + s / 10}} for s in range(3)
        ]
        return report.summarize([("v", {})], records)

    report.write_json(tmp_path / "old.json", "study", summaries(1), [])
    old = (tmp_path / "old.json").read_bytes()
    results = _kill_each_step(tmp_path, lambda path: report.write_json(path, "study", summaries(2), []), old)
    assert all(r == old for r in results[:-2])
    assert json.loads(results[-1])["variants"][0]["mean"]["eval_loss"] == pytest.approx(2.1)


def test_a_full_disk_while_writing_the_ablation_report_keeps_the_earlier_files(tmp_path):
    from bertblocks.ablation import report

    names = [f"variant-{i}-{'x' * 40}" for i in range(300)]  # both files above the 8 KiB limit
    records = [{"variant": n, "seed": 0, "metrics": {"params": 1.0, "eval_loss": 1.0}} for n in names]
    summaries = report.summarize([(n, {}) for n in names], records)
    for name in ("results.json", "results.csv"):
        (tmp_path / name).write_text("an earlier good report")
    errors = tmp_path / "stderr"

    def write() -> int:
        for write_one in (
            lambda: report.write_json(tmp_path / "results.json", "study", summaries, records),
            lambda: report.write_csv(tmp_path / "results.csv", summaries),
        ):
            try:
                write_one()
            except WriteError as e:
                print(e, file=sys.stderr)
        return 0

    assert _exit_code(_fork(write, file_size_limit=8192, stderr=errors)) == 0
    messages = errors.read_text().strip().splitlines()
    assert len(messages) == 2, messages
    assert all("file-size limit" in m for m in messages)
    for name in ("results.json", "results.csv"):
        assert (tmp_path / name).read_text() == "an earlier good report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "results.json", "stderr"]


# ----------------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, models) -> Path:
    folder = tmp_path_factory.mktemp("cli") / "ckpt"
    models[0].save_pretrained(folder)
    return folder


@pytest.mark.parametrize("suffix", [".pt2", ".onnx"])
def test_export_on_a_full_disk_exits_1_with_one_line_and_keeps_the_earlier_file(tmp_path, checkpoint, suffix):
    from bertblocks import cli

    if suffix == ".onnx":  # the ONNX exporter is an optional dependency (absent in the floor job)
        pytest.importorskip("onnxscript", reason="the ONNX export needs onnx and onnxscript")
    target = tmp_path / f"model{suffix}"
    target.write_bytes(b"an earlier good export")
    errors = tmp_path / "stderr"
    status = _fork(lambda: cli.main(["export", str(checkpoint), str(target)]), file_size_limit=4096, stderr=errors)
    message = errors.read_text().strip().splitlines()
    assert _exit_code(status) == cli.EXIT_INVALID, message
    assert len(message) == 1, message
    assert "file-size limit" in message[0]
    assert str(target) in message[0]
    assert target.read_bytes() == b"an earlier good export"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["stderr", target.name])


def test_export_to_a_directory_or_a_read_only_folder_exits_1_with_one_line(tmp_path, checkpoint, capsys):
    from bertblocks import cli

    (tmp_path / "model.pt2").mkdir()
    assert cli.main(["export", str(checkpoint), str(tmp_path / "model.pt2")]) == cli.EXIT_INVALID
    assert "is a directory" in capsys.readouterr().err
    target = _read_only_folder(tmp_path) / "model.pt2"
    assert cli.main(["export", str(checkpoint), str(target)]) == cli.EXIT_INVALID
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "permission denied" in err[0]


def test_embed_refuses_an_output_that_is_its_input_before_reading_it(tmp_path, capsys):
    from bertblocks import cli

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("not json, so reading it first would fail differently\n")
    (tmp_path / "link.jsonl").symlink_to(corpus)
    os.link(corpus, tmp_path / "hard.jsonl")
    for output in (corpus, tmp_path / "link.jsonl", tmp_path / "hard.jsonl", tmp_path / "." / "corpus.jsonl"):
        code = cli.main(["embed", "--input", str(corpus), "--output", str(output)])
        err = capsys.readouterr().err
        assert code == cli.EXIT_INVALID, err
        assert "refusing to overwrite the input" in err
    assert corpus.read_text().startswith("not json")


def test_a_model_loaded_from_a_folder_saves_back_into_it(tmp_path, models):
    # loaded tensors are views of the memory-mapped files: the save replaces those files by rename, so the
    # mapped ones stay whole (no SIGBUS, no weights changing under the loaded model) until they are unmapped
    model_a, model_b = models
    folder = tmp_path / "ckpt"
    model_a.save_pretrained(folder)

    def reload_and_save() -> None:
        loaded = bertblocks.from_pretrained(folder, head="auto")
        model_b.save_pretrained(folder)
        loaded.save_pretrained(folder)  # reads every mapped page of the replaced file

    assert _exit_code(_fork(reload_and_save)) == 0
    again = bertblocks.from_pretrained(folder, head="auto")
    assert again.config.id2label == LABELS_A
    assert torch.equal(again.classifier.weight, model_a.classifier.weight)
