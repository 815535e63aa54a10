"""Every code block of README.md and docs/ runs as written, or says why it cannot.

A fenced block whose language is ``python``, ``bash``, ``sh``, ``shell`` or ``console`` is run, each in a scratch
folder that holds links to the repository's ``examples/``, ``benchmarks/``, ``docs/`` and ``tools/`` (so the
paths the docs write resolve) and nothing else, offline:

- a ``python`` block is executed on its own, in a fresh namespace, as a reader pastes it;
- a shell block is run line by line (``\\`` continues a line) with ``bash``; ``bertblocks`` is the console script
  of the running interpreter's environment and ``python`` that interpreter. A line ending in a ``# exit N``
  comment must exit ``N`` (``bertblocks validate`` showing an error), every other line 0.

Words after the language in the fence's info string (````` ```python continue `````) say what else applies:

``continue``
    the block continues the page's previous ``python`` block: it runs in that block's namespace, after it.
``fragment``
    the block is not meant to run alone: a signature, an excerpt of a larger file, install lines (which
    ``.ci/run`` runs), commands that need a cluster. It is not run. The rest of the info string says why.
``slow``
    the block runs for minutes (a study, a benchmark). It is run by ``python -m pytest -m docs_slow
    tests/test_doc_blocks.py`` only (see CONTRIBUTING.md), not by the default suite.

A ``yaml`` (or ``json``, ``text``) block whose info string says ``file: NAME`` is a file the page asks the reader to
save: it is written as ``NAME`` into the page's scratch folder before the page's later blocks run. The blocks of one
page share that folder, in page order, as a reader's working directory.

A block of one of those languages with no marker and a command the runner cannot run fails, naming the page and
the line: a new doc block is run or explicitly marked, never silently ignored.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
#: the opening fence with its info string, the body, the closing fence (``` alone on its line)
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
LANGUAGES = {"python", "bash", "sh", "shell", "console"}
MARKERS = {"continue", "fragment", "slow"}
#: what a scratch folder links to, so that paths written relative to the repository root resolve
LINKED = ("examples", "benchmarks", "docs", "tools", "pyproject.toml", "constraints.txt")
#: the programs a shell line may start with: the ones this runner knows how to run offline
PROGRAMS = {"bertblocks", "python"}
EXIT = re.compile(r"#\s*exit (\d+)\b")


@dataclass
class Block:
    page: Path
    index: int  # the block's number among the page's fenced blocks
    line: int  # where the opening fence is (1-based)
    language: str
    markers: set[str]
    reason: str
    body: str
    chain: list[Block] = field(default_factory=list)  # earlier python blocks this one continues
    files: dict[str, str] = field(default_factory=dict)  # `file:` blocks above it on the page: name -> text

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def read_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks of the runnable languages, with their markers; ``continue`` chains resolved."""
    text = page.read_text(encoding="utf-8")
    found: list[Block] = []
    files: dict[str, str] = {}
    for index, match in enumerate(FENCE.finditer(text)):
        words = match.group(1).split()
        if len(words) == 3 and words[1] == "file:":
            files[words[2]] = match.group(2)
            continue
        if not words or words[0] not in LANGUAGES:
            continue
        markers = {w.rstrip(":") for w in words[1:2] if w.rstrip(":") in MARKERS}
        unknown = [w for w in words[1:2] if w.rstrip(":") not in MARKERS]
        if unknown:
            raise AssertionError(f"{page.relative_to(ROOT)}: unknown marker {unknown[0]!r}; known: {sorted(MARKERS)}")
        line = text.count("\n", 0, match.start()) + 1
        if "fragment" in markers and len(words) < 3:
            where = f"{page.relative_to(ROOT)}:{line}"
            raise AssertionError(f"{where}: say why the block is a fragment (```python fragment: the reason)")
        found.append(
            Block(page, index, line, words[0], markers, " ".join(words[2:]), match.group(2), files=dict(files))
        )
    previous: Block | None = None
    for block in found:
        if block.language != "python":
            continue
        if "continue" in block.markers:
            if previous is None:
                raise AssertionError(f"{block.name}: `continue` on the page's first python block")
            block.chain = [*previous.chain, previous]
        previous = block
    return found


BLOCKS = [block for page in PAGES for block in read_blocks(page)]
RUN = [b for b in BLOCKS if "fragment" not in b.markers]


_SCRATCH: dict[Path, Path] = {}


