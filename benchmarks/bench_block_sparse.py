"""BigBird's block-sparse attention against full attention on long sequences: time and peak memory.

Contenders (bigbird-roberta-base's shape: 768 wide, 12 heads of 64, blocks of 64 with 3 random blocks; two layers,
random weights, fp32, eval, ``torch.inference_mode``, batch 1), interleaved repeat by repeat so that machine noise
hits all alike (medians, ratios to ``block_sparse``; the harness ``benchmarks/long_context.py``):

1. ``block_sparse``: the ``block_sparse`` attention (gathered blocks, SDPA over them);
2. ``full_sdpa``: the same model with ``attention_type: original_full`` (one SDPA call over every key);
3. ``full_eager``: full attention with the ``eager`` backend (the ``[b, h, L, L]`` scores materialised, as
   transformers' ``original_full`` computes them).

Peak memory: each contender runs again in fresh subprocesses, which reset their peak resident set after building
the model (``/proc/self/clear_refs``, Linux) and report how far the forward pass raises it above the resident set
before the pass (``VmHWM - VmRSS``); on CUDA, ``torch.cuda.max_memory_allocated`` over the pass.

Usage:
    python benchmarks/bench_block_sparse.py                      # 1024, 2048 and 4096 tokens
    python benchmarks/bench_block_sparse.py --lengths 4096 --repeats 5
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import bertblocks

sys.path.insert(0, str(Path(__file__).resolve().parent))
import long_context

CONTENDERS: dict[str, list[str]] = {
    "block_sparse": [],
    "full_sdpa": ["encoder.attention.attention_type=original_full"],
    "full_eager": ["encoder.attention.attention_type=original_full", "encoder.attention.backend=eager"],
}


def build(name: str, length: int, args: argparse.Namespace) -> Callable[[], object]:
    """The contender's forward pass on one random sequence of ``length`` tokens."""
    torch.manual_seed(0)
    overrides = [f"encoder.num_layers={args.layers}", *CONTENDERS[name]]
    model = bertblocks.create_model("bigbird-roberta-base", overrides).to(args.device).eval()
    ids = torch.randint(100, 50000, (1, length), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones(1, length, dtype=torch.long)}
    inputs = {k: v.to(args.device) for k, v in inputs.items()}

    def forward() -> object:
        with torch.inference_mode():
            return model(**inputs)

    return forward


def describe(args: argparse.Namespace) -> str:
    return f"{args.layers} layers of bigbird-roberta-base's widths (768, 12 heads, blocks of 64, 3 random blocks)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    long_context.add_arguments(parser)
    parser.add_argument("--layers", type=int, default=2)
    long_context.main(__file__, parser, list(CONTENDERS), build, describe, argv)


if __name__ == "__main__":
    main()
