"""``bertblocks ablate STUDY.yaml``: the command-line face of :func:`bertblocks.ablation.run_study`.

Registered by :mod:`bertblocks.ablation.plugin` (the ``bertblocks_register_commands`` hook); this module is
imported only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys

from .interrupts import StudyInterruptedError
from .runner import StudyRunError, run_study


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``bertblocks ablate``."""
    from bertblocks.cli import add_set_argument  # the one --set of every command (loaded: the CLI is running)

    parser.add_argument("study", metavar="STUDY.yaml", help="the study file (see docs/how-to/ablation-studies.md)")
    parser.add_argument("--out", metavar="DIR", help="output folder (default: ablation/<study name>)")
    parser.add_argument(
        "--executor", choices=("local", "ray"), default="local", help="local worker processes (default) or Ray"
    )
    parser.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="Ray cluster to join (HOST:PORT, ray://HOST:PORT or auto); default: a local Ray instance",
    )
    parser.add_argument(
        "--workers", type=int, default=1, metavar="N", help="local worker processes (default 1; 0: in this process)"
    )
    add_set_argument(parser, "study", ("train.steps=20", "measure.batch=4"))
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Run the study; exit 0 when every run finished, 1 when some failed (the rest are saved), 130/143 when a
    Ctrl-C/SIGTERM stopped it (the finished runs are saved; the line printed says how to resume)."""
    from bertblocks.cli import CLIError, UnavailableError

    if args.ray_address and args.executor != "ray":
        raise CLIError("--ray-address needs --executor ray")
    if args.executor == "ray" and importlib.util.find_spec("ray") is None:
        raise UnavailableError("--executor ray needs Ray: pip install -e '.[ray]' in the bertblocks checkout")
    as_json = getattr(args, "json", False)
    try:
        result = run_study(
            args.study,
            args.out,
            overrides=args.overrides,
            executor=args.executor,
            workers=args.workers,
            ray_address=args.ray_address,
            progress=not args.no_progress,
            echo=None if as_json else print,
        )
    except StudyRunError as e:
        raise CLIError(str(e)) from None
    except StudyInterruptedError as e:
        print(f"bertblocks ablate: {e}: {resume_command(args, e.out_dir)}", file=sys.stderr)
        return e.exit_code
    if as_json:  # the summaries (results.json without the per-run records)
        from .report import summary_dict

        summaries = [summary_dict(s) for s in result.summaries]
        print(json.dumps({"study": result.study.title, "out": str(result.out_dir), "variants": summaries}, indent=2))
    return 0


def resume_command(args: argparse.Namespace, out_dir: object) -> str:
    """The command that resumes this study: the same study, output folder, ``--set``s and executor."""
    words = ["bertblocks", "ablate", args.study, "--out", str(out_dir)]
    for override in args.overrides:
        words += ["--set", override]
    if args.executor != "local":
        words += ["--executor", args.executor]
    if args.ray_address:
        words += ["--ray-address", args.ray_address]
    if args.workers != 1:
        words += ["--workers", str(args.workers)]
    return shlex.join(words)
