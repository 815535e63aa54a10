"""Nyströmformer's landmark attention against full attention on long sequences: time and memory as the length grows.

Contenders, each a bertblocks encoder with the same sizes (BERT's post-LN layers), differing only in the attention
sub-layer:

* ``nystrom``: the ``nystrom`` attention's landmark path, ``--landmarks`` segment means over the whole sequence
  (``segment_means_seq_len`` = the length) and a ``--conv``-wide value convolution (kernels ``b·h·L·m``: linear in L);
* ``full-eager``: BERT's attention with the ``eager`` backend (scores ``b·h·L·L``, materialised);
* ``full-sdpa``: BERT's attention with ``sdpa`` (PyTorch's fused kernel: quadratic work, blockwise memory);
* ``hf-nystromformer``: transformers' ``NystromformerModel`` of the same sizes and settings, for reference.

Time (medians over ``--repeats`` interleaved, rotating forward passes), peak memory (fresh processes) and the table:
the long-context harness, ``benchmarks/long_context.py``. fp32, eval, ``torch.inference_mode``, batch 1, no padding.

Usage:
    python benchmarks/bench_nystrom.py                      # lengths 1024 2048 4096, 64 landmarks
    python benchmarks/bench_nystrom.py --lengths 4096 --repeats 3
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

CONTENDERS = ("nystrom", "full-eager", "full-sdpa", "hf-nystromformer")


def build(name: str, length: int, args: argparse.Namespace) -> Callable[[], object]:
    """The contender's forward pass on one random sequence of ``length`` tokens."""
    import bertblocks

    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (1, length), device=args.device)
    if name == "hf-nystromformer":
        import transformers

        logging.getLogger("transformers").setLevel(logging.ERROR)
        config = transformers.NystromformerConfig(
            vocab_size=1024,
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            intermediate_size=4 * args.hidden,
            max_position_embeddings=length,
            num_landmarks=args.landmarks,
            segment_means_seq_len=length,
            conv_kernel_size=args.conv,
        )
        model = transformers.NystromformerModel(config)
    else:
        attention: dict[str, object] = {"num_heads": args.heads}
        if name == "nystrom":
            attention.update(
                name="nystrom", num_landmarks=args.landmarks, segment_means_seq_len=length, conv_kernel_size=args.conv
            )
        else:
            attention["backend"] = name.removeprefix("full-")
        model = bertblocks.create_model(
            {
                "family": "bert",
                "vocab_size": 1024,
                "hidden_size": args.hidden,
                "max_position_embeddings": length,
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
    return (
        f"{args.layers} layers, hidden {args.hidden}, {args.heads} heads, {args.landmarks} landmarks, "
        f"convolution {args.conv}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    long_context.add_arguments(parser, threads=2)
    parser.add_argument("--landmarks", type=int, default=64, help="num_landmarks (must divide every length)")
    parser.add_argument("--conv", type=int, default=33, help="conv_kernel_size (odd)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    long_context.main(__file__, parser, CONTENDERS, build, describe, argv)


if __name__ == "__main__":
    main()
