"""A compiled fine-tuning step through transformers' ``Trainer(args=TrainingArguments(torch_compile=True))``.

bert-base sequence classification (dropout off on both sides so that gradients compare), same random weights for
transformers (``BertForSequenceClassification``, SDPA) and bertblocks (loaded from the checkpoint transformers
saves, ``encoder.packing=always``). Batch: lengths [128, 20, 35, 64, 16, 90, 12, 48] (413 of 1024 tokens real).

Each contender is a ``Trainer`` (bertblocks' :class:`~bertblocks.integrations.trainer.Trainer`; transformers' own
for transformers' model) that first trains two steps with ``learning_rate=0`` (so the weights stay the same for
every contender): that compiles (``torch_compile=True``: accelerate's ``torch.compile(model)``, Inductor,
``dynamic=None``) and records the gradients. The timed step is then the Trainer's own ``training_step`` (forward
with labels + backward) on the model the Trainer compiled, repeats alternating between contenders (rotating
order); medians, ratios to transformers compiled the same way, and the spread of per-repeat ratios are printed,
after the largest gradient difference to eager transformers and the number of graphs compiled.

Usage:
    python benchmarks/bench_train_compile.py
    python benchmarks/bench_train_compile.py --quick     # small shape
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from typing import Any

import torch
import torch._dynamo
import transformers
from bench_train import LENGTHS, classifier_config  # the script's own folder is on sys.path
from torch._dynamo.utils import counters

import bertblocks
from bertblocks.integrations.trainer import Trainer


class Recording:
    """A Trainer mixin keeping the last step's gradients (with ``learning_rate=0`` every step's are the same) and
    the arguments ``train()`` passed besides the batch (``num_items_in_batch``: the timed steps pass the same, so
    they call the compiled model exactly as training did)."""

    grads: dict[str, torch.Tensor]
    step_args: tuple[tuple[Any, ...], dict[str, Any]]

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        loss = super().training_step(model, inputs, *args, **kwargs)  # type: ignore[misc]
        self.grads = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}  # type: ignore[attr-defined]
        self.step_args = (args, kwargs)
        return loss


class BertblocksTrainer(Recording, Trainer):
    pass


class TransformersTrainer(Recording, transformers.Trainer):
    pass


def _trainer(cls: type, model: torch.nn.Module, rows: list[dict[str, torch.Tensor]], compile: bool, out: str) -> Any:
    args = transformers.TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=len(LENGTHS),
        max_steps=2,
        learning_rate=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
        torch_compile=compile,
    )
    trainer = cls(model=model, args=args, train_dataset=rows, data_collator=_collate)
    graphs = counters["stats"]["unique_graphs"]
    start = time.perf_counter()
    trainer.train()
    trainer.warmup_s = time.perf_counter() - start
    trainer.graphs = counters["stats"]["unique_graphs"] - graphs
    return trainer


def _collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    length = max(len(row["input_ids"]) for row in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row["input_ids"])] = row["input_ids"]
        mask[i, : len(row["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([row["labels"] for row in rows])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    # problem_type set, so that neither model infers it on its first call
    config = classifier_config(args.quick, problem_type="single_label_classification")
    hidden, layers = config.hidden_size, config.num_hidden_layers
    ids = torch.randint(1000, 30000, (len(LENGTHS), max(LENGTHS)))
    rows = [{"input_ids": ids[i, :n], "labels": torch.tensor(i % 2)} for i, n in enumerate(LENGTHS)]
    batch = _collate(rows)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    print(f"shape: hidden {hidden}, layers {layers}; batch lengths {LENGTHS} ({sum(LENGTHS)} of {ids.numel()} real)\n")
    with tempfile.TemporaryDirectory() as tmp:
        transformers.BertForSequenceClassification(config).save_pretrained(tmp)

        def hf() -> torch.nn.Module:
            return transformers.BertForSequenceClassification.from_pretrained(tmp, attn_implementation="sdpa")

        def ours() -> torch.nn.Module:
            return bertblocks.from_pretrained(tmp, ["encoder.packing=always"], head="auto")

        trainers = {
            "transformers eager": _trainer(TransformersTrainer, hf(), rows, False, f"{tmp}/a"),
            "transformers compiled": _trainer(TransformersTrainer, hf(), rows, True, f"{tmp}/b"),
            "bertblocks packed compiled": _trainer(BertblocksTrainer, ours(), rows, True, f"{tmp}/c"),
        }
    reference = trainers["transformers eager"].grads
    for name, trainer in trainers.items():
        diff = max((g - reference[n]).abs().max().item() for n, g in trainer.grads.items())
        print(
            f"  {name:<28} max gradient diff to transformers eager {diff:.1e}; "
            f"graphs compiled {trainer.graphs}, first two steps {trainer.warmup_s:.0f} s"
        )

    def step(trainer: Any) -> None:
        trainer.model.zero_grad(set_to_none=True)
        step_args, step_kwargs = trainer.step_args
        trainer.training_step(trainer.model_wrapped, dict(batch), *step_args, **step_kwargs)

    names = list(trainers)
    times: dict[str, list[float]] = {name: [] for name in names}
    graphs = counters["stats"]["unique_graphs"]
    for name in names:  # one untimed step each: the first call of a compiled model outside train()
        step(trainers[name])
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            step(trainers[name])
            times[name].append((time.perf_counter() - start) * 1e3)
    print(f"\ngraphs compiled during the timed steps: {counters['stats']['unique_graphs'] - graphs}")
    for base_name in ("transformers compiled", "transformers eager"):
        base = times[base_name]
        print(f"\nTrainer.training_step (forward + backward): median ms, ratio to {base_name}, per-repeat spread")
        for name, ts in times.items():
            per_repeat = [t / b for t, b in zip(ts, base, strict=True)]
            median = statistics.median(ts)
            print(
                f"  {name:<28} {median:8.1f} ms   {median / statistics.median(base):5.2f}x"
                f"   ({min(per_repeat):.2f}-{max(per_repeat):.2f})"
            )


if __name__ == "__main__":
    main()
