"""Ablation studies: swap components of a config, measure each variant, and compare.

A study file names a base config (a preset or a file), what to vary (dotted keys with value lists, or named
variants of overrides, per-layer overrides included), the input shape to measure costs at, and optionally a
short training run for a quality number, and downstream tasks each pre-trained run is fine-tuned on
(:mod:`~bertblocks.ablation.downstream`). :func:`run_study` runs every variant × seed in local worker
processes or on a Ray cluster, writes each run as it finishes (an interrupted study resumes), and summarises
the results as a table, CSV, JSON and a PNG plot. ``bertblocks ablate STUDY.yaml`` is the command line.

Example:
    >>> from bertblocks.ablation import run_study
    >>> result = run_study("examples/studies/positions.yaml", "out/positions", workers=2)
    >>> result.summaries[0].mean["eval_loss"]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..errors import MissingAttributeError

if TYPE_CHECKING:
    from .runner import StudyResult, StudyRunError, run_study
    from .study import Study, StudyError, StudySpec, Variant, load_study

#: where each public name lives: imported on first use, so that ``bertblocks --help`` (which imports
#: :mod:`bertblocks.ablation.plugin` and ``cli`` to list and describe ``ablate``) loads no study machinery
_HOMES = {
    "StudyResult": "runner",
    "StudyRunError": "runner",
    "run_study": "runner",
    "Study": "study",
    "StudyError": "study",
    "StudySpec": "study",
    "Variant": "study",
    "load_study": "study",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise MissingAttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Study",
    "StudyError",
    "StudyResult",
    "StudyRunError",
    "StudySpec",
    "Variant",
    "load_study",
    "run_study",
]
