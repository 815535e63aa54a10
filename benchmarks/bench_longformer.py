"""Longformer's banded attention against full attention on long sequences: time and memory as the length grows.

Contenders, each a bertblocks encoder with the same sizes, differing only in the attention sub-layer:

* ``longformer``: the ``longformer`` attention, windows of ``--window`` keys (scores ``b·h·L·(3w)``: linear in L);
* ``full-eager``: BERT's attention with the ``eager`` backend (scores ``b·h·L·L``, materialised);
* ``full-sdpa``: BERT's attention with ``sdpa`` (PyTorch's fused kernel: quadratic work, blockwise memory);
* ``hf-longformer``: transformers' ``LongformerModel`` of the same sizes (its chunked window), for reference.

Time (medians over ``--repeats`` interleaved, rotating forward passes), peak memory (fresh processes) and the table:
the long-context harness, ``benchmarks/long_context.py``. fp32, eval, ``torch.inference_mode``, batch 1, no padding.

Usage:
    python benchmarks/bench_longformer.py                      # lengths 1024 2048 4096, window 512
    python benchmarks/bench_longformer.py --lengths 4096 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import long_context

CONTENDERS = ("longformer", "full-eager", "full-sdpa", "hf-longformer")


def build(name: str, length: int, args: argparse.Namespace) -> Callable[[], object]:
    """The contender's forward pass on one random sequence of ``length`` tokens."""
    import bertblocks

    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (1, length), device=args.device)
    if name == "hf-longformer":
        import transformers

        logging.getLogger("transformers").setLevel(logging.ERROR)
        config = transformers.LongformerConfig(
            vocab_size=1024,
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            intermediate_size=4 * args.hidden,
            max_position_embeddings=length + 2,
            attention_window=args.window,
        )
        model = transformers.LongformerModel(config, add_pooling_layer=False)
    else:
        attention: dict[str, object] = {"num_heads": args.heads}
        if name == "longformer":
            attention.update(name="longformer", attention_window=args.window)
        else:
            attention["backend"] = name.removeprefix("full-")
        model = bertblocks.create_model(
            {
                "family": "roberta",
                "vocab_size": 1024,
                "hidden_size": args.hidden,
                "max_position_embeddings": length + 2,
                "type_vocab_size": 1,
                "pad_token_id": 1,
                "embedding": {"position_offset": "padding"},
                "encoder": {
                    "num_layers": args.layers,
                    "attention": attention,
                    "feedforward": {"intermediate_size": 4 * args.hidden},
                },
                "pooler": None,
            }
        )
    model = model.to(args.device).eval()

    def forward() -> object:
        with torch.inference_mode():
            return model(input_ids=ids)

    return forward


def describe(args: argparse.Namespace) -> str:
    return f"{args.layers} layers, hidden {args.hidden}, {args.heads} heads, window {args.window}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    long_context.add_arguments(parser, threads=2)
    parser.add_argument("--window", type=int, default=512, help="attention_window (keys, both sides)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    long_context.main(__file__, parser, CONTENDERS, build, describe, argv)


if __name__ == "__main__":
    main()