def _scratch(block: Block, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page's scratch folder (one per page, shared by its blocks), with the files the page saved so far."""
    if block.page not in _SCRATCH:
        folder = tmp_path_factory.mktemp(block.page.stem)
        for name in LINKED:
            (folder / name).symlink_to(ROOT / name)
        _SCRATCH[block.page] = folder
    folder = _SCRATCH[block.page]
    for name, text in block.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def shell_lines(body: str) -> list[tuple[str, int]]:
    """The block's commands (continuations joined, blank and comment-only lines dropped) and their exit codes."""
    lines, pending = [], ""
    for raw in body.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line.startswith("$ "):  # a console transcript: the command without its prompt
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        code = EXIT.search(line)
        lines.append((line, int(code.group(1)) if code else 0))
    return lines


def _params() -> list[object]:
    params = []
    for block in RUN:
        marks = [pytest.mark.docs_slow] if "slow" in block.markers else []
        params.append(pytest.param(block, id=block.name, marks=marks))
    return params


@pytest.mark.parametrize("block", _params())
def test_doc_block_runs(
    block: Block, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(_scratch(block, tmp_path_factory))
    if block.language == "python":
        namespace: dict[str, object] = {"__name__": "__docs__"}
        for part in [*block.chain, block]:
            code = compile(part.body, f"{part.name} (python block)", "exec")
            exec(code, namespace)
        return
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    env["HF_HUB_OFFLINE"] = "1"
    # a reader's environment: installed plugins load (the conftest turns autoload off for in-process tests);
    # the contributor install has the example plugin, which the ablation how-to's alibi study uses
    env.pop("BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD", None)
    for line, expected in shell_lines(block.body):
        program = shlex.split(line, comments=True)[0]
        assert program in PROGRAMS, (
            f"{block.name}: cannot run `{line}` here ({program} is not one of {sorted(PROGRAMS)}); "
            "mark the block `fragment` (and say why) if it is not meant to run in the tests"
        )
        line = re.sub(r"^python\b", shlex.quote(sys.executable), line)
        done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, check=False, timeout=900)
        assert done.returncode == expected, (
            f"{block.name}: `{line}` exited {done.returncode} (the page says {expected})\n{done.stdout[-2000:]}\n"
            f"{done.stderr[-3000:]}"
        )


def test_every_runnable_language_block_is_collected() -> None:
    assert len(RUN) > 40
    assert {b.language for b in RUN} >= {"python", "bash"}


def test_under_xdist_this_file_is_one_unit_of_work(request: pytest.FixtureRequest) -> None:
    """``pytest -n N`` (CI: ``-n 2``) sends this file's tests to one worker, in order: a page's blocks share its
    scratch folder (a later block reads what an earlier one wrote). Other tests are scheduled one by one."""
    from types import SimpleNamespace

    from conftest import one_worker_scope, pytest_xdist_make_scheduler

    this_file = request.node.nodeid.split("::")[0]
    assert one_worker_scope(request.node.nodeid) == this_file
    assert {one_worker_scope(f"{this_file}::test_doc_block_runs[{b.name}]") for b in RUN} == {this_file}
    assert one_worker_scope("tests/test_docs.py::test_type_rendering") == "tests/test_docs.py::test_type_rendering"
    tx = {"tx": ["popen", "popen"]}  # -n 2
    two_workers = SimpleNamespace(getoption=lambda _: "load", getvalue=tx.get)
    scheduler = pytest_xdist_make_scheduler(two_workers, None)
    assert scheduler._split_scope(request.node.nodeid) == this_file
    assert pytest_xdist_make_scheduler(SimpleNamespace(getoption=lambda _: "loadfile"), None) is None


def test_a_planted_stale_block_fails(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner would catch a block that no longer works: a removed function, a renamed option."""
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nimport bertblocks\nbertblocks.create_modle('bert-tiny-uncased')\n```\n"
        "```bash\nbertblocks build bert-tiny-uncased --sett x=1\n```\n"
        "```bash\npip install something\n```\n"
        "```python fragment: a signature\ndef f(x: int) -> int: ...\n```\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    blocks = read_blocks(page)
    assert [b.markers for b in blocks] == [set(), set(), set(), {"fragment"}]
    for block in blocks[:3]:
        with pytest.raises(AssertionError):
            _run_planted(block, tmp_path_factory, monkeypatch)


def _run_planted(block: Block, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "LINKED", ())
    try:
        test_doc_block_runs(block, tmp_path_factory, monkeypatch)
    except AssertionError:
        raise
    except Exception as error:  # a NameError/AttributeError from the pasted code is the block failing
        raise AssertionError(str(error)) from error


def test_continue_runs_in_the_previous_blocks_namespace_and_files_are_saved(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 2\n```\ntext\n```yaml file: my.yaml\nhidden_size: 32\n```\n"
        "```bash\nbertblocks validate my.yaml\n```\n```python continue\nassert x == 2\n```\n",
        encoding="utf-8",
    )
    blocks = read_blocks(page)
    assert [len(b.chain) for b in blocks] == [0, 0, 1]
    assert blocks[2].chain[0] is blocks[0]
    assert blocks[0].files == {}
    assert blocks[1].files == {"my.yaml": "hidden_size: 32\n"}


def test_exit_codes_and_continuations_are_read_from_shell_lines() -> None:
    body = "# a comment\nbertblocks validate x.yaml --set a=1   # exit 1, says why\npython -m a \\\n    --flag\n"
    assert shell_lines(body) == [
        ("bertblocks validate x.yaml --set a=1   # exit 1, says why", 1),
        ("python -m a      --flag", 0),
    ]
