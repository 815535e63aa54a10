"""Time bertblocks' BertModel against transformers' BertModel on the same weights, in one run.

Both models load one checkpoint that transformers saved (random weights, bert-base shape unless
``--quick``), run in ``eval()`` under ``torch.inference_mode()`` in fp32 with SDPA attention, and are timed
alternately (ours, theirs, ours, theirs, ...) so that load from other processes on the machine hits both
sides alike. The table reports the median of the repeats and the ratio ours / transformers (below 1.0:
bertblocks is faster).

Cases:

* ``full``: every sequence of the batch has the full length (no padding, no mask).
* ``padded``: the same batch with lengths ``[128, 20, 35, 64, 16, 90, 12, 48]`` (right padding, a mask).
  bertblocks runs it twice: with its default (``encoder.packing=auto``: dense layers see real tokens only)
  and with ``encoder.packing=never`` (the same work as transformers).

Run from the repository root::

    python benchmarks/bench_encoder.py            # bert-base, batch 8 x 128 (a few minutes on 2 cores)
    python benchmarks/bench_encoder.py --quick    # a small model for a smoke test (seconds)
"""

from __future__ import annotations

import argparse
import gc
import logging
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

import bertblocks

BASE = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
}
QUICK = {
    "vocab_size": 1000,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "max_position_embeddings": 128,
}
PADDED_LENGTHS = [128, 20, 35, 64, 16, 90, 12, 48]


@dataclass
class Case:
    name: str
    inputs: dict[str, torch.Tensor]
    real: torch.Tensor | None  # [b, L] bool: positions compared between the two models


def make_cases(batch: int, length: int, vocab: int, seed: int) -> list[Case]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    types = torch.zeros_like(ids)
    lengths = [max(1, round(n * length / 128)) for n in PADDED_LENGTHS]
    lengths = (lengths * ((batch + len(lengths) - 1) // len(lengths)))[:batch]
    mask = (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).long()
    padded_ids = ids * mask  # pad token 0 at padded positions, as a tokenizer writes
    return [
        Case("full", {"input_ids": ids, "token_type_ids": types}, None),
        Case("padded", {"input_ids": padded_ids, "token_type_ids": types, "attention_mask": mask}, mask.bool()),
    ]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000.0


def bench(models: dict[str, Callable[[], object]], warmup: int, repeats: int) -> dict[str, list[float]]:
    """Interleaved timing: each repeat runs every model once, in rotating order."""
    for _ in range(warmup):
        for fn in models.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in models}
    names = list(models)
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            gc.collect()
            times[name].append(timed(models[name]))
    return times


def check_same(ours: torch.Tensor, theirs: torch.Tensor, real: torch.Tensor | None) -> float:
    if real is not None:  # packed runs leave zeros at padded positions; transformers computes them anyway
        ours, theirs = ours[real], theirs[real]
    return (ours - theirs).abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small model and batch (smoke test)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default 8; 4 with --quick)")
    parser.add_argument("--length", type=int, default=None, help="sequence length (default 128; 64 with --quick)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs of each model first")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs of each model (default 20; 5 quick)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = QUICK if args.quick else BASE
    batch = args.batch or (4 if args.quick else 8)
    length = args.length or (64 if args.quick else 128)
    repeats = args.repeats or (5 if args.quick else 20)

    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.getLogger("bertblocks").setLevel(logging.ERROR)
    torch.manual_seed(args.seed)
    print(f"date            {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"torch           {torch.__version__}  (threads: {torch.get_num_threads()}, left at default)")
    print(f"transformers    {transformers.__version__}")
    print(f"bertblocks      {bertblocks.__version__}")
    print(f"python          {platform.python_version()}  machine: {platform.machine()} {platform.processor() or ''}")
    print(f"model           {'quick' if args.quick else 'bert-base'} {shape}")
    print(f"batch x length  {batch} x {length}; warmup {args.warmup}, repeats {repeats} (interleaved), fp32, eval")
    print()

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "bert"
        transformers.BertModel(transformers.BertConfig(**shape)).save_pretrained(directory)
        theirs = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
        ours = bertblocks.from_pretrained(directory, attn_implementation="sdpa").eval()
        ours_unpacked = bertblocks.from_pretrained(
            directory, ["encoder.packing=never"], attn_implementation="sdpa"
        ).eval()

    print(f"{'case':<8} {'model':<28} {'median ms':>10} {'min-max ms':>16} {'ours/transformers':>18}", flush=True)
    for case in make_cases(batch, length, shape["vocab_size"], args.seed):
        inputs = case.inputs
        variants = {"transformers": theirs, "bertblocks": ours}
        if case.real is not None:
            variants["bertblocks (packing=never)"] = ours_unpacked

        def run(model: torch.nn.Module, inputs: dict[str, torch.Tensor] = inputs) -> torch.Tensor:
            with torch.inference_mode():
                return model(**inputs).last_hidden_state

        reference = run(theirs)
        for name, model in variants.items():
            diff = check_same(run(model), reference, case.real)
            if diff > 1e-4:
                raise SystemExit(f"{case.name}/{name}: outputs differ from transformers by {diff:.2e}")
        times = bench({name: (lambda m=model: run(m)) for name, model in variants.items()}, args.warmup, repeats)
        base = statistics.median(times["transformers"])
        for name, samples in times.items():  # printed per case: a bert-base run takes minutes
            med, lo, hi = statistics.median(samples), min(samples), max(samples)
            shown = "" if name == "transformers" else f"{med / base:.3f}"
            print(f"{case.name:<8} {name:<28} {med:>10.1f} {f'{lo:.1f}-{hi:.1f}':>16} {shown:>18}", flush=True)


if __name__ == "__main__":
    main()
