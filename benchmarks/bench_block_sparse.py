"""BigBird's block-sparse attention against full attention on long sequences: time and peak memory.

Contenders (bigbird-roberta-base's shape: 768 wide, 12 heads of 64, blocks of 64 with 3 random blocks; two layers,
random weights, fp32, eval, ``torch.inference_mode``, batch 1), interleaved repeat by repeat so that machine noise
hits all alike (medians, ratios to ``block_sparse``):

1. ``block_sparse``: the ``block_sparse`` attention (gathered blocks, SDPA over them);
2. ``full_sdpa``: the same model with ``attention_type: original_full`` (one SDPA call over every key);
3. ``full_eager``: full attention with the ``eager`` backend (the ``[b, h, L, L]`` scores materialised, as
   transformers' ``original_full`` computes them).

Peak memory: each contender runs once more in a fresh subprocess, which resets its peak resident set after building
the model (``/proc/self/clear_refs``, Linux) and reports how far the forward pass raises it above the resident set
before the pass (``VmHWM - VmRSS``); on CUDA, ``torch.cuda.max_memory_allocated`` over the pass.

Usage:
    python benchmarks/bench_block_sparse.py                      # 1024, 2048 and 4096 tokens
    python benchmarks/bench_block_sparse.py --lengths 4096 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import bertblocks

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line

CONTENDERS: dict[str, list[str]] = {
    "block_sparse": [],
    "full_sdpa": ["encoder.attention.attention_type=original_full"],
    "full_eager": ["encoder.attention.attention_type=original_full", "encoder.attention.backend=eager"],
}


def _model(name: str, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    overrides = ["encoder.num_layers=2", *CONTENDERS[name]]
    return bertblocks.create_model("bigbird-roberta-base", overrides).to(device).eval()


def _inputs(length: int, device: str) -> dict[str, torch.Tensor]:
    ids = torch.randint(100, 50000, (1, length), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids.to(device), "attention_mask": torch.ones(1, length, dtype=torch.long, device=device)}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _peak(name: str, length: int, device: str) -> float:
    """MiB the forward pass adds to the peak (run in this process: call it in a fresh one)."""
    model, inputs = _model(name, device), _inputs(length, device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.max_memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set (VmHWM) starts again from now
        before = _status_kib("VmRSS")
    with torch.inference_mode():
        model(**inputs)
    if device == "cuda":
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    return (_status_kib("VmHWM") - before) / 1024


def _status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(f"/proc/self/status has no {field}")


def _forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> Callable[[], object]:
    def run() -> object:
        with torch.inference_mode():
            return model(**inputs)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peak-of", nargs=2, metavar=("CONTENDER", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_of:
        print(json.dumps(_peak(args.peak_of[0], int(args.peak_of[1]), args.device)))
        return
    print(machine_line() if args.device == "cpu" else torch.cuda.get_device_name())
    models = {name: _model(name, args.device) for name in CONTENDERS}
    for length in args.lengths:
        inputs = _inputs(length, args.device)

        fns = {name: _forward(models[name], inputs) for name in CONTENDERS}
        for fn in fns.values():
            fn()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.repeats):
            for name, fn in fns.items():
                _sync(args.device)
                start = time.perf_counter()
                fn()
                _sync(args.device)
                times[name].append((time.perf_counter() - start) * 1e3)
        medians = {name: statistics.median(t) for name, t in times.items()}
        peaks = {
            name: float(
                subprocess.run(
                    [sys.executable, __file__, "--device", args.device, "--peak-of", name, str(length)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.strip()
            )
            for name in CONTENDERS
        }
        print(f"{length} tokens, batch 1, 2 layers (bigbird-roberta-base widths), median of {args.repeats}:")
        base_ms, base_mib = medians["block_sparse"], max(peaks["block_sparse"], 1e-9)
        for name in CONTENDERS:
            print(
                f"  {name:<13} {medians[name]:9.1f} ms  x{medians[name] / base_ms:5.2f}   "
                f"peak +{peaks[name]:8.1f} MiB  x{peaks[name] / base_mib:5.2f}"
            )


if __name__ == "__main__":
    main()
