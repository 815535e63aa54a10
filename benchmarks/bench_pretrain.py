"""MLM pre-training throughput: bertblocks (packed; packed and compiled) against transformers' BertForMaskedLM.

One corpus, one tokenizer, one stream of batches for every contender: documents of 1 to 12 sentences of the
ablation corpus (``bertblocks/ablation/corpus.py``), ``[CLS] … [SEP]``, cut at ``--length`` tokens, batched
by transformers' ``DataCollatorForLanguageModeling`` (15% masked BERT's way, padded to the longest document
of the batch). transformers builds a ``BertForMaskedLM`` with random weights (SDPA, BERT's dropout 0.1) and
saves it; bertblocks loads that checkpoint with ``encoder.packing=always`` (the dense layers and their
backward see the real tokens only) and, a third contender, the same model under ``torch.compile``
(``dynamic=True``; packing stays in the graph with no dynamo setting, its token count symbolic). With
``--sparse``, a fourth: packed with the ``masked_lm`` head's ``sparse_prediction`` (the decoder runs on the
labelled positions only; the same loss, logits ``[n_labelled, vocab]``), and its fair baseline: transformers'
``BertForMaskedLM`` with the head applied to the masked positions by hand, the four lines a user writes::

    hidden = model.bert(input_ids, attention_mask=attention_mask).last_hidden_state
    chosen = labels != -100
    logits = model.cls(hidden[chosen])
    loss = F.cross_entropy(logits, labels[chosen])

With ``--modernbert``, two more of the same shape (hidden, layers, heads, intermediate size, vocabulary):
transformers' ``ModernBertForMaskedLM`` with its own ``sparse_prediction=True`` (SDPA; eager: its
``reference_compile`` off), and bertblocks loading that checkpoint packed with ``sparse_prediction``. Packing
is then the only difference between the two sides of each pair; the ratios between pairs are printed.
Each contender has its own AdamW; a step is ``zero_grad`` + forward with labels + ``backward`` + ``step``.

Before timing, the eval-mode MLM loss of the first batch is compared with transformers' (it must agree to
1e-4). Steps then alternate between the contenders, rotating the order each step, so background load hits
every side alike; each contender takes every batch once. Throughput is real (not padding) tokens per
second over the timed steps, with the ratio to transformers (above 1.0: bertblocks is faster). The compile
time (the untimed warm-up steps of the compiled contender) is printed on its own.

Usage:
    python benchmarks/bench_pretrain.py               # bert-mini shape (4 x 256), batch 16, up to 128 tokens
    python benchmarks/bench_pretrain.py --quick       # 2 x 128, batch 8, up to 64 tokens: a smoke test
    python benchmarks/bench_pretrain.py --steps 30 --no-compile
    python benchmarks/bench_pretrain.py --vocab 2000     # a small vocabulary: the encoder dominates the step
    python benchmarks/bench_pretrain.py --sparse         # also packed + sparse prediction (head on masked tokens)
    python benchmarks/bench_pretrain.py --sparse --modernbert --no-compile   # the fair baselines, eager
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch._dynamo
import torch.nn.functional as F
import transformers
from machine import machine_line  # the script's own folder is on sys.path
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

import bertblocks
from bertblocks.ablation.corpus import generate_sentences
from bertblocks.ablation.data import train_tokenizer


def _batches(count: int, batch: int, length: int, vocab: int, seed: int) -> tuple[list[dict], int]:
    """``count`` collated MLM batches of documents (1-12 sentences, cut at ``length``), and the vocab size."""
    sentences = generate_sentences(4000, seed=seed)
    tok = train_tokenizer(sentences, vocab)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    rng = random.Random(seed)
    cls, sep = fast.cls_token_id, fast.sep_token_id
    documents = []
    for _ in range(count * batch):
        text = " ".join(rng.choice(sentences) for _ in range(rng.randint(1, 12)))
        ids = tok.encode(text).ids[: length - 2]
        documents.append({"input_ids": [cls, *ids, sep]})
    collator = DataCollatorForLanguageModeling(fast, mlm=True, mlm_probability=0.15, return_tensors="pt")
    torch.manual_seed(seed)  # the collator draws its masks from torch's global generator
    batches = [collator(documents[i * batch : (i + 1) * batch]) for i in range(count)]
    return [{k: v for k, v in b.items() if k in ("input_ids", "attention_mask", "labels")} for b in batches], len(fast)


def _stepper(model: torch.nn.Module, run: Callable[..., object], lr: float = 1e-4) -> Callable[[dict], float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def step(batch: dict) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = run(**batch).loss  # type: ignore[attr-defined]
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


class _Loss:
    """What a contender's call returns: ``.loss``, as transformers' outputs."""

    def __init__(self, loss: torch.Tensor) -> None:
        self.loss = loss


def sparse_by_hand(model: transformers.BertForMaskedLM) -> Callable[..., _Loss]:
    """transformers' BERT with the MLM head on the masked positions only: what a user writes by hand."""

    def run(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> _Loss:
        hidden = model.bert(input_ids, attention_mask=attention_mask).last_hidden_state
        chosen = labels != -100
        logits = model.cls(hidden[chosen])
        return _Loss(F.cross_entropy(logits, labels[chosen]))

    return run


#: (contender, its fair baseline): the pairs whose ratio says what packing adds
PAIRS = [
    ("bertblocks packed", "transformers"),
    ("bertblocks packed+sparse", "transformers sparse by hand"),
    ("bertblocks ModernBERT packed+sparse", "transformers ModernBERT sparse"),
    ("bertblocks packed+sparse", "transformers ModernBERT sparse"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small shape and few steps: a smoke test")
    parser.add_argument("--steps", type=int, help="timed steps per contender (default 20; --quick 6)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per contender first (default 3)")
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled contender")
    parser.add_argument(
        "--sparse",
        action="store_true",
        help="add a contender: packed, with the masked_lm head's sparse_prediction (decoder on masked tokens only)",
    )
    parser.add_argument(
        "--modernbert",
        action="store_true",
        help="add ModernBertForMaskedLM(sparse_prediction=True) of transformers and bertblocks' packed load of it",
    )
    parser.add_argument(
        "--vocab",
        type=int,
        default=30522,
        help="the model's vocabulary (default BERT's 30522; the MLM head's share of the step grows with it)",
    )
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    hidden, layers, heads, batch, length = (128, 2, 2, 8, 64) if args.quick else (256, 4, 4, 16, 128)
    steps = args.steps or (6 if args.quick else 20)
    batches, vocab = _batches(args.warmup + steps, batch, length, vocab=2000, seed=0)

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=max(vocab, args.vocab),  # BERT's by default: the MLM head's share of the work is a real one
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=max(512, length),
    )
    with tempfile.TemporaryDirectory() as tmp:
        transformers.BertForMaskedLM(config).save_pretrained(tmp)
        hf = transformers.BertForMaskedLM.from_pretrained(tmp, attn_implementation="sdpa")
        ours = bertblocks.from_pretrained(tmp, ["encoder.packing=always"], head="auto")
        ours_c = (
            bertblocks.from_pretrained(tmp, ["encoder.packing=always"], head="auto") if not args.no_compile else None
        )
        sparse = ["encoder.packing=always", "head.sparse_prediction=true"]
        ours_s = bertblocks.from_pretrained(tmp, sparse, head="auto") if args.sparse else None
        hf_s = transformers.BertForMaskedLM.from_pretrained(tmp, attn_implementation="sdpa") if args.sparse else None
    modern: dict[str, torch.nn.Module] = {}
    if args.modernbert:
        modern_config = transformers.ModernBertConfig(
            vocab_size=config.vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            max_position_embeddings=max(512, length),
            sparse_prediction=True,
            reference_compile=False,
            pad_token_id=0,
        )
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            transformers.ModernBertForMaskedLM(modern_config).save_pretrained(tmp)
            modern["hf"] = transformers.ModernBertForMaskedLM.from_pretrained(tmp, attn_implementation="sdpa")
            modern["ours"] = bertblocks.from_pretrained(tmp, sparse, head="auto")

    real = [int(b["attention_mask"].sum()) for b in batches]
    shape = [tuple(b["input_ids"].shape) for b in batches]
    print(f"{machine_line()}\ntransformers {transformers.__version__}")
    print(
        f"shape: hidden {hidden}, layers {layers}, vocab {config.vocab_size} ({vocab} in the corpus); batch {batch}, "
        f"documents up to {length} tokens; "
        f"{sum(real[args.warmup :]):,} real of {sum(b * n for b, n in shape[args.warmup :]):,} positions "
        f"in the {steps} timed batches\n"
    )

    with torch.no_grad():  # the same loss on the same batch (eval mode: no dropout)
        reference = float(hf.eval()(**batches[0]).loss)
        difference = abs(float(ours.eval()(**batches[0]).loss) - reference)
        if ours_s is not None and hf_s is not None:
            difference = max(difference, abs(float(ours_s.eval()(**batches[0]).loss) - reference))
            difference = max(difference, abs(float(sparse_by_hand(hf_s.eval())(**batches[0]).loss) - reference))
        if modern:
            modern_reference = float(modern["hf"].eval()(**batches[0]).loss)
            difference = max(difference, abs(float(modern["ours"].eval()(**batches[0]).loss) - modern_reference))
    print(f"eval-mode MLM loss on batch 0: transformers {reference:.6f}, the others differ by {difference:.1e}")
    if difference > 1e-4:
        raise SystemExit("the losses differ: not timing a model that computes something else")

    steppers = {"transformers": _stepper(hf.train(), hf), "bertblocks packed": _stepper(ours.train(), ours)}
    if ours_s is not None and hf_s is not None:
        steppers["bertblocks packed+sparse"] = _stepper(ours_s.train(), ours_s)
        steppers["transformers sparse by hand"] = _stepper(hf_s.train(), sparse_by_hand(hf_s))
    if modern:
        steppers["transformers ModernBERT sparse"] = _stepper(modern["hf"].train(), modern["hf"])
        steppers["bertblocks ModernBERT packed+sparse"] = _stepper(modern["ours"].train(), modern["ours"])
    compile_seconds = None
    if ours_c is not None:
        compiled = torch.compile(ours_c.train(), dynamic=True)
        steppers["bertblocks packed+compiled"] = _stepper(ours_c, compiled)
    names = list(steppers)
    for i in range(args.warmup):
        for name in names:
            start = time.perf_counter()
            steppers[name](batches[i])
            if name.endswith("compiled") and i == 0:
                compile_seconds = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.warmup, args.warmup + steps):
        r = i - args.warmup
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            steppers[name](batches[i])
            times[name].append(time.perf_counter() - start)

    tokens = sum(real[args.warmup :])
    base = tokens / sum(times["transformers"])
    print("\ntraining step (forward + backward + AdamW): real tokens/s over the timed steps, ratio to transformers,")
    print("median ms per step, spread of per-step speed ratios")
    for name, ts in times.items():
        rate = tokens / sum(ts)
        per_step = [b / t for t, b in zip(ts, times["transformers"], strict=True)]
        print(
            f"  {name:<36} {rate:9.0f} tok/s   {rate / base:5.2f}x   {statistics.median(ts) * 1e3:8.1f} ms   "
            f"({min(per_step):.2f}-{max(per_step):.2f})"
        )
    pairs = [(a, b) for a, b in PAIRS if a in times and b in times]
    if pairs:
        print("\nagainst the fairest baseline (same head work; the difference is packing): speed ratio, spread")
    for name, baseline in pairs:
        per_step = [b / t for t, b in zip(times[name], times[baseline], strict=True)]
        print(
            f"  {name} / {baseline}: {sum(times[baseline]) / sum(times[name]):.2f}x "
            f"({min(per_step):.2f}-{max(per_step):.2f})"
        )
    if compile_seconds is not None:
        print(f"\nfirst compiled step (compilation included): {compile_seconds:.1f} s")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
