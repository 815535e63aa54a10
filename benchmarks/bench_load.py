"""from_pretrained of a bert-base-size checkpoint: load time and peak memory, bertblocks vs transformers.

The checkpoint (random bert-base weights, safetensors) is written once by transformers. Each load runs in a
fresh Python process that first loads a tiny checkpoint (so imports and one-time set-up are not counted),
then resets its peak-memory counter and loads the big one: the time of the ``from_pretrained`` call, the
time until every weight has been read once (bertblocks maps the file lazily, so the call alone would
flatter it), and the peak resident memory over the resident memory just before the call, against the
size of the weights on disk. Runs alternate between the two libraries; medians are printed.

Usage:
    python benchmarks/bench_load.py [--runs 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import torch
library, path, warmup = sys.argv[1], sys.argv[2], sys.argv[3]
if library == "bertblocks":
    import bertblocks
    load = lambda p: bertblocks.from_pretrained(p)
else:
    import transformers
    transformers.logging.set_verbosity_error()
    load = lambda p: transformers.BertModel.from_pretrained(p)

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024  # MiB

load(warmup)  # imports and one-time set-up are not what is measured
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current resident size
start = time.perf_counter()
model = load(path)
seconds = time.perf_counter() - start
with torch.no_grad():  # touch every weight, so lazily mapped pages are counted as resident
    total = sum(float(p.sum()) for p in model.parameters())
touched = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "touched": touched, "peak_mib": status("VmHWM") - before}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a 4-layer model instead of bert-base")
    args = parser.parse_args()
    import torch
    import transformers

    logging.getLogger("transformers").setLevel(logging.ERROR)
    layers = 4 if args.quick else 12
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as warmup:
        torch.manual_seed(0)
        transformers.BertModel(transformers.BertConfig(num_hidden_layers=layers)).save_pretrained(tmp)
        tiny = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 37}
        transformers.BertModel(transformers.BertConfig(vocab_size=99, **tiny)).save_pretrained(warmup)
        weights_mib = (Path(tmp) / "model.safetensors").stat().st_size / 2**20
        results: dict[str, list[dict[str, float]]] = {"bertblocks": [], "transformers": []}
        for _ in range(args.runs):
            for library in results:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, library, tmp, warmup], capture_output=True, text=True, check=True
                )
                results[library].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"checkpoint: bert-base shape, {layers} layers, {weights_mib:.0f} MiB of weights (safetensors)\n")
    print(f"{'':<13} {'load (s)':>9} {'load+touch (s)':>15} {'peak over baseline (MiB)':>25} {'peak / weights':>15}")
    med = {}
    for library, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        touched = statistics.median(r["touched"] for r in runs)
        peak = statistics.median(r["peak_mib"] for r in runs)
        med[library] = touched
        print(f"{library:<13} {seconds:>9.2f} {touched:>15.2f} {peak:>25.0f} {peak / weights_mib:>15.2f}")
    print(f"\nload+touch time ratio bertblocks / transformers = {med['bertblocks'] / med['transformers']:.2f}")


if __name__ == "__main__":
    main()
