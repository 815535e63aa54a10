"""Nyströmformer's landmark attention against full attention on long sequences: time and memory as the length grows.

Contenders, each a bertblocks encoder with the same sizes (BERT's post-LN layers), differing only in the attention
sub-layer:

* ``nystrom``: the ``nystrom`` attention's landmark path, ``--landmarks`` segment means over the whole sequence
  (``segment_means_seq_len`` = the length) and a ``--conv``-wide value convolution (kernels ``b·h·L·m``: linear in L);
* ``full-eager``: BERT's attention with the ``eager`` backend (scores ``b·h·L·L``, materialised);
* ``full-sdpa``: BERT's attention with ``sdpa`` (PyTorch's fused kernel: quadratic work, blockwise memory);
* ``hf-nystromformer``: transformers' ``NystromformerModel`` of the same sizes and settings, for reference.

Memory: each contender runs one forward pass in a fresh process, and the figure is the peak resident set of that
process during the pass minus its resident set just before (``VmHWM`` reset before the pass, minus ``VmRSS``: what
the pass allocates at its peak; Linux only).
Time: medians over ``--repeats`` forward passes in this process, contenders interleaved (the order rotates every
repeat) so that machine noise hits them alike. fp32, eval, ``torch.inference_mode``, batch 1, no padding.

Usage:
    python benchmarks/bench_nystrom.py                      # lengths 1024 2048 4096, 64 landmarks
    python benchmarks/bench_nystrom.py --lengths 4096 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line

CONTENDERS = ("nystrom", "full-eager", "full-sdpa", "hf-nystromformer")


def build(name: str, length: int, args: argparse.Namespace) -> Callable[[], object]:
    """The contender's forward pass on one random sequence of ``length`` tokens."""
    import bertblocks

    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (1, length))
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
        model = transformers.NystromformerModel(config).eval()
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
        ).eval()

    def forward() -> object:
        with torch.inference_mode():
            return model(input_ids=ids)

    return forward


def child(name: str, length: int, args: argparse.Namespace) -> None:
    """Run one forward pass and print the peak resident memory it added (MiB), as JSON: the kernel's high-water
    mark (``VmHWM``) is reset just before the pass (``/proc/self/clear_refs``, Linux 4.0+), so building the model
    does not count."""
    forward = build(name, length, args)
    before = _status_mib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    forward()
    print(json.dumps({"peak_added_mib": _status_mib("VmHWM") - before}))


def _status_mib(field: str) -> float:
    """A ``/proc/self/status`` memory field (kB there), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise LookupError(field)


def memory(name: str, length: int, args: argparse.Namespace) -> float:
    command = [sys.executable, __file__, "--child", name, "--lengths", str(length), *_shape_args(args)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["peak_added_mib"])


def _shape_args(args: argparse.Namespace) -> list[str]:
    return [
        "--hidden",
        str(args.hidden),
        "--layers",
        str(args.layers),
        "--heads",
        str(args.heads),
        "--landmarks",
        str(args.landmarks),
        "--conv",
        str(args.conv),
        "--threads",
        str(args.threads),
    ]


def timings(length: int, args: argparse.Namespace) -> dict[str, float]:
    fns = {name: build(name, length, args) for name in CONTENDERS}
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
            start = time.perf_counter()
            fns[name]()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--landmarks", type=int, default=64, help="num_landmarks (must divide every length)")
    parser.add_argument("--conv", type=int, default=33, help="conv_kernel_size (odd)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child(args.child, args.lengths[0], args)
        return
    print(f"machine: {machine_line()}")
    print(
        f"model: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, {args.landmarks} landmarks, "
        f"convolution {args.conv}; batch 1; "
        f"fp32 eval; {args.repeats} repeats"
    )
    print(f"{'L':>6} {'contender':<14} {'ms':>10} {'x nystrom':>13} {'peak MiB':>9} {'x nystrom':>13}")
    for length in args.lengths:
        ms = timings(length, args)
        mib: dict[str, float] = dict.fromkeys(CONTENDERS, 0.0)
        for r in range(2):  # two fresh processes each, interleaved; the smaller peak (the other had noise)
            for name in CONTENDERS[r:] + CONTENDERS[:r]:
                value = memory(name, length, args)
                mib[name] = value if r == 0 else min(mib[name], value)
        for name in CONTENDERS:
            print(
                f"{length:>6} {name:<14} {ms[name]:>10.1f} {ms[name] / ms['nystrom']:>13.2f} "
                f"{mib[name]:>9.1f} {mib[name] / max(mib['nystrom'], 1e-9):>13.2f}"
            )


if __name__ == "__main__":
    main()
