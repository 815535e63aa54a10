"""Data-parallel training of one variant (DDP or FSDP, gloo backend, CPU): for runs too slow for one process.

Two ways in:

* ``torchrun`` (``python -m torch.distributed.run``), one process per rank::

      python -m torch.distributed.run --nproc_per_node 2 -m bertblocks.ablation.ddp \\
          examples/studies/positions.yaml --variant position=relative_key --seed 0 --out ablation/positions

  (``--strategy fsdp`` shards the parameters, gradients and optimizer state over the ranks instead of
  replicating them: for the larger family members)

* :func:`train_ddp` from Python, which starts the processes itself (``torch.multiprocessing``, spawn).

Every rank builds the model from the same seed (DDP also broadcasts rank 0's weights), draws the same global
batch and trains on its slice of it; DDP averages the gradients, so all ranks take the same optimizer step
and their weights stay identical. Rank 0 evaluates and writes the record to
``<out>/ddp/<variant>__seed<N>__ddp<W>.json``; its numbers are close to, not bit-identical with, the
single-process run of the same seed (the gradient sum is reduced in another order), so they are kept apart
from the study's ``runs/``.

``strategy="fsdp"`` (``--strategy fsdp``) uses FSDP2 (``torch.distributed.fsdp.fully_shard``, which runs
on CPU with gloo; the older ``FullyShardedDataParallel`` wrapper is not used): every encoder layer that runs
once per pass is its own shard group, the embeddings, heads and tied weights belong to the root group.
Between steps each rank holds ``1/W`` of every parameter, its gradient and its AdamW state; the whole
tensors exist only while a group runs. Every rank starts from the same seed (FSDP broadcasts nothing, so
the same seed is what makes the shards one model), the gradients are averaged over the ranks as with DDP,
and after training the ranks gather the full weights, which rank 0 loads into an unsharded model to
evaluate. The record goes to ``<out>/ddp/<variant>__seed<N>__fsdp<W>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..atomic import write_file, write_text
from ..readers import read_json
from .data import PreparedData, get_tokenizer, load_texts, prepare
from .study import Study, StudyError, TrainSpec, expand_variants, load_study
from .training import evaluate, resolved_train, task_model, train_flops_per_token, train_model


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
    strategy: Literal["ddp", "fsdp"] = "ddp"

    def record_path(self, world_size: int) -> Path:
        """Where rank 0 writes the record: ``<out>/ddp/<slug>__seed<N>__<strategy><W>.json``."""
        return Path(self.out_dir) / "ddp" / f"{self.slug}__seed{self.seed}__{self.strategy}{world_size}.json"


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
    if study.spec.train.lr_grid:
        raise StudyError.single(
            "train.lr_grid",
            "a learning-rate search runs in the study's own runs (bertblocks ablate), not under torchrun; "
            "set train.lr to the rate the study chose for this variant",
            study,
        )
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
        train=resolved_train(study),  # type: ignore[arg-type]
        data=data,
        seed=seed,
        threads=study.spec.threads,
        out_dir=str(out_dir),
    )


STRATEGIES = ("ddp", "fsdp")


def check_strategy(job: DdpJob) -> None:
    """Raises :class:`StudyError` for a ``job.strategy`` that is neither ``ddp`` nor ``fsdp``."""
    if job.strategy not in STRATEGIES:
        raise StudyError.single("strategy", f"unknown strategy {job.strategy!r}; choose {' or '.join(STRATEGIES)}")


def run_rank(job: DdpJob, rank: int, world_size: int) -> dict[str, Any] | None:
    """One rank's share: an initialised process group must exist. Returns the record on rank 0."""
    from bertblocks.config_files import load_config

    check_strategy(job)
    torch.set_num_threads(job.threads)
    config = load_config(job.config)
    spec = TrainSpec.model_validate(job.train)
    torch.manual_seed(job.seed)
    model = task_model(job.data.task, config)
    weights = Path(job.out_dir) / "ddp" / "weights"
    if job.save_weights:
        weights.mkdir(parents=True, exist_ok=True)
    if job.strategy == "fsdp":
        if job.save_weights:  # before sharding: each rank's own initial weights (the seed makes them equal)
            _save(model.state_dict(), weights / f"rank{rank}-initial.safetensors")
        trained: torch.nn.Module = shard(model, world_size)
    else:
        trained = DistributedDataParallel(model)  # broadcasts rank 0's parameters and buffers
        if job.save_weights:
            _save(model.state_dict(), weights / f"rank{rank}-initial.safetensors")
    per_rank = sum(_local_numel(p) for p in model.parameters())
    metrics: dict[str, Any] = dict(
        train_model(
            trained,
            job.data,
            spec,
            job.seed,
            rank=rank,
            world_size=world_size,
            flops_per_token=train_flops_per_token(config, spec.seq_len),
        )
    )
    state = full_state_dict(model)  # a collective under FSDP: every rank takes part
    if job.save_weights:
        _save(state, weights / f"rank{rank}-final.safetensors")
    if rank != 0:
        return None
    if job.strategy == "fsdp":  # evaluate an unsharded copy: a sharded forward would wait for the other ranks
        torch.manual_seed(job.seed)
        model = task_model(job.data.task, config)
        model.load_state_dict(state)
    if "diverged_at_step" not in metrics:  # a diverged model has nothing to evaluate
        metrics.update(evaluate(model, job.data, spec))
    metrics["params_per_rank"] = per_rank
    samples = metrics.pop("eval_samples", None)
    record: dict[str, Any] = {
        "variant": job.variant,
        "seed": job.seed,
        "world_size": world_size,
        "strategy": job.strategy,
        "metrics": metrics,
    }
    if samples is not None:
        record["eval_samples"] = samples
    path = job.record_path(world_size)
    write_text(path, json.dumps(record, indent=2) + "\n")  # atomically: a resumed study never reads half a record
    return record


