"""Result tables in Markdown pages, written from a study's results so that they cannot go stale.

A page marks each table with the study it comes from (a path relative to the page) and, optionally, the
``--set`` changes it ran with::

    <!-- ablation-table: ../../examples/studies/positions.yaml -->
    ```text
    (rewritten)
    ```
    <!-- /ablation-table -->

``python -m bertblocks.ablation.doctables PAGE.md --run`` runs (or resumes) every study the page names, into
``ablation/<study name>`` under ``--out-root``, and rewrites each block with the table of its
``results.json``; without ``--run`` it rewrites the blocks from results already there. ``--check`` rewrites
nothing and exits 1 when a block differs from its results (for CI).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..errors import BertBlocksError
from ..readers import ReadError, read_json
from . import downstream, report
from .comparisons import decide, full_table
from .study import StudySpec

#: a marked block; the markers start their lines (an indented one, e.g. in an example, is left alone)
BLOCK = re.compile(
    r"^(?P<open><!-- ablation-table: (?P<args>[^\n]*?) -->\n)(?P<body>.*?)^(?P<close><!-- /ablation-table -->)",
    re.DOTALL | re.MULTILINE,
)


class DocTableError(BertBlocksError):
    """A page whose tables cannot be written (a missing study or results file, a malformed marker)."""


@dataclass(frozen=True)
class TableBlock:
    """One marked block of a page: the study file and the ``--set`` changes it runs with."""

    study: Path
    overrides: tuple[str, ...]
    start: int
    end: int


def find_blocks(page: Path, text: str) -> list[TableBlock]:
    """The marked blocks of ``text`` (the page at ``page``), in order.

    Raises:
        DocTableError: a marker without a study, or with a study file that does not exist.
    """
    blocks = []
    for match in BLOCK.finditer(text):
        words = shlex.split(match["args"])
        line = text.count("\n", 0, match.start()) + 1
        if not words:
            raise DocTableError(f"{page}:{line}: the ablation-table marker names no study file")
        study = (page.parent / words[0]).resolve()
        if not study.is_file():
            raise DocTableError(f"{page}:{line}: study file not found: {study}")
        overrides = tuple(w.removeprefix("--set=") for w in words[1:] if w != "--set")
        blocks.append(TableBlock(study, overrides, match.start("body"), match.end("body")))
    return blocks


def table_from_results(path: Path) -> str:
    """The report :func:`bertblocks.ablation.comparisons.full_table` prints, rebuilt from a ``results.json``.

    Raises:
        DocTableError: the file is missing or not a study's results.
    """
    try:
        data: dict[str, Any] = read_json(path)
        variants = [(v["variant"], v.get("overrides", {})) for v in data["variants"]]
        records = [run for v in data["variants"] for run in v["runs"]]
        baseline = next((v["baseline"] for v in data["variants"] if v.get("baseline")), None)
        title = str(data["study"])
    except FileNotFoundError:
        raise DocTableError(f"no results at {path}: run the study first (or pass --run)") from None
    except (ReadError, KeyError, TypeError) as e:
        raise DocTableError(f"{path} is not the results.json of a study ({e})") from None
    summaries = report.summarize(variants, records, baseline=baseline)
    controls: list[downstream.ControlRow] = []
    fine_tunings = [run for v in data["variants"] for run in v.get("downstream_runs", [])]
    if fine_tunings:
        keys = [key for v in data["variants"] for key in v.get("downstream", {})]
        tasks: dict[str, list[str]] = {}
        for key in dict.fromkeys(keys):
            task, metric = key.rsplit("/", 1)
            tasks.setdefault(task, []).append(metric)
        downstream.attach(summaries, fine_tunings, list(tasks.items()), baseline)
        control_runs = [run for run in data.get("control_runs", []) if isinstance(run, dict)]
        controls = downstream.controls([*fine_tunings, *control_runs], list(tasks.items()), baseline)
    # the decisions as the run made them; results of a version before the adjustment get the defaults
    settings = data.get("comparisons") if isinstance(data.get("comparisons"), dict) else {}
    defaults = StudySpec.model_fields
    decide(
        summaries,
        records,
        fine_tunings,
        scope=str(settings.get("scope", defaults["comparisons"].default)),
        method=str(settings.get("adjust", defaults["adjust"].default)),
    )
    return full_table(title, summaries, controls)


def update_page(
    page: Path, *, run: bool = False, out_root: Path = Path("ablation"), workers: int = 1, check: bool = False
) -> list[Path]:
    """Rewrite every marked table of ``page`` from its study's results; returns the studies' output folders.

    Args:
        page: the Markdown page.
        run: run (or resume) each study first.
        out_root: the studies' output folders are ``out_root/<study name>``.
        workers: local worker processes per study (with ``run``).
        check: rewrite nothing; raise when a table differs from its results.

    Raises:
        DocTableError: a missing study or results file; with ``check``, the tables that differ.
    """
    from .runner import run_study
    from .study import load_study

    text = page.read_text(encoding="utf-8")
    pieces, last, folders, stale = [], 0, [], []
    for block in find_blocks(page, text):
        study = load_study(block.study, list(block.overrides))
        out = out_root / study.title
        if run:
            run_study(study, out, workers=workers, progress=False, echo=None)
        body = "```text\n" + table_from_results(out / "results.json") + "\n```\n"
        if text[block.start : block.end] != body:
            stale.append(str(block.study))
        pieces += [text[last : block.start], body]
        last = block.end
        folders.append(out)
    pieces.append(text[last:])
    if check:
        if stale:
            raise DocTableError(f"{page}: the tables of {', '.join(stale)} differ from their results")
    else:
        write_text(page, "".join(pieces))
    return folders


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bertblocks.ablation.doctables", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("pages", nargs="+", type=Path, metavar="PAGE.md")
    parser.add_argument("--run", action="store_true", help="run (or resume) each study first")
    parser.add_argument("--out-root", type=Path, default=Path("ablation"), metavar="DIR")
    parser.add_argument("--workers", type=int, default=1, metavar="N")
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    try:
        for page in args.pages:
            update_page(page, run=args.run, out_root=args.out_root, workers=args.workers, check=args.check)
    except BertBlocksError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
