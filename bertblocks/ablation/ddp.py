"""Data-parallel training of one variant (DDP, gloo backend, CPU): for runs too slow for one process.

Two ways in:

* ``torchrun`` (``python -m torch.distributed.run``), one process per rank::

      python -m torch.distributed.run --nproc_per_node 2 -m bertblocks.ablation.ddp \\
          examples/studies/positions.yaml --variant position=relative_key --seed 0 --out ablation/positions

* :func:`train_ddp` from Python, which starts the processes itself (``torch.multiprocessing``, spawn).

Every rank builds the model from the same seed (DDP also broadcasts rank 0's weights), draws the same global
batch and trains on its slice of it; DDP averages the gradients, so all ranks take the same optimizer step
and their weights stay identical. Rank 0 evaluates and writes the record to
``<out>/ddp/<variant>__seed<N>__ddp<W>.json``; its numbers are close to, not bit-identical with, the
single-process run of the same seed (the gradient sum is reduced in another order), so they are kept apart
from the study's ``runs/``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .data import PreparedData, get_tokenizer, load_texts, prepare
from .study import Study, StudyError, TrainSpec, expand_variants, load_study
from .training import evaluate, task_model, train_model


@dataclass
class DdpJob:
    """What every rank needs (plain data, pickled to spawned processes)."""

    variant: str
    slug: str
    config: dict[str, Any]
    train: dict[str, Any]
    data: PreparedData
    seed: int
    threads: int
    out_dir: str
    save_weights: bool = False


def prepare_job(
    study: str | Path | Study, variant: str, seed: int, out_dir: str | Path, overrides: Sequence[str] = ()
) -> DdpJob:
    """Load the study, prepare its data and pick ``variant``.

    Raises:
        StudyError: an invalid study, a study without ``train:``, or an unknown variant (naming the known ones).
    """
    study = study if isinstance(study, Study) else load_study(study, list(overrides))
    if study.spec.train is None:
        raise StudyError.single("train", "DDP training needs a `train:` section in the study", study)
    texts, labels = load_texts(study)
    tokenizer = get_tokenizer(study, texts, saved=Path(out_dir) / "tokenizer.json")
    data = prepare(study, tokenizer, texts, labels)
    extra: dict[str, Any] = {"vocab_size": data.vocab_size, "pad_token_id": data.pad_id}
    if study.spec.train.task == "classification":
        extra.update(num_labels=study.spec.train.num_labels, id2label=None, label2id=None)
    variants = {v.name: v for v in expand_variants(study, extra)}
    if variant not in variants:
        raise StudyError.single("variant", f"no variant {variant!r}; the study has: {', '.join(variants)}", study)
    chosen = variants[variant]
    return DdpJob(
        variant=variant,
        slug=chosen.slug,
        config=chosen.config.model_dump(mode="json"),
        train=study.spec.train.model_dump(mode="json"),
        data=data,
        seed=seed,
        threads=study.spec.threads,
        out_dir=str(out_dir),
    )


def run_rank(job: DdpJob, rank: int, world_size: int) -> dict[str, Any] | None:
    """One rank's share: an initialised process group must exist. Returns the record on rank 0."""
    from bertblocks.config_files import load_config

    torch.set_num_threads(job.threads)
    config = load_config(job.config)
    spec = TrainSpec.model_validate(job.train)
    torch.manual_seed(job.seed)
    model = task_model(job.data.task, config)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters and buffers
    weights = Path(job.out_dir) / "ddp" / "weights"
    if job.save_weights:
        weights.mkdir(parents=True, exist_ok=True)
        _save(model, weights / f"rank{rank}-initial.safetensors")
    metrics = train_model(ddp, job.data, spec, job.seed, rank=rank, world_size=world_size)
    if job.save_weights:
        _save(model, weights / f"rank{rank}-final.safetensors")
    if rank != 0:
        return None
    if "diverged_at_step" not in metrics:  # a diverged model has nothing to evaluate
        metrics.update(evaluate(model, job.data, spec))
    samples = metrics.pop("eval_samples", None)
    record: dict[str, Any] = {"variant": job.variant, "seed": job.seed, "world_size": world_size, "metrics": metrics}
    if samples is not None:
        record["eval_samples"] = samples
    path = Path(job.out_dir) / "ddp" / f"{job.slug}__seed{job.seed}__ddp{world_size}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def _save(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    # clone: tied weights share storage, which safetensors refuses to write twice
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(path))


def _spawned(rank: int, job: DdpJob, world_size: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        run_rank(job, rank, world_size)
    finally:
        dist.destroy_process_group()


def train_ddp(job: DdpJob, world_size: int = 2) -> dict[str, Any]:
    """Train ``job`` data-parallel in ``world_size`` local processes; returns rank 0's record."""
    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free loopback port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_spawned, args=(job, world_size, port), nprocs=world_size, join=True, start_method="spawn")
    path = Path(job.out_dir) / "ddp" / f"{job.slug}__seed{job.seed}__ddp{world_size}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun`` entry point: reads ``RANK`` / ``WORLD_SIZE`` (and the rendezvous) from the environment."""
    parser = argparse.ArgumentParser(prog="python -m bertblocks.ablation.ddp", description=__doc__.split("\n")[0])
    parser.add_argument("study", metavar="STUDY.yaml")
    parser.add_argument("--variant", required=True, help="the variant's name, as the results table shows it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, metavar="DIR")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--save-weights", action="store_true", help="write each rank's initial and final weights")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        print("run me under torchrun: python -m torch.distributed.run --nproc_per_node N -m bertblocks.ablation.ddp")
        return 2
    try:
        job = prepare_job(args.study, args.variant, args.seed, args.out, args.overrides)
    except StudyError as e:
        print(e, file=sys.stderr)
        return 1
    job.save_weights = args.save_weights
    dist.init_process_group("gloo")
    try:
        record = run_rank(job, dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()
    if record is not None:
        print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
