"""bertblocks against transformers' own classes on one GPU, in one run: the command a contributor with a GPU runs.

    python benchmarks/bench_gpu.py

Without a CUDA GPU it prints one line saying so and exits 0 (nothing is measured). With one, it prints the machine
line (GPU model, memory, torch / CUDA / cuDNN / transformers versions), then, on the same random bert-base weights
(saved by transformers, loaded by bertblocks) and the same batches:

1. **inference**, batch 32 × 512, bfloat16, ``torch.inference_mode``: a padded batch (row lengths drawn from 64 to
   512, right padding) and a uniform one (every row 512 tokens): bertblocks eager (packing ``auto``), its inference
   fast path (``optimize_for_inference``), bertblocks under ``torch.compile``; transformers with SDPA, and under
   ``torch.compile``;
2. **one fine-tuning step** (``BertForSequenceClassification``, AdamW, bfloat16 autocast, the padded batch):
   bertblocks padded, bertblocks packed, transformers SDPA;
3. **MLM pre-training** tokens per second (real tokens, 15 % labelled, bfloat16 autocast): bertblocks packed with
   the head on the labelled positions only (``sparse_prediction``), transformers with the head at the labelled
   positions only (its encoder, then ``cls`` on the gathered rows: the fair sparse baseline), and transformers'
   ``BertForMaskedLM`` as shipped (the head on every position).

Contenders alternate repeat by repeat (noise hits all alike); each line has the median time, the peak GPU memory of
that contender's calls (``torch.cuda.max_memory_allocated``, reset before each), and the ratio to transformers' SDPA
(above 1.0: faster than transformers). Compile time (the untimed first call) is printed apart.

``--device cpu --tiny`` runs every code path on CPU with a tiny model in seconds (``tests/test_bench_gpu.py``), with
``--compile-backend eager`` to trace without generating code; peak memory is then "n/a" (no allocator statistics).
Docs: docs/explanation/performance.md, "GPU".
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: bert-base (transformers' BertConfig defaults) and a tiny shape for the CPU smoke run
SHAPES: dict[str, dict[str, int]] = {
    "base": {},
    "tiny": {
        "vocab_size": 99,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 37,
        "max_position_embeddings": 64,
    },
}
NO_GPU = "bench_gpu: no CUDA GPU here (torch.cuda.is_available() is False): nothing measured"


@dataclass(frozen=True)
class Result:
    """One contender's median milliseconds per call and peak memory (bytes; ``None`` where not measurable)."""

    ms: float
    peak: int | None


def machine_line(device: str) -> str:
    """The GPU (model, memory) or the CPU, and the versions that produced the figures."""
    import platform

    import transformers

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        where = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability {props.major}.{props.minor}"
        cudnn = torch.backends.cudnn.version()
        versions = f"CUDA {torch.version.cuda}, cuDNN {cudnn}"
    else:
        where = f"CPU {_cpu_model() or platform.machine()}, {torch.get_num_threads()} threads"
        versions = "no CUDA"
    return f"machine: {where}; torch {torch.__version__}, {versions}, transformers {transformers.__version__}"


def _cpu_model() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> int | None:
    return int(torch.cuda.max_memory_allocated()) if device == "cuda" else None


def measure(contenders: dict[str, Callable[[], object]], repeats: int, device: str) -> dict[str, Result]:
    """Warm each contender up once (compilation: printed apart), then ``repeats`` interleaved rounds."""
    for name, fn in contenders.items():
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        print(f"    first call of {name}: {time.perf_counter() - start:.1f} s")
    times: dict[str, list[float]] = {name: [] for name in contenders}
    peaks: dict[str, int | None] = dict.fromkeys(contenders)
    for _ in range(repeats):
        for name, fn in contenders.items():
            _peak_reset(device)
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append((time.perf_counter() - start) * 1e3)
            peak = _peak(device)
            peaks[name] = None if peak is None else max(peak, peaks[name] or 0)
    return {name: Result(statistics.median(times[name]), peaks[name]) for name in contenders}


