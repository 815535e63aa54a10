"""torch.compile across varying shapes: how many graphs get compiled, and compiled vs eager time.

A model that recompiles for every new sequence length is useless under ``torch.compile`` (PyTorch PR
#150403 counted 7 recompilations of transformers' BertModel across shapes). This runs bertblocks and
transformers (same weights, a bert-mini shape, SDPA, inference mode, padded batches) through a sequence of
batch shapes and reports the number of compiled graphs and the time per forward pass, compiled and eager.

Usage:
    python benchmarks/bench_compile.py
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time

import torch
import torch._dynamo
import transformers
from torch._dynamo.utils import counters

import bertblocks

SHAPES = [(4, 16), (4, 24), (4, 40), (8, 64), (2, 100), (8, 128), (4, 16)]


def _inputs(batch: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(1000, 30000, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length // 2 :] = 0  # one padded row
    return {"input_ids": ids, "attention_mask": mask}


def _run(name: str, model: torch.nn.Module) -> None:
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model)
    compile_times, eager_ms, compiled_ms = [], [], []
    with torch.inference_mode():
        for batch, length in SHAPES:
            x = _inputs(batch, length)
            start = time.perf_counter()
            compiled(**x)  # first call at this shape: may compile
            compile_times.append(time.perf_counter() - start)
            for timings, fn in ((compiled_ms, compiled), (eager_ms, model)):
                start = time.perf_counter()
                fn(**x)
                timings.append((time.perf_counter() - start) * 1e3)
    graphs = counters["stats"]["unique_graphs"]
    ratio = statistics.median(c / e for c, e in zip(compiled_ms, eager_ms, strict=True))
    print(
        f"{name:<13} graphs compiled over {len(SHAPES)} shapes: {graphs:>2}   "
        f"first-call seconds: {', '.join(f'{t:.1f}' for t in compile_times)}   "
        f"compiled/eager time (median over shapes): {ratio:.2f}"
    )


def main() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    )
    with tempfile.TemporaryDirectory() as tmp:
        transformers.BertModel(config).save_pretrained(tmp)
        theirs = transformers.BertModel.from_pretrained(tmp, attn_implementation="sdpa").eval()
        ours = bertblocks.from_pretrained(tmp).eval()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; shapes (batch, length): {SHAPES}")
    _run("bertblocks", ours)
    _run("transformers", theirs)


if __name__ == "__main__":
    main()
