"""The inference fast path against transformers and ONNX Runtime: bert-base, batch 8 x 128, CPU fp32.

Same random bert-base weights everywhere: transformers saves them, bertblocks loads them, and the benchmark
exports transformers' model to ONNX for ONNX Runtime (all graph optimisations on). Contenders:

- ``transformers``: ``BertModel`` with SDPA (the baseline, 1.00x);
- ``bertblocks eager``: ``encoder.packing: auto`` (padded batches run their dense layers on real tokens);
- ``bertblocks torch.compile``: plain ``torch.compile(model, dynamic=True)`` (packing is in the graph with no
  dynamo setting);
- ``bertblocks fast path``: :func:`bertblocks.optimize_for_inference` (packed, frozen, fused);
- ``ONNX Runtime``: the exported transformers graph.

Per-family rows (``--families``, default RoBERTa and DistilBERT): transformers saves a randomly initialised
base-size ``RobertaModel`` / ``DistilBertModel``, bertblocks loads that directory through the family's key map,
and both run the same two batches (bertblocks eager, packing ``auto``; padded positions hold the family's pad id).

Two batches: uniform 8 x 128 (no padding) and padded (lengths [128, 20, 35, 64, 16, 90, 12, 48], 413 of 1024
tokens real). Every repeat runs each contender once, in rotating order; medians and ratios of medians to
transformers are printed, with the spread (min-max of per-repeat ratios). Before timing, outputs on real
tokens are compared with transformers'.

Usage:
    python benchmarks/bench_inference.py                 # bert-base, 7 repeats
    python benchmarks/bench_inference.py --quick         # small shape, 3 repeats (a smoke run)
    python benchmarks/bench_inference.py --mode max-autotune-no-cudagraphs
    python benchmarks/bench_inference.py --families ""   # BERT only, no per-family rows
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch._dynamo
import transformers

import bertblocks

LENGTHS = [128, 20, 35, 64, 16, 90, 12, 48]


def export_hf_onnx(hf: torch.nn.Module, path: Path, example: dict[str, torch.Tensor]) -> Path:
    """transformers' BertModel → ONNX with the TorchScript exporter (as optimum does), ``last_hidden_state`` out."""

    class LastHidden(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    torch.onnx.export(
        LastHidden(hf).eval(),  # a fresh module is in training mode; export would set hf to it
        (example["input_ids"], example["attention_mask"]),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
        opset_version=17,
        dynamo=False,
    )
    return path


def _ort_session(hf: torch.nn.Module, directory: Path, example: dict[str, torch.Tensor]) -> Callable[..., object]:
    import onnxruntime as ort

    path = export_hf_onnx(hf, directory / "model.onnx", example)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
        feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        return session.run(None, feeds)[0]

    return run


#: family → (transformers config, model class, base-size shape), for the per-family rows
FAMILIES: dict[str, tuple[type, type, dict[str, int]]] = {
    "roberta": (
        transformers.RobertaConfig,
        transformers.RobertaModel,
        {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    ),
    "distilbert": (
        transformers.DistilBertConfig,
        transformers.DistilBertModel,
        {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072},
    ),
    "modernbert": (  # ModernBERT-base's shape: 22 pre-LN layers, GeGLU 1152, every third layer global
        transformers.ModernBertConfig,
        transformers.ModernBertModel,
        {"hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12, "intermediate_size": 1152},
    ),
}
QUICK_FAMILIES = {
    "roberta": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024},
    "distilbert": {"dim": 256, "n_layers": 4, "n_heads": 4, "hidden_dim": 1024},
    "modernbert": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 384},
}


def _family_rows(family: str, batches: dict[str, torch.Tensor], repeats: int, quick: bool) -> None:
    """One family's rows: transformers' model against bertblocks loading the checkpoint transformers saved."""
    config_class, model_class, shape = FAMILIES[family]
    torch.manual_seed(0)
    config = config_class(**(QUICK_FAMILIES[family] if quick else shape))
    with tempfile.TemporaryDirectory() as tmp:
        model_class(config).save_pretrained(tmp)
        hf = model_class.from_pretrained(tmp, attn_implementation="sdpa").eval()
        ours = bertblocks.from_pretrained(tmp).eval()
    print(f"{family}: transformers {model_class.__name__} vs bertblocks {type(ours).__name__} (eager, packing auto)")
    with torch.inference_mode():
        for title, mask in batches.items():
            ids = torch.randint(1000, 30000, mask.shape)
            ids[~mask.bool()] = config.pad_token_id  # RoBERTa's positions count the non-padding ids
            real = mask.bool()
            ours_out = ours(input_ids=ids, attention_mask=mask).last_hidden_state
            diff = (ours_out[real] - hf(input_ids=ids, attention_mask=mask)[0][real]).abs().max().item()
            contenders: dict[str, Callable[[], object]] = {
                "transformers": lambda i=ids, m=mask: hf(input_ids=i, attention_mask=m),
                "bertblocks eager": lambda i=ids, m=mask: ours(input_ids=i, attention_mask=m),
            }
            _report(f"  {title} (max abs diff on real tokens {diff:.1e})", _time(contenders, repeats))


def _report(title: str, times: dict[str, list[float]]) -> None:
    """Medians, ratio of medians to transformers, spread of per-repeat ratios."""
    base = statistics.median(times["transformers"])
    print(f"{title}: median ms, ratio to transformers, spread of per-repeat ratios")
    for name, ts in times.items():
        per_repeat = [t / b for t, b in zip(ts, times["transformers"], strict=True)]
        print(
            f"  {name:<26} {statistics.median(ts):8.1f} ms   {statistics.median(ts) / base:5.2f}x   "
            f"({min(per_repeat):.2f}-{max(per_repeat):.2f})"
        )
    print()


def _time(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate: noise hits every contender alike
        for name in order:
            start = time.perf_counter()
            fns[name]()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shape (hidden 256, 4 layers), 3 repeats")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--mode", default=None, help="Inductor mode for the fast path (default: Inductor's)")
    parser.add_argument("--no-onnx", action="store_true", help="leave ONNX Runtime out")
    parser.add_argument(
        "--families", default="roberta,distilbert", help=f"comma-separated per-family rows, of {sorted(FAMILIES)}"
    )
    parser.add_argument("--families-only", action="store_true", help="only the per-family rows (no BERT rows)")
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    hidden, layers, heads, inner = (256, 4, 4, 1024) if args.quick else (768, 12, 12, 3072)
    repeats = 3 if args.quick else args.repeats
    if args.families_only:
        padded_mask = (torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None]).long()
        batches = {"uniform 8 x 128": torch.ones_like(padded_mask), "padded (413 of 1024 real)": padded_mask}
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
        for family in filter(None, args.families.split(",")):
            _family_rows(family.strip(), batches, repeats, args.quick)
        return

    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=inner
    )
    ids = torch.randint(1000, 30000, (len(LENGTHS), max(LENGTHS)))
    padded_mask = (torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    batches = {"uniform 8 x 128": torch.ones_like(padded_mask), "padded (413 of 1024 real)": padded_mask}
    with tempfile.TemporaryDirectory() as tmp:
        transformers.BertModel(config).save_pretrained(tmp)
        hf = transformers.BertModel.from_pretrained(tmp, attn_implementation="sdpa").eval()
        eager = bertblocks.from_pretrained(tmp).eval()
        compiled_model = bertblocks.from_pretrained(tmp).eval()
        fast = bertblocks.optimize_for_inference(bertblocks.from_pretrained(tmp), mode=args.mode)
        ort_run = (
            None if args.no_onnx else _ort_session(hf, Path(tmp), {"input_ids": ids, "attention_mask": padded_mask})
        )
        compiled = torch.compile(compiled_model, dynamic=True)

        print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
        if ort_run is not None:
            import onnxruntime

            print(f"onnxruntime {onnxruntime.__version__}")
        print(f"shape: hidden {hidden}, layers {layers}, heads {heads}, intermediate {inner}; fp32\n")
        with torch.inference_mode():
            start = time.perf_counter()
            for mask in batches.values():  # first calls compile
                compiled(input_ids=ids, attention_mask=mask)
                fast(input_ids=ids, attention_mask=mask)
            print(f"compilation (both compiled contenders, both batches): {time.perf_counter() - start:.0f} s\n")
            for title, mask in batches.items():
                real = mask.bool()
                reference = hf(input_ids=ids, attention_mask=mask).last_hidden_state
                contenders: dict[str, Callable[[], object]] = {
                    "transformers": lambda m=mask: hf(input_ids=ids, attention_mask=m),
                    "bertblocks eager": lambda m=mask: eager(input_ids=ids, attention_mask=m),
                    "bertblocks torch.compile": lambda m=mask: compiled(input_ids=ids, attention_mask=m),
                    "bertblocks fast path": lambda m=mask: fast(input_ids=ids, attention_mask=m),
                }
                if ort_run is not None:
                    contenders["ONNX Runtime"] = lambda m=mask: ort_run(ids, m)
                for name, fn in contenders.items():
                    out = fn()
                    value = torch.as_tensor(out) if name == "ONNX Runtime" else out.last_hidden_state
                    diff = (value[real] - reference[real]).abs().max().item()
                    print(f"  {name:<26} max abs diff to transformers on real tokens: {diff:.1e}")
                _report(title, _time(contenders, repeats))
    for family in filter(None, args.families.split(",")):
        _family_rows(family.strip(), batches, repeats, args.quick)


if __name__ == "__main__":
    main()
