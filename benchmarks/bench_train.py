"""A fine-tuning step with packing: bert-base sequence classification, forward + backward, padded batch.

Same random weights for transformers (``BertForSequenceClassification``, SDPA) and bertblocks (loaded from
the checkpoint transformers saves). Dropout off on both sides so the gradients can be compared; the step is
``zero_grad`` + forward (with labels) + ``loss.backward()``, in ``train()`` mode. Batch: lengths
[128, 20, 35, 64, 16, 90, 12, 48] (413 of 1024 tokens real). bertblocks runs twice: ``encoder.packing=always``
(the dense layers and their backward see the real tokens only) and ``never`` (the same work as transformers).
Repeats alternate between contenders (rotating order); medians, ratios to transformers and the spread of
per-repeat ratios are printed, after the loss and the largest gradient difference to transformers.

Usage:
    python benchmarks/bench_train.py
    python benchmarks/bench_train.py --quick     # small shape
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

import bertblocks

LENGTHS = [128, 20, 35, 64, 16, 90, 12, 48]


def _step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach()


def classifier_config(quick: bool, **extra: object) -> transformers.BertConfig:
    """bert-base (``quick``: a 4-layer, 256-wide shape) for two-label sequence classification, dropout off so that
    gradients can be compared."""
    hidden, layers, heads, inner = (256, 4, 4, 1024) if quick else (768, 12, 12, 3072)
    return transformers.BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inner,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
        **extra,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = classifier_config(args.quick)
    hidden, layers = config.hidden_size, config.num_hidden_layers
    ids = torch.randint(1000, 30000, (len(LENGTHS), max(LENGTHS)))
    mask = (torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": torch.arange(len(LENGTHS)) % 2}
    with tempfile.TemporaryDirectory() as tmp:
        transformers.BertForSequenceClassification(config).save_pretrained(tmp)
        hf = transformers.BertForSequenceClassification.from_pretrained(tmp, attn_implementation="sdpa").train()
        models = {
            "transformers": hf,
            "bertblocks packed": bertblocks.from_pretrained(tmp, ["encoder.packing=always"], head="auto").train(),
            "bertblocks packing=never": bertblocks.from_pretrained(tmp, ["encoder.packing=never"], head="auto").train(),
        }
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    print(f"shape: hidden {hidden}, layers {layers}; batch lengths {LENGTHS} ({sum(LENGTHS)} of {mask.numel()} real)\n")

    reference_loss = _step(hf, inputs)
    reference = {n: p.grad.clone() for n, p in hf.named_parameters() if p.grad is not None}
    for name, model in list(models.items())[1:]:
        loss = _step(model, inputs)
        diff = max(
            (p.grad - reference[n]).abs().max().item() for n, p in model.named_parameters() if p.grad is not None
        )
        print(f"  {name:<26} loss diff {abs(loss - reference_loss).item():.1e}, max gradient diff {diff:.1e}")

    fns: dict[str, Callable[[], object]] = {name: (lambda m=model: _step(m, inputs)) for name, model in models.items()}
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append((time.perf_counter() - start) * 1e3)
    base = statistics.median(times["transformers"])
    print("\nforward + backward: median ms, ratio to transformers, spread of per-repeat ratios")
    for name, ts in times.items():
        per_repeat = [t / b for t, b in zip(ts, times["transformers"], strict=True)]
        print(
            f"  {name:<26} {statistics.median(ts):8.1f} ms   {statistics.median(ts) / base:5.2f}x   "
            f"({min(per_repeat):.2f}-{max(per_repeat):.2f})"
        )


if __name__ == "__main__":
    main()
