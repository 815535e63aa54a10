"""from_pretrained of a bert-base-size checkpoint: load time and memory, bertblocks vs transformers.

The checkpoint (random bert-base weights, safetensors) is written once by transformers. Each load runs in a
fresh Python process that first loads a tiny checkpoint (so imports and one-time set-up are not counted),
then resets its peak-memory counter and loads the big one: the time of the ``from_pretrained`` call, the
time until every weight has been read once (a library that maps the file lazily would be flattered by the
call alone), the peak resident memory over the resident memory just before the call, and the resident
memory over that baseline twice: when the call returns and after every weight has been read once (what any
first forward pass does), split into file-backed pages (the checkpoint's own pages, mapped: shared with the
page cache, never a second copy) and anonymous memory (copies, caches, allocator slack), each against the
size of the weights on disk. Runs alternate between the two libraries; medians are printed.

Both libraries map safetensors files: their weights become resident as they are first read. bertblocks reads
every weight during the call (its non-finite screen), transformers at the first forward pass, so "resident
after the call" differs while "resident after one read" does not.

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

from machine import machine_line  # the script's own folder is on sys.path

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

def resident():
    return {field: status(field) for field in ("VmRSS", "RssAnon", "RssFile")}

load(warmup)  # imports and one-time set-up are not what is measured
base = resident()
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current resident size
start = time.perf_counter()
model = load(path)
seconds = time.perf_counter() - start
loaded = resident()
with torch.no_grad():  # touch every weight, so lazily mapped pages are counted as resident
    total = sum(float(p.sum()) for p in model.parameters())
touched = time.perf_counter() - start
read = resident()
print(json.dumps({
    "seconds": seconds, "touched": touched, "peak_mib": status("VmHWM") - before,
    **{f"loaded_{k}": loaded[k] - base[k] for k in base}, **{f"read_{k}": read[k] - base[k] for k in base},
}))
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
    print(f"{machine_line()}\ntransformers {transformers.__version__}; {args.runs} runs per library, alternating")
    print(f"checkpoint: bert-base shape, {layers} layers, {weights_mib:.0f} MiB of weights (safetensors)\n")
    print(f"{'':<13} {'load (s)':>9} {'load+touch (s)':>15} {'peak over baseline (MiB)':>25} {'peak / weights':>15}")
    med = {}
    for library, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        touched = statistics.median(r["touched"] for r in runs)
        peak = statistics.median(r["peak_mib"] for r in runs)
        med[library] = touched
        print(f"{library:<13} {seconds:>9.2f} {touched:>15.2f} {peak:>25.0f} {peak / weights_mib:>15.2f}")
    print(f"\nload+touch time ratio bertblocks / transformers = {med['bertblocks'] / med['transformers']:.2f}\n")
    print("resident memory over the baseline, MiB (x weights): total = file-backed + anonymous; median [range]")
    for moment in ("loaded", "read"):
        label = "when the call returns" if moment == "loaded" else "after every weight is read once"
        print(f"  {label}")
        for library, runs in results.items():
            cells = []
            for field in ("VmRSS", "RssFile", "RssAnon"):
                values = [r[f"{moment}_{field}"] for r in runs]
                middle = statistics.median(values)
                cells.append(f"{middle:5.0f} ({middle / weights_mib:4.2f}x) [{min(values):.0f}-{max(values):.0f}]")
            print(f"    {library:<13} total {cells[0]}   file {cells[1]}   anon {cells[2]}")


if __name__ == "__main__":
    main()
