"""The documentation stays true: generated reference pages equal what the code generates now, commands shown
in code blocks are real ``bertblocks`` commands with real options, and relative links lead to files that exist.
Every code block is run by tests/test_doc_blocks.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from bertblocks import cli
from tools import docs_gen

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
FENCE = re.compile(r"^```(\w*)[^\n`]*\n(.*?)^```[ \t]*$", re.S | re.M)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ------------------------------------------------------------------------------------- generated pages
@pytest.mark.parametrize("name", sorted(docs_gen.PAGES))
def test_reference_page_is_up_to_date(name):
    path = DOCS / "reference" / name
    assert path.is_file(), f"{rel(path)} is missing; run `python tools/docs_gen.py`"
    expected = docs_gen.generate(DOCS / "reference")[path]
    assert path.read_text(encoding="utf-8") == expected, (
        f"{rel(path)} is stale; run `python tools/docs_gen.py` and commit the result"
    )


def test_generator_check_mode_reports_a_stale_page(tmp_path, capsys):
    assert docs_gen.main(["--out", str(tmp_path)]) == 0
    assert docs_gen.main(["--out", str(tmp_path), "--check"]) == 0
    page = tmp_path / "config.md"
    page.write_text(page.read_text(encoding="utf-8").replace("token vocabulary size", "words"), encoding="utf-8")
    assert docs_gen.main(["--out", str(tmp_path), "--check"]) == 1
    assert "config.md" in capsys.readouterr().err


def test_config_reference_lists_every_field():
    from bertblocks.config import BertConfig, EncoderConfig

    page = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    for name in BertConfig.model_fields:
        assert f"| `{name}` |" in page
    for name in EncoderConfig.model_fields:
        assert f"| `encoder.{name}` |" in page
    assert "| `encoder.num_layers` | int > 0 | `12` | number of layers (HF num_hidden_layers) |" in page


def test_components_reference_lists_every_builtin():
    from bertblocks.registry import Registry

    page = (DOCS / "reference" / "components.md").read_text(encoding="utf-8")
    for component in Registry(load_entry_points=False).components():
        assert f"| `{component.name}` | {docs_gen._cell(component.description)} |" in page


def test_cli_reference_lists_every_command():
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    for name in cli.SUBCOMMANDS:
        assert f"## `bertblocks {name}`" in page


def test_type_rendering():
    from typing import Annotated, Literal

    from pydantic import Field

    assert docs_gen.render_type(Annotated[float, Field(ge=0.0, le=1.0)]) == "float in [0, 1]"
    assert docs_gen.render_type(Annotated[int, Field(gt=0)] | None) == "int > 0 | null"
    assert docs_gen.render_type(Literal["a", "b"]) == "'a' | 'b'"
    assert docs_gen.render_type(dict[int, list[int]]) == "map[int, list[int]]"


# ------------------------------------------------------------------------------------ commands in docs
def shell_commands(path: Path) -> list[list[str]]:
    """``bertblocks`` command lines shown in shell blocks, and in transcripts (``$ bertblocks …``) of any block.

    In a transcript only the ``$`` lines are commands; the rest is output (``bertblocks ablate: error: …``).
    """
    commands = []
    for lang, body in FENCE.findall(path.read_text(encoding="utf-8")):
        lines = [line.strip() for line in body.splitlines()]
        transcript = any(line.startswith("$ ") for line in lines)
        if not transcript and lang not in {"bash", "sh", "shell", "console"}:
            continue
        for line in lines:
            if transcript:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line.startswith("bertblocks "):
                continue
            argv = shlex.split(line, comments=True)
            for stop in ("|", ">", "&&", ";"):  # only the bertblocks part of a pipeline
                if stop in argv:
                    argv = argv[: argv.index(stop)]
            commands.append(argv[1:])
    return commands


COMMANDS = [(page, argv) for page in PAGES for argv in shell_commands(page)]


def test_docs_show_commands():
    assert len(COMMANDS) > 10
    assert {argv[0] for _, argv in COMMANDS} >= {"build", "validate", "trace", "diagram", "similarity"}


@pytest.mark.parametrize(("page", "argv"), COMMANDS, ids=[f"{rel(p)}:{' '.join(a)[:40]}" for p, a in COMMANDS])
def test_command_in_docs_is_a_real_command_with_real_options(page, argv, capsys):
    assert argv[0] in cli.SUBCOMMANDS, f"{rel(page)} shows `bertblocks {argv[0]}`, which does not exist"
    try:
        cli.build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{rel(page)}: `bertblocks {' '.join(argv)}` does not parse: {capsys.readouterr().err}")
        raise AssertionError from e


# --------------------------------------------------------------------------------------------- links
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_lead_to_existing_files(page):
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    targets = [(page.parent / t).resolve() for t in LINK.findall(text) if "://" not in t]
    broken = [str(t.relative_to(ROOT)) for t in targets if not t.exists()]
    assert not broken, f"{rel(page)} links to missing files: {broken}"


def test_commands_are_read_from_shell_blocks_and_transcripts_only(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nbertblocks build x.yaml --set a=1 | head  # tree\n```\n"
        "```text\n$ bertblocks validate bad.yaml\nbertblocks validate: error: invalid config\n```\n"
        "```text\nbertblocks build: not a command, no transcript\n```\n",
        encoding="utf-8",
    )
    assert shell_commands(page) == [["build", "x.yaml", "--set", "a=1"], ["validate", "bad.yaml"]]


def test_every_page_is_linked_from_the_docs_index():
    index = DOCS / "index.md"
    linked = {(DOCS / t).resolve() for t in LINK.findall(index.read_text(encoding="utf-8")) if "://" not in t}
    orphans = [rel(p) for p in DOCS.rglob("*.md") if p != index and p.resolve() not in linked]
    assert not orphans, f"docs/index.md does not link to {orphans}"


def test_readme_links_every_page_and_names_every_subpackage():
    """README's Documentation list and Layout table keep up with docs/ and the package."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {(ROOT / t).resolve() for t in LINK.findall(readme) if "://" not in t}
    pages = [p for p in DOCS.rglob("*.md") if p.parent.name != "plugins" or p.name == "index.md"]
    missing = [rel(p) for p in pages if p.resolve() not in linked]
    assert not missing, f"README's Documentation list does not link to {missing}"
    packages = [p.name for p in (ROOT / "bertblocks").iterdir() if (p / "__init__.py").is_file()]
    unnamed = [name for name in packages if f"| `bertblocks/{name}/` |" not in readme]
    assert not unnamed, f"README's Layout table has no row for {unnamed}"


