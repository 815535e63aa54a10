"""Padding waste: bertblocks' packed encoder path vs transformers and PyTorch's nested-tensor fast path.

Same random bert-base weights for bertblocks and transformers (saved by transformers, loaded by bertblocks);
PyTorch's ``nn.TransformerEncoder`` gets the same shape (its own random weights: only time is compared).
fp32, eval, ``torch.inference_mode``, SDPA. Repeats alternate between the contenders so machine noise
hits all alike; medians are printed, with ratios to transformers.

1. The padded batch of the performance issue: lengths [128, 20, 35, 64, 16, 90, 12, 48] (413 real tokens of
   1024), and a uniform 8 x 128 batch.
2. Scaling: milliseconds per real token across sequence lengths and batch sizes (uniform batches), bertblocks
   vs transformers, and the share of the machine's measured matmul throughput that bertblocks reaches.

Usage:
    python benchmarks/bench_packed.py             # bert-base shape
    python benchmarks/bench_packed.py --quick     # small shape, few repeats
    python benchmarks/bench_packed.py --no-scaling
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import transformers
from torch import nn

import bertblocks

LENGTHS = [128, 20, 35, 64, 16, 90, 12, 48]


def _time(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _matmul_gflops(hidden: int) -> float:
    a, b = torch.randn(1024, hidden), torch.randn(hidden, 4 * hidden)
    for _ in range(3):
        a @ b
    start, n = time.perf_counter(), 10
    for _ in range(n):
        a @ b
    return 2 * 1024 * hidden * 4 * hidden * n / (time.perf_counter() - start) / 1e9


def _forward_flops(tokens: int, seqs: list[int], hidden: int, layers: int, inner: int) -> float:
    dense = 2 * tokens * (4 * hidden * hidden + 2 * hidden * inner)
    attention = sum(4 * length * length * hidden for length in seqs)
    return layers * (dense + attention)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-scaling", action="store_true")
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.quick:
        hidden, layers, heads, inner, repeats = 256, 4, 4, 1024, 3
    else:
        hidden, layers, heads, inner, repeats = 768, 12, 12, 3072, args.repeats

    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=inner
    )
    with tempfile.TemporaryDirectory() as tmp:
        transformers.BertModel(config).save_pretrained(tmp)
        hf = transformers.BertModel.from_pretrained(tmp, attn_implementation="sdpa").eval()
        ours = bertblocks.from_pretrained(tmp).eval()  # packing: auto
        padded = bertblocks.from_pretrained(tmp, ["encoder.packing=never"]).eval()
    layer = nn.TransformerEncoderLayer(hidden, heads, inner, dropout=0.1, activation="gelu", batch_first=True)
    torch_encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=True).eval()

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    print(f"shape: hidden {hidden}, layers {layers}, heads {heads}, intermediate {inner}; fp32, inference mode\n")

    ids = torch.randint(1000, 30000, (len(LENGTHS), max(LENGTHS)))
    mask = (torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    embeds = torch.randn(len(LENGTHS), max(LENGTHS), hidden)
    with torch.inference_mode():
        real = mask.bool()
        diff = (ours(input_ids=ids, attention_mask=mask)[0] - hf(input_ids=ids, attention_mask=mask)[0])[real]
        print(f"packed vs transformers on real tokens: max abs diff {diff.abs().max().item():.2e}\n")
        for title, batch_mask in (("padded batch, lengths " + str(LENGTHS), mask), ("uniform 8 x 128", None)):
            kw = {"input_ids": ids} if batch_mask is None else {"input_ids": ids, "attention_mask": batch_mask}
            key_padding = None if batch_mask is None else ~batch_mask.bool()
            result = _time(
                {
                    "transformers": lambda kw=kw: hf(**kw),
                    "bertblocks": lambda kw=kw: ours(**kw),
                    "bertblocks (packing off)": lambda kw=kw: padded(**kw),
                    "nn.TransformerEncoder": lambda k=key_padding: torch_encoder(embeds, src_key_padding_mask=k),
                },
                repeats,
            )
            base = result["transformers"]
            print(title)
            for name, ms in result.items():
                print(f"  {name:<26} {ms:9.1f} ms   {ms / base:5.2f}x transformers")
            print()

        if args.no_scaling:
            return
        peak = _matmul_gflops(hidden)
        print(f"measured matmul throughput: {peak:.1f} GFLOP/s ({1024}x{hidden} @ {hidden}x{4 * hidden})\n")
        print("ms per real token (uniform batches)")
        print(f"{'batch':>5} {'seq':>5} {'transformers':>13} {'bertblocks':>11} {'ratio':>6} {'matmul share':>13}")
        seqs = [32, 128, 512] if not args.quick else [32, 128]
        batches = [1, 8, 32] if not args.quick else [1, 8]
        for b in batches:
            for length in seqs:
                x = torch.randint(1000, 30000, (b, length))
                result = _time({"hf": lambda x=x: hf(input_ids=x), "ours": lambda x=x: ours(input_ids=x)}, 3)
                tokens = b * length
                flops = _forward_flops(tokens, [length] * b, hidden, layers, inner)
                share = flops / (result["ours"] / 1e3) / 1e9 / peak
                print(
                    f"{b:>5} {length:>5} {result['hf'] / tokens:>13.3f} {result['ours'] / tokens:>11.3f} "
                    f"{result['ours'] / result['hf']:>6.2f} {share:>12.0%}"
                )


if __name__ == "__main__":
    main()
