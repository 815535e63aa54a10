"""Time a fine-tuning step (forward, loss, backward) of bertblocks' task models against transformers'.

For each head, transformers builds its task model with random weights and saves it; both libraries load
that directory (SDPA attention, fp32, ``train()`` with dropout off so both do the same arithmetic). Before
timing, the script checks that the two losses agree to 1e-4 and stops otherwise, so a fast wrong model is
never reported. Steps alternate between the libraries (rotating the order each repeat) so background load
hits both alike; it prints the median step time of each and the ratio ours / transformers (below 1.0:
bertblocks is faster).

Run from the repository root::

    python benchmarks/bench_heads.py            # bert-base shape, batch 8 x 128 (minutes on 2 cores)
    python benchmarks/bench_heads.py --quick    # a small model (seconds)
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

import bertblocks

BASE = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
}
QUICK = {
    "vocab_size": 1000,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 512,
}
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _labels(head: str, ids: torch.Tensor, num_labels: int) -> dict[str, torch.Tensor]:
    if head == "BertForMaskedLM":
        labels = torch.full_like(ids, -100)
        labels[:, ::7] = ids[:, ::7]  # ~15% of positions are targets
        return {"labels": labels}
    if head == "BertForQuestionAnswering":
        b, q = ids.shape
        return {"start_positions": torch.arange(b) % q, "end_positions": (torch.arange(b) + 3) % q}
    if head == "BertForTokenClassification":
        return {"labels": ids % num_labels}
    return {"labels": torch.arange(ids.shape[0]) % num_labels}


def _step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> Callable[[], float]:
    def run() -> float:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(**inputs).loss.backward()
        return time.perf_counter() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model and batch")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    shape = QUICK if args.quick else BASE
    batch, length = (4, 64) if args.quick else (8, 128)
    num_labels = 3
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    print(f"shape {shape}, batch {batch} x {length}, fp32, sdpa, forward + loss + backward")
    print(f"{'model':32} {'ours ms':>9} {'transformers ms':>16} {'ratio':>6}")
    heads = [
        "BertForSequenceClassification",
        "BertForMaskedLM",
        "BertForTokenClassification",
        "BertForQuestionAnswering",
    ]
    for head in heads:
        torch.manual_seed(0)
        config = transformers.BertConfig(**shape, **NO_DROPOUT, num_labels=2 if "Question" in head else num_labels)
        with tempfile.TemporaryDirectory() as tmp:
            getattr(transformers, head)(config).save_pretrained(Path(tmp))
            theirs = getattr(transformers, head).from_pretrained(tmp, attn_implementation="sdpa").train()
            ours = getattr(bertblocks, head).from_pretrained(tmp).train()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(1, shape["vocab_size"], (batch, length), generator=g)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **_labels(head, ids, num_labels)}
        diff = abs(ours(**inputs).loss.item() - theirs(**inputs).loss.item())
        if diff > 1e-4:
            raise SystemExit(f"{head}: losses differ by {diff:.2e}; not timing a model that disagrees")
        steps = [_step(ours, inputs), _step(theirs, inputs)]
        for _ in range(args.warmup):
            for step in steps:
                step()
        times: list[list[float]] = [[], []]
        for i in range(args.repeats):
            order = [0, 1] if i % 2 == 0 else [1, 0]
            for j in order:
                times[j].append(steps[j]())
        mine, hf = (statistics.median(t) * 1e3 for t in times)
        print(f"{head:32} {mine:9.1f} {hf:16.1f} {mine / hf:6.2f}")


if __name__ == "__main__":
    main()