def shard(model: torch.nn.Module, world_size: int) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2 over ``world_size`` CPU ranks: each encoder layer that runs once
    per pass and shares no weight with the rest of the model is a shard group of its own, the rest (the
    embeddings, the head, tied weights, layers that run several times as in ALBERT) is the root group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from bertblocks.core.encoder import Encoder

    # FSDP2 warns for every step that the model returns a view (the logits); that matters only to an in-place
    # op on the output, which the training loop does not do (tests/test_ddp.py: FSDP trains DDP's model)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    mesh = init_device_mesh("cpu", (world_size,))
    # a weight reachable from more than one place (tied embeddings) must stay in one group
    everywhere = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    for encoder in (m for m in model.modules() if isinstance(m, Encoder)):
        for index, layer in enumerate(encoder.layer):
            inside = Counter(id(p) for _, p in layer.named_parameters(remove_duplicate=False))
            if encoder.groups.count(index) == 1 and all(everywhere[k] == n for k, n in inside.items()):
                fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _local_numel(param: torch.Tensor) -> int:
    """Elements this rank holds of ``param``: its shard under FSDP, all of it otherwise."""
    to_local = getattr(param, "to_local", None)  # a DTensor (FSDP2's sharded parameter)
    return int(to_local().numel()) if to_local is not None else param.numel()


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of ``model``, gathered from the ranks when it is sharded (call it on every rank)."""
    state = {}
    for name, value in model.state_dict().items():
        full = getattr(value, "full_tensor", None)
        state[name] = (full() if full is not None else value).detach()
    return state


def _save(state: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save

    # clone: tied weights share storage, which safetensors refuses to write twice
    tensors = {k: v.detach().clone().contiguous() for k, v in state.items()}
    write_file(path, lambda f: f.write(save(tensors)))


def _leave_together() -> None:
    """Wait until every rank is done before any tears the group down: rank 0 still evaluates and writes the record
    after the others return, and a gloo group destroyed on one rank while its peer still holds the connection can
    abort the process (seen as ``terminate called without an active exception``, SIGABRT, now and then)."""
    dist.barrier()


def _spawned(rank: int, job: DdpJob, world_size: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        run_rank(job, rank, world_size)
        _leave_together()
    finally:
        dist.destroy_process_group()


def train_ddp(job: DdpJob, world_size: int = 2) -> dict[str, Any]:
    """Train ``job`` data-parallel (``job.strategy``: DDP or FSDP) in ``world_size`` local processes;
    returns rank 0's record."""
    import torch.multiprocessing as mp

    check_strategy(job)  # before any process starts
    with socket.socket() as s:  # a free loopback port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_spawned, args=(job, world_size, port), nprocs=world_size, join=True, start_method="spawn")
    return read_json(job.record_path(world_size))  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun`` entry point: reads ``RANK`` / ``WORLD_SIZE`` (and the rendezvous) from the environment."""
    parser = argparse.ArgumentParser(prog="python -m bertblocks.ablation.ddp", description=__doc__.split("\n")[0])
    parser.add_argument("study", metavar="STUDY.yaml")
    parser.add_argument("--variant", required=True, help="the variant's name, as the results table shows it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, metavar="DIR")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--save-weights", action="store_true", help="write each rank's initial and final weights")
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="ddp",
        help="ddp: every rank holds the whole model (default); fsdp: parameters, gradients and optimizer "
        "state sharded over the ranks",
    )
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
    job.strategy = args.strategy
    dist.init_process_group("gloo")
    try:
        record = run_rank(job, dist.get_rank(), dist.get_world_size())
        _leave_together()
    finally:
        dist.destroy_process_group()
    if record is not None:  # the per-token eval values stay in the file: thousands of numbers
        print(json.dumps({k: v for k, v in record.items() if k != "eval_samples"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
