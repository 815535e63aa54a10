"""One run of a study (a variant with a seed): what every executor calls, in whatever process it has.

A :class:`RunTask` carries everything the run needs as plain data (the validated config as a dict, the
measurement and training settings, the token tensors), so the same function gives the same numbers in a
local worker process, a Ray task on another machine, or the calling process.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from .data import PreparedData
from .downstream import DownstreamRunTask, run_downstream
from .measure import measure_costs, used_parameters
from .study import MeasureSpec, TrainSpec


@dataclass
class RunTask:
    """Everything one run needs.

    Attributes:
        variant: the variant's name.
        seed: initial weights, batch order and masking come from it.
        config: the variant's validated config (``BertConfig.model_dump()``).
        measure: the study's :class:`MeasureSpec` as a dict.
        train: the study's :class:`TrainSpec` as a dict, or ``None`` for costs only.
        data: the study's token tensors (``None`` without training).
        threads: ``torch.set_num_threads`` for the run (equal everywhere, so numbers are identical).
        fingerprint: identifies the run's inputs; a finished run is reused only when it matches.
        run_id: file-name-safe id (variant slug and seed).
    """

    variant: str
    seed: int
    config: dict[str, Any]
    measure: dict[str, Any]
    train: dict[str, Any] | None
    data: PreparedData | None
    threads: int
    fingerprint: str
    run_id: str
    #: return the pre-trained ``state_dict`` (``torch.save`` bytes) as the record's ``weights``, for the
    #: study's downstream tasks (:mod:`bertblocks.ablation.downstream`); the runner stores it apart
    keep_weights: bool = False


def load_average() -> float | None:
    """The one-minute load average (``None`` where the system does not keep one)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def execute(task: RunTask | DownstreamRunTask) -> dict[str, Any]:
    """Build the variant, measure its costs, train and evaluate when asked; return the run's record.

    A :class:`~bertblocks.ablation.downstream.DownstreamRunTask` is a fine-tuning of a pre-trained run
    instead (:func:`~bertblocks.ablation.downstream.run_downstream`), so every executor runs both.
    """
    from bertblocks.config_files import load_config
    from bertblocks.zoo import create_model

    if isinstance(task, DownstreamRunTask):
        return run_downstream(task)

    torch.set_num_threads(task.threads)
    config = load_config(task.config)
    measure = MeasureSpec.model_validate(task.measure)
    started = time.time()
    load_before = load_average()
    torch.manual_seed(task.seed)
    backbone = create_model(config)
    metrics: dict[str, Any] = measure_costs(backbone, config, measure)
    if "params" in measure.metrics:
        # at the length the quality numbers come from: the training length when the study trains
        length = int(task.train["seq_len"]) if task.train is not None else measure.seq_len
        metrics["params_used"] = used_parameters(backbone, config, length)
        metrics["params_used_at"] = length
    del backbone
    if task.train is not None:
        from .training import train_and_evaluate

        assert task.data is not None
        metrics.update(
            train_and_evaluate(
                config, task.data, TrainSpec.model_validate(task.train), task.seed, keep_weights=task.keep_weights
            )
        )
    diverged = "diverged_at_step" in metrics
    samples = metrics.pop("eval_samples", None)
    weights = metrics.pop("weights", None)
    record: dict[str, Any] = {
        "variant": task.variant,
        "seed": task.seed,
        "run_id": task.run_id,
        "fingerprint": task.fingerprint,
        # a diverged run is a result, not a failure: recorded (so a resume does not redo it) and reported
        "status": "diverged" if diverged else "ok",
        "metrics": {k: v for k, v in metrics.items() if not (isinstance(v, float) and not math.isfinite(v))},
        "torch": torch.__version__,
        "threads": task.threads,
        "seconds": time.time() - started,
        # the machine's load while the timings were taken: the report leaves out timings that load made noise
        "load_average": [v for v in (load_before, load_average()) if v is not None],
        "cpus": os.cpu_count(),
    }
    if samples is not None:  # per-token (per-example) eval values, for the intervals of the summaries
        record["eval_samples"] = samples
    if weights is not None:
        record["weights"] = weights
    return record