def report(title: str, results: dict[str, Result], baseline: str, tokens: int | None = None) -> None:
    """A table: median ms (and tokens/s), peak memory, and ``baseline``'s time over each contender's."""
    print(title)
    base = results[baseline].ms
    for name, result in results.items():
        rate = f"{tokens / result.ms * 1e3:12,.0f} tok/s" if tokens else ""
        peak = "n/a" if result.peak is None else f"{result.peak / 2**20:,.0f} MiB"
        print(f"  {name:<34} {result.ms:10.2f} ms {rate}  peak {peak:>10}  x{base / result.ms:5.2f} vs {baseline}")


def batches(size: int, length: int, vocab: int, device: str, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """A padded batch (row lengths from ``length // 8`` to ``length``, right padding) and a uniform one."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (size, length), generator=g)
    lengths = torch.randint(max(1, length // 8), length + 1, (size,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    padded = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
    uniform = {"input_ids": ids, "attention_mask": torch.ones_like(mask)}
    return {
        name: {key: value.to(device) for key, value in batch.items()}
        for name, batch in (("padded", padded), ("uniform", uniform))
    }


def mlm_labels(batch: dict[str, torch.Tensor], seed: int = 1) -> tuple[dict[str, torch.Tensor], int]:
    """15 % of the real tokens replaced by ``[MASK]`` (id 4) and labelled with their id; how many are labelled."""
    g = torch.Generator().manual_seed(seed)
    real = batch["attention_mask"].bool().cpu()
    chosen = (torch.rand(real.shape, generator=g) < 0.15) & real
    ids = batch["input_ids"].cpu()
    labels = torch.where(chosen, ids, -100)
    device = batch["input_ids"].device
    inputs = {"input_ids": ids.masked_fill(chosen, 4).to(device), "attention_mask": batch["attention_mask"]}
    return {**inputs, "labels": labels.to(device)}, int(chosen.sum())


def _autocast(device: str, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(device_type=device, dtype=dtype)


def trainer(model: torch.nn.Module, device: str, dtype: torch.dtype, loss: Callable[..., torch.Tensor] | None = None):
    """One training step ``(batch) → loss``: zero_grad, forward under autocast, backward, AdamW step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    compute = loss or (lambda **batch: model(**batch).loss)

    def step(batch: dict[str, torch.Tensor]) -> float:
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device, dtype):
            value = compute(**batch)
        value.backward()
        optimizer.step()
        return float(value.detach())

    return step


def transformers_sparse_mlm(model: Any) -> Callable[..., torch.Tensor]:
    """transformers' BertForMaskedLM with its head at the labelled positions only (the fair sparse baseline): the
    encoder on the whole batch, then ``cls`` on the gathered rows and cross-entropy over them."""

    def loss(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = model.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        labelled = labels != -100
        logits = model.cls(hidden[labelled])  # [n_labelled, vocab]
        return torch.nn.functional.cross_entropy(logits.float(), labels[labelled])

    return loss


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' loading reports and progress bars off: the output is the tables."""
    from transformers.utils import logging as hf_logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _save(cls: str, settings: dict[str, int], directory: Path, **extra: Any) -> Path:
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, cls)(transformers.BertConfig(**settings, **extra))
    model.save_pretrained(directory / cls)
    return directory / cls


