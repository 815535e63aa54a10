"""Which varlen kernel attends a packed batch: per-sequence SDPA calls vs ``flex_attention`` with a document mask.

What ``sdpa``'s ``varlen_kernel: auto`` picks per device type comes from this measurement
(``bertblocks/plugins/varlen_flex.py``). Contenders, interleaved repeat by repeat so that machine noise hits all
alike (medians, ratios to ``per_sequence``):

1. the whole packed encoder (bert-base shape, random weights, fp32, eval, ``torch.inference_mode``) with
   ``varlen_kernel: per_sequence`` and ``varlen_kernel: flex`` (flex uncompiled on CPU, as that option runs it);
2. the attention kernel alone at bert-base heads (12 × 64) on the same lengths: per-sequence SDPA, flex
   uncompiled, and (``--compiled``) flex compiled by ``torch.compile`` (the kernel ``auto`` uses on CUDA; its
   first call compiles, tens of seconds on CPU), the block mask built once outside the timing, and its build
   timed apart (once per forward pass in the model).

Usage:
    python benchmarks/bench_varlen.py              # CPU (or --device cuda)
    python benchmarks/bench_varlen.py --compiled   # also flex's compiled kernel
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable

import torch

import bertblocks
from bertblocks.plugins.varlen_flex import PackedIndex
from bertblocks.plugins.varlen_sdpa import sdpa_per_sequence

#: the padded batch of the performance issue (413 real tokens of 1024)
LENGTHS = [128, 20, 35, 64, 16, 90, 12, 48]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fns: dict[str, Callable[[], object]], repeats: int, device: str) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _report(title: str, medians: dict[str, float]) -> None:
    base = medians["per_sequence"]
    print(title)
    for name, ms in medians.items():
        print(f"  {name:<28} {ms:9.2f} ms   x{ms / base:5.2f} of per_sequence")


def _machine(device: str) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cpu = platform.machine()
    with contextlib.suppress(OSError):
        lines = open("/proc/cpuinfo").read().splitlines()  # noqa: SIM115 (a few lines, Linux only)
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
    where = torch.cuda.get_device_name() if device == "cuda" else cpu
    return f"{where}, torch {torch.__version__}, {torch.get_num_threads()} threads, load {load:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compiled", action="store_true", help="also flex's compiled kernel (compiles first)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    device = args.device
    print(_machine(device))

    ids, mask = torch.randint(1000, 30000, (len(LENGTHS), max(LENGTHS))), torch.zeros(len(LENGTHS), max(LENGTHS))
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    ids, mask = ids.to(device), mask.long().to(device)
    models = {}
    for kernel in ("per_sequence", "flex"):
        torch.manual_seed(0)
        config = bertblocks.load_config("bert-base-uncased")
        config.encoder.attention.backend = config.encoder.attention.backend.model_validate(
            {"name": "sdpa", "varlen_kernel": kernel}
        )
        models[kernel] = bertblocks.create_model(config, ["encoder.packing=always"]).to(device).eval()

    def forward(kernel: str) -> Callable[[], object]:
        def run() -> object:
            with torch.inference_mode():
                return models[kernel](input_ids=ids, attention_mask=mask)

        return run

    _report(
        f"packed bert-base encoder, lengths {LENGTHS} ({sum(LENGTHS)} tokens)",
        _time({kernel: forward(kernel) for kernel in models}, args.repeats, device),
    )

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    tokens, heads, dim = sum(LENGTHS), 12, 64
    q, k, v = (torch.randn(tokens, heads, dim, device=device) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device=device)
    document = PackedIndex.from_cu_seqlens(cu, tokens).document

    def same_sequence(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return document[q_idx] == document[kv_idx]

    block_mask = create_block_mask(same_sequence, None, None, tokens, tokens, device=device)
    Q, K, V = (x.transpose(0, 1)[None] for x in (q, k, v))
    kernels: dict[str, Callable[[], object]] = {
        "per_sequence": lambda: sdpa_per_sequence(q, k, v, cu, dim**-0.5),
        "flex (uncompiled)": lambda: flex_attention(Q, K, V, block_mask=block_mask, scale=dim**-0.5),
        "block mask build": lambda: create_block_mask(same_sequence, None, None, tokens, tokens, device=device),
    }
    if args.compiled:
        compiled = torch.compile(flex_attention, dynamic=False)
        start = time.perf_counter()
        compiled(Q, K, V, block_mask=block_mask, scale=dim**-0.5)
        print(f"flex compile (first call): {time.perf_counter() - start:.1f} s")
        kernels["flex (compiled)"] = lambda: compiled(Q, K, V, block_mask=block_mask, scale=dim**-0.5)
    with torch.inference_mode():
        _report("attention kernel alone, one layer (12 heads x 64)", _time(kernels, args.repeats, device))


if __name__ == "__main__":
    main()