def test_generated_sections_are_up_to_date():
    stale = [
        rel(p)
        for p in docs_gen.sectioned_pages()
        if docs_gen.render_sections(p.read_text("utf-8")) != p.read_text("utf-8")
    ]
    assert not stale, f"{stale}: generated sections are stale; run `python tools/docs_gen.py`"


def test_a_stale_generated_section_is_found():
    page = "a <!-- docs_gen: positions -->\n`absolute`, `relative_key`, `relative_key_query`\n<!-- /docs_gen --> b"
    assert docs_gen.render_sections(page) != page
    assert "`rope`" in docs_gen.render_sections(page)


def test_the_documented_test_command_is_what_ci_runs():
    """README's whole-suite command (and CONTRIBUTING's) is the command .ci/run runs: CI's verdict is that
    command's summary, so a contributor who runs the documented one runs what CI judges."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^```bash fragment: the test suite itself, run by \.ci/run\n(.*?)^```", readme, re.S | re.M)
    assert block, "README.md: the test suite's block is gone"
    command = block.group(1).splitlines()[0].split("#")[0].strip()
    assert command.startswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(rf"^{re.escape(command)}(\s|$)", ci, re.M), f".ci/run does not run README's `{command}`"
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert re.search(rf"^{re.escape(command)}\s+#", contributing, re.M), f"CONTRIBUTING.md does not show `{command}`"