def run(args: argparse.Namespace) -> None:
    import transformers

    import bertblocks

    device, dtype, shape = args.device, getattr(torch, args.dtype), SHAPES["tiny" if args.tiny else "base"]
    size, length = (4, 32) if args.tiny else (args.batch, args.length)
    vocab = shape.get("vocab_size", 30522)

    def compile_(model: Any) -> Any:
        return torch.compile(model, backend=args.compile_backend, dynamic=True)

    print(machine_line(device))
    print(
        f"shape {'tiny' if args.tiny else 'bert-base'}, batch {size} x {length}, {args.dtype}, {args.repeats} repeats"
    )
    data = batches(size, length, vocab, device)
    with tempfile.TemporaryDirectory() as tmp, _quiet():
        backbone = _save("BertModel", shape, Path(tmp))
        classifier = _save("BertForSequenceClassification", shape, Path(tmp), num_labels=2)
        masked_lm = _save("BertForMaskedLM", shape, Path(tmp))

        sections = {part.strip() for part in args.sections.split(",")}

        # 1. inference
        def ours(*overrides: str) -> Any:
            return bertblocks.BertModel.from_pretrained(backbone, list(overrides)).to(device, dtype).eval()

        def theirs() -> Any:
            hf = transformers.BertModel.from_pretrained(backbone, attn_implementation="sdpa")
            return hf.to(device, dtype).eval()

        models: dict[str, Any] = {}
        if "inference" in sections:
            models = {"bertblocks eager": ours(), "bertblocks compiled": compile_(ours())}
            if args.compile_backend == "inductor":  # the fast path is Inductor's (frozen weights, fused epilogues)
                models["bertblocks fast path"] = bertblocks.optimize_for_inference(ours())
            models["transformers sdpa"] = theirs()
            models["transformers compiled"] = compile_(theirs())
        for kind, batch in data.items() if models else ():

            def infer(model: Any, batch: dict[str, torch.Tensor] = batch) -> Callable[[], object]:
                def call() -> object:
                    with torch.inference_mode():
                        return model(**batch)

                return call

            results = measure({name: infer(model) for name, model in models.items()}, args.repeats, device)
            real = int(batch["attention_mask"].sum())
            report(f"inference, {kind} ({real} real tokens of {size * length})", results, "transformers sdpa", real)
        del models
        if "training" not in sections:
            return

        # 2. one fine-tuning step (fp32 weights, autocast)
        batch = {**data["padded"], "labels": torch.randint(0, 2, (size,)).to(device)}
        real = int(batch["attention_mask"].sum())
        steps = {
            "bertblocks padded": trainer(
                bertblocks.BertForSequenceClassification.from_pretrained(classifier).to(device).train(), device, dtype
            ),
            "bertblocks packed": trainer(
                bertblocks.BertForSequenceClassification.from_pretrained(classifier, ["encoder.packing=always"])
                .to(device)
                .train(),
                device,
                dtype,
            ),
            "transformers sdpa": trainer(
                transformers.BertForSequenceClassification.from_pretrained(classifier, attn_implementation="sdpa")
                .to(device)
                .train(),
                device,
                dtype,
            ),
        }
        results = measure({name: (lambda s=s: s(batch)) for name, s in steps.items()}, args.repeats, device)
        report(f"fine-tuning step, padded ({real} real tokens)", results, "transformers sdpa", real)
        del steps

        # 3. MLM pre-training
        batch, labelled = mlm_labels(data["padded"])
        sparse = ["encoder.packing=always", "head.sparse_prediction=true"]
        ours_mlm = bertblocks.BertForMaskedLM.from_pretrained(masked_lm, sparse).to(device).train()
        hf_sparse = transformers.BertForMaskedLM.from_pretrained(masked_lm, attn_implementation="sdpa").to(device)
        hf_dense = transformers.BertForMaskedLM.from_pretrained(masked_lm, attn_implementation="sdpa").to(device)
        steps = {
            "bertblocks packed + sparse": trainer(ours_mlm, device, dtype),
            "transformers sparse (fair)": trainer(hf_sparse.train(), device, dtype, transformers_sparse_mlm(hf_sparse)),
            "transformers as shipped": trainer(hf_dense.train(), device, dtype),
        }
        results = measure({name: (lambda s=s: s(batch)) for name, s in steps.items()}, args.repeats, device)
        report(
            f"MLM pre-training step ({real} real tokens, {labelled} labelled)",
            results,
            "transformers sparse (fair)",
            real,
        )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="default cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model, batch 4 x 32: the code paths in seconds")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--sections",
        default="inference,training",
        help="which tables: inference (1), training (2 and 3), comma-separated; default both",
    )
    parser.add_argument(
        "--compile-backend", default="inductor", help="torch.compile backend (eager: trace only; skips the fast path)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_GPU)
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
