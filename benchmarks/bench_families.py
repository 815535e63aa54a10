"""Every family against its own transformers class, in one run: inference on padded and uniform batches and one
fine-tuning step, bertblocks / transformers ratios per family.

    OMP_NUM_THREADS=1 python benchmarks/bench_families.py --quick        # every family, small shapes (minutes)
    OMP_NUM_THREADS=1 python benchmarks/bench_families.py                # every family at its published shape
    python benchmarks/bench_families.py --families deberta-v2,modernbert # some families only

The families are the rows of the shared family table (``tests/families/reference.py``, ``FAMILIES``) that carry a
tokenizer: one row per family, so a family added there joins this table with no edit here. For each one,
transformers' own ``<Family>ForSequenceClassification`` (the row's class ending so) is built with random weights at
a realistic shape of the family (:data:`SHAPES`: DeBERTa-v3-base, ModernBERT-base, gte-base-en-v1.5, EuroBERT-210m,
ESM-2 35M, ...; bert-base for a family without an entry), every dropout set to 0, and saved; transformers' backbone
class and bertblocks load that directory. The vocabulary is capped at 32000 rows (the timed work gathers from the
embedding table and runs no LM head, so its size changes memory only).

Contenders, each batch (``inference_mode``, fp32):

- ``transformers``: the family's backbone class (transformers' default attention: SDPA where the class has it), the
  baseline (1.00x);
- ``transformers compiled``: ``torch.compile(model, dynamic=True)`` (``--compile-transformers``);
- ``bertblocks eager``: ``bertblocks.from_pretrained`` (``encoder.packing: auto``);
- ``bertblocks fast path``: :func:`bertblocks.optimize_for_inference` (skipped, with the reason printed, under
  ``--quick`` and ``--tiny`` unless ``--fast-path`` is given: compiling every family takes long on a small machine);
- ``bertblocks re-padded`` (padded batch, families whose position scheme adds a score bias: ALiBi, DeBERTa's
  terms, relative_key): the eager model with its packed attention re-padded for every layer, as before score-bias
  schemes attended per sequence (:func:`repadded`): what staying packed gains.

The fine-tuning step is forward + loss + backward of the sequence classifier on the padded batch (``train()``,
dropout 0, gradients zeroed before each step, no optimiser step so every repeat does the same arithmetic):
transformers' class against ``bertblocks.from_pretrained(..., head="auto")`` (``packing: auto``, which does not pack
with gradients on: the padded work transformers does) and the same with ``encoder.packing=always`` (``bertblocks
packed``: the dense layers on real tokens only; not for a model that reads padded positions in this batch, ConvBERT's
(``reads_padded_positions``; BigBird's past its full-attention limit), which packed computes each sequence alone:
other numbers than transformers' on the padded batch).

Batches: the padded one has lengths ``[128, 20, 35, 64, 16, 90, 12, 48]`` (413 of 1024 tokens real: 40 %), the
uniform one is 8 x 128; padded positions hold the family's pad id, ids are drawn above the special tokens.

Before timing, every contender's output is compared with transformers' (``last_hidden_state`` on real tokens; the
logits and the gradient norm of the fine-tuning step) and the maximum absolute difference printed; a contender that
differs by more than :data:`LIMIT` is reported and not timed. Every repeat runs each contender once in rotating
order; the medians, the ratio of medians to transformers and the spread of per-repeat ratios are printed, then one
summary table (Markdown). The machine line (CPU model, its vector flags, threads, load average, versions) comes first.

``--tiny`` runs every code path in seconds with the table's tiny settings (``tests/test_bench_families.py``).
Docs: docs/explanation/performance.md, "Every family against its transformers class".
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the family table lives in the test tree: run from anywhere
    sys.path.insert(0, str(ROOT))

import bertblocks  # noqa: E402
from bertblocks.plugins.attention import BertAttention  # noqa: E402
from tests.families.reference import FAMILIES, Family  # noqa: E402

#: the padded batch's row lengths (413 of 1024 tokens real) and its tiny version
LENGTHS = [128, 20, 35, 64, 16, 90, 12, 48]
TINY_LENGTHS = [16, 3, 4, 8, 2, 11, 2, 6]
#: the largest difference to transformers a contender may have and still be timed (fp32, random weights)
LIMIT = 1e-3
#: the vocabulary's rows, at most (memory only: no LM head is timed)
VOCAB_CAP = 32000
BERT_BASE: dict[str, Any] = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "vocab_size": 30522,
    "initializer_range": 0.02,  # the table's tiny settings use 0.2 (sharp attention, for the parity tests)
}
#: family → (the published model whose shape it is, settings over bert-base's)
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "distilbert": (
        "distilbert-base-uncased",
        {
            "dim": 768,
            "n_layers": 6,
            "n_heads": 12,
            "hidden_dim": 3072,
            "max_position_embeddings": 512,
            "initializer_range": 0.02,
        },
    ),
    "albert": ("albert-base-v2", {"embedding_size": 128}),
    "electra": ("electra-base-discriminator", {"embedding_size": 768}),
    "roberta": ("roberta-base", {"max_position_embeddings": 514}),
    "xlm-roberta": ("xlm-roberta-base", {"max_position_embeddings": 514}),
    "camembert": ("camembert-base", {"max_position_embeddings": 514}),
    "mpnet": ("mpnet-base", {"max_position_embeddings": 514}),
    "nomic_bert": ("nomic-embed-text-v1.5", {"max_position_embeddings": 2048}),
    "jina_embeddings_v3": (
        "jina-embeddings-v3 (XLM-R large)",
        {
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "intermediate_size": 4096,
            "max_position_embeddings": 8194,
        },
    ),
    "modernbert": (
        "ModernBERT-base",
        {
            "num_hidden_layers": 22,
            "intermediate_size": 1152,
            "local_attention": 128,
            "global_rope_theta": 160000.0,
            "local_rope_theta": 10000.0,
            "max_position_embeddings": 8192,
        },
    ),
    "deberta-v2": ("DeBERTa-v3-base", {"max_position_embeddings": 512}),
    "gte-ntk": (
        "gte-base-en-v1.5",
        {
            "max_position_embeddings": 8192,
            # its fixed NTK scaling (base 160000, k = 2) in transformers' terms: linear scaling of the base 160000·k
            # by k^(2/d), head size d = 64 (bertblocks/families/gte.py)
            "rope_parameters": {"rope_theta": 320000.0, "rope_type": "linear", "factor": 2.0 ** (2 / 64)},
        },
    ),
    "esm": (
        "ESM-2 35M (esm2_t12_35M)",
        {
            "hidden_size": 480,
            "num_hidden_layers": 12,
            "num_attention_heads": 20,
            "intermediate_size": 1920,
            "max_position_embeddings": 1026,
            "vocab_size": 33,
            "rope_theta": 10000.0,
        },
    ),
    "eurobert": (
        "EuroBERT-210m",
        {"max_position_embeddings": 8192, "rope_parameters": {"rope_theta": 250000.0, "rope_type": "default"}},
    ),
    "deberta": ("deberta-base", {"max_position_embeddings": 512}),
    "roberta-prelayernorm": ("roberta-prelayernorm-base", {"max_position_embeddings": 514}),
    "xlm-roberta-xl": (
        "xlm-roberta-xl",
        {
            "hidden_size": 2560,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "intermediate_size": 10240,
            "max_position_embeddings": 514,
        },
    ),
    "megatron-bert": (
        "megatron-bert-345m",
        {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
    ),
    "data2vec-text": ("data2vec-text-base", {"max_position_embeddings": 514}),
    "rembert": (
        "rembert",
        {
            "hidden_size": 1152,
            "num_hidden_layers": 32,
            "num_attention_heads": 18,
            "intermediate_size": 4608,
            "input_embedding_size": 256,
            "output_embedding_size": 1664,
        },
    ),
    "mobilebert": (
        "mobilebert-uncased",
        {
            "hidden_size": 512,
            "num_hidden_layers": 24,
            "num_attention_heads": 4,
            "intermediate_size": 512,
            "embedding_size": 128,
            "intra_bottleneck_size": 128,
            "true_hidden_size": 128,
            "num_feedforward_networks": 4,
        },
    ),
    "convbert": (
        "conv-bert-base",
        {"embedding_size": 768, "head_ratio": 2, "conv_kernel_size": 9, "num_groups": 1},
    ),
    "squeezebert": (
        "squeezebert-uncased",
        {
            "embedding_size": 768,
            "q_groups": 4,
            "k_groups": 4,
            "v_groups": 4,
            "post_attention_groups": 1,
            "intermediate_groups": 4,
            "output_groups": 4,
        },
    ),
    "layoutlm": ("layoutlm-base-uncased", {"max_2d_position_embeddings": 1024}),
    "xmod": ("xmod-base", {"max_position_embeddings": 514, "adapter_reduction_factor": 2}),
    "bert-generation": (
        "bert_for_seq_generation_L-24_bbc_encoder",
        {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
    ),
    # a window of 512 on both sides covers every 128-token batch: transformers pads each to the window, the
    # sliding-window kernel still runs
    "longformer": ("longformer-base-4096", {"max_position_embeddings": 4098, "attention_window": 512}),
    # 128 tokens are under BigBird's full-attention threshold ((5 + 2 * 3) * 64): both libraries attend in full
    "big_bird": (
        "bigbird-roberta-base",
        {"max_position_embeddings": 4096, "block_size": 64, "num_random_blocks": 3},
    ),
    "nystromformer": (
        "nystromformer-512",
        {"max_position_embeddings": 510, "num_landmarks": 64, "segment_means_seq_len": 64, "conv_kernel_size": 65},
    ),
}
#: families whose config names its sizes its own way (their :data:`SHAPES` entry says every size)
OWN_NAMES = ("distilbert",)
#: --quick: every family at a small shape (its published shape's kind, 4 layers of width 256)
QUICK: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 1024,
}
QUICK_KEYS = {
    "distilbert": {"dim": 256, "n_layers": 4, "n_heads": 4, "hidden_dim": 1024},
    "electra": {**QUICK, "embedding_size": 256},  # electra-base's embeddings are as wide as its layers
    "convbert": {**QUICK, "embedding_size": 256},
    "squeezebert": {**QUICK, "embedding_size": 256},  # transformers' SqueezeBERT needs them equal
    "mobilebert": {"num_hidden_layers": 4},  # already narrow (blocks of 128 inside 512): its own widths
}


def machine_line() -> str:
    """CPU model, the vector flags that decide which kernels run, torch's CPU capability, threads, load average and
    the versions that produced the figures."""
    model, flags = platform.machine(), set()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []
    for line in cpuinfo:
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")
    present = ",".join(flag for flag in wanted if flag in flags) or "none of avx2/avx512/vnni/amx"
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"machine: {model}, {os.cpu_count()} cores, flags {present}, torch CPU capability {capability}, "
        f"{torch.get_num_threads()} threads, load average {load}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, bertblocks {bertblocks.__version__}"
    )


def family_rows(names: Sequence[str] | None = None) -> dict[str, Family]:
    """The rows of the shared table that carry a tokenizer (one per family), or the ``names`` asked for."""
    if names:
        unknown = [name for name in names if name not in FAMILIES]
        if unknown:
            raise SystemExit(f"bench_families: unknown families {unknown}; the table has {sorted(FAMILIES)}")
        return {name: FAMILIES[name] for name in names}
    return {name: family for name, family in FAMILIES.items() if family.tokenizer is not None}


def _classifier(family: Family) -> str | None:
    """transformers' sequence classifier of the family (a variant row such as ``gte-ntk`` lists fewer classes)."""
    name = family.classes[0].removesuffix("Model") + "ForSequenceClassification"
    return name if hasattr(transformers, name) else None


def _config(
    family: Family, name: str, size: str, layers: int | None = None
) -> tuple[transformers.PretrainedConfig, str]:
    """transformers' config of the family at ``size`` (tiny / quick / base; ``layers`` of them if given), every dropout
    0; and the shape's name."""
    config_class = getattr(transformers, family.config)
    settings = dict(family.settings)
    label = "tiny settings of the family table"
    if size != "tiny":
        published, shape = SHAPES.get(name, ("bert-base", {}))
        settings.update(shape if name in OWN_NAMES else {**BERT_BASE, **shape})
        label = published
        if size == "quick":
            quick = QUICK_KEYS.get(name, QUICK)
            settings.update(quick)
            label = f"{published} kind, 4 x 256" if len(quick) > 1 else f"{published} kind, its widths, 4 layers"
        if layers:  # the published width, fewer layers: per-layer ratios at a fraction of the time
            key = "n_layers" if "n_layers" in settings else "num_hidden_layers"
            settings[key] = layers
            label = f"{label}, {layers} layers"
        vocab = settings.get("vocab_size", BERT_BASE["vocab_size"])
        settings["vocab_size"] = min(vocab, VOCAB_CAP)
    settings["num_labels"] = 3
    config = config_class(**settings)
    for key, value in config.to_dict().items():  # the same arithmetic in both: no dropout anywhere
        if "dropout" in key and isinstance(value, float):
            setattr(config, key, 0.0)
    return config, label


def _batches(family: Family, vocab: int, tiny: bool) -> dict[str, dict[str, torch.Tensor]]:
    lengths = torch.tensor(TINY_LENGTHS if tiny else LENGTHS)
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()
    share = f"{int(mask.sum())} of {mask.numel()} real"
    out: dict[str, dict[str, torch.Tensor]] = {}
    uniform = f"uniform {mask.shape[0]} x {mask.shape[1]}"
    for title, m in ((f"padded ({share})", mask), (uniform, torch.ones_like(mask))):
        low = min(5, vocab - 1)  # above the special tokens (ESM's 33 ids included)
        ids = torch.randint(low, vocab, m.shape, generator=g).masked_fill(m == 0, family.pad)
        inputs = {"input_ids": ids, "attention_mask": m}
        if family.token_types:
            inputs["token_type_ids"] = torch.zeros_like(m)
        if family.extra_inputs is not None:  # inputs beyond BERT's (LayoutLM's boxes, X-MOD's languages)
            inputs.update(family.extra_inputs(tuple(m.shape)))
        out[title] = inputs
    return out


@contextlib.contextmanager
def repadded() -> Iterator[None]:
    """Packed batches re-pad their attention in every layer while inside (the path before score-bias schemes
    attended per sequence), for the ``bertblocks re-padded`` contender."""
    per_sequence = BertAttention._biased_per_sequence
    BertAttention._biased_per_sequence = lambda self, positions: False  # type: ignore[method-assign]
    try:
        yield
    finally:
        BertAttention._biased_per_sequence = per_sequence  # type: ignore[method-assign]


def has_score_bias(model: torch.nn.Module) -> bool:
    """Whether a self-attention layer of ``model`` adds a per-layer term or the encoder a shared bias."""
    return any(
        getattr(getattr(m, "self", None), "position_bias", None) is not None
        for m in model.modules()
        if isinstance(m, BertAttention)
    ) or any(getattr(m, "shared_bias", None) is not None for m in model.modules())


def _time(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Every repeat runs each contender once, in rotating order (noise hits every contender alike)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def _report(title: str, times: dict[str, list[float]]) -> dict[str, float]:
    """Median ms, the ratio of medians to transformers and the spread of per-repeat ratios; returns the ratios."""
    base = statistics.median(times["transformers"])
    print(f"  {title}: median ms, ratio to transformers, spread of per-repeat ratios")
    ratios = {}
    for name, ts in times.items():
        per_repeat = [t / b for t, b in zip(ts, times["transformers"], strict=True)]
        ratios[name] = statistics.median(ts) / base
        print(
            f"    {name:<24} {statistics.median(ts):9.1f} ms  {ratios[name]:5.2f}x  "
            f"({min(per_repeat):.2f}-{max(per_repeat):.2f})"
        )
    return ratios


def _checked(
    contenders: dict[str, Callable[[], Any]], reference: Any, compare: Callable[[Any, Any], float]
) -> dict[str, Callable[[], Any]]:
    """The contenders whose output matches transformers' (each difference printed; a broken one is not timed)."""
    kept = {}
    for name, fn in contenders.items():
        if name == "transformers":
            kept[name] = fn
            continue
        start = time.perf_counter()
        diff = compare(reference, fn())
        first = time.perf_counter() - start
        verdict = "" if diff <= LIMIT else f"  > {LIMIT}: NOT TIMED (outputs differ)"
        print(f"    {name}: max abs diff to transformers {diff:.1e} (first call {first:.1f} s){verdict}")
        if diff <= LIMIT:
            kept[name] = fn
    return kept


def bench_family(name: str, family: Family, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One family's inference and fine-tuning rows; returns ``{batch title: {contender: ratio}}``."""
    head = _classifier(family)
    backbone = family.classes[0]
    size = "tiny" if args.tiny else "quick" if args.quick else "base"
    config, label = _config(family, name, size, args.layers)
    print(f"\n{name}: transformers {backbone} / {head} vs bertblocks, {label}")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        getattr(transformers, head or backbone)(config).save_pretrained(tmp)
        hf = getattr(transformers, backbone).from_pretrained(tmp).eval()
        ours = bertblocks.from_pretrained(tmp).eval()
        fast = None
        if args.fast_path:
            fast = bertblocks.optimize_for_inference(bertblocks.from_pretrained(tmp))
        hf_compiled = torch.compile(hf, dynamic=True) if args.compile_transformers else None
        batches = _batches(family, config.vocab_size, args.tiny)
        with torch.inference_mode():
            for title, inputs in batches.items():
                real = inputs["attention_mask"].bool()

                def hidden(out: Any) -> torch.Tensor:
                    return out[0] if isinstance(out, tuple) else out.last_hidden_state

                def compare(a: Any, b: Any, real: torch.Tensor = real) -> float:
                    return (hidden(a)[real] - hidden(b)[real]).abs().max().item()

                contenders: dict[str, Callable[[], Any]] = {"transformers": lambda i=inputs: hf(**i)}
                if hf_compiled is not None:
                    contenders["transformers compiled"] = lambda i=inputs: hf_compiled(**i)
                contenders["bertblocks eager"] = lambda i=inputs: ours(**i)
                if fast is not None:
                    contenders["bertblocks fast path"] = lambda i=inputs: fast(**i)
                if not bool(real.all()) and has_score_bias(ours):

                    def ours_repadded(i: dict[str, torch.Tensor] = inputs) -> Any:
                        with repadded():
                            return ours(**i)

                    contenders["bertblocks re-padded"] = ours_repadded
                print(f"  {title}")
                kept = _checked(contenders, hf(**inputs), compare)
                results[title] = _report(title, _time(kept, args.repeats))
        if head is None:
            print(f"  fine-tuning step: skipped ({name} has no ForSequenceClassification in transformers)")
            return results
        hf_head = getattr(transformers, head).from_pretrained(tmp).train()
        ours_head = bertblocks.from_pretrained(tmp, head="auto").train()
        inputs = next(iter(batches.values()))
        labels = torch.arange(inputs["input_ids"].shape[0]) % 3

        def step(model: torch.nn.Module) -> tuple[torch.Tensor, float]:
            model.zero_grad(set_to_none=True)
            out = model(**inputs, labels=labels)
            out.loss.backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            return out.logits.detach(), torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()

        def compare_step(a: tuple[torch.Tensor, float], b: tuple[torch.Tensor, float]) -> float:
            return max((a[0] - b[0]).abs().max().item(), abs(a[1] - b[1]) / max(a[1], 1e-12))

        title = "fine-tuning step (padded)"
        print(f"  {title}: logits and gradient norm compared (the norm's relative difference)")
        steps = {"transformers": lambda: step(hf_head), "bertblocks eager": lambda: step(ours_head)}
        reason = ours_head.bert.packing_off_reason
        if not ours_head.bert.auto_packs(inputs["attention_mask"].shape[-1]):
            # ConvBERT's convolutions (BigBird past its full-attention limit): packed, each sequence is computed
            # alone (other numbers than transformers' on the padded batch)
            print(f"    bertblocks packed: skipped ({reason})")
        else:
            try:  # packing: auto never packs with gradients on; training packs when asked
                packed = bertblocks.from_pretrained(tmp, ["encoder.packing=always"], head="auto").train()
                steps["bertblocks packed"] = lambda: step(packed)
            except Exception as error:
                print(f"    bertblocks packed: skipped ({type(error).__name__}: {error})")
        kept = _checked(steps, step(hf_head), compare_step)
        results[title] = _report(title, _time(kept, args.repeats))
    if hf_compiled is not None or fast is not None:
        torch._dynamo.reset()  # the next family compiles afresh (and the cache does not grow across families)
    return results


def summary(all_results: dict[str, dict[str, dict[str, float]]]) -> None:
    """One Markdown table: a row per family and contender, a column per batch (ratio to transformers)."""
    titles = list(dict.fromkeys(t for rows in all_results.values() for t in rows))
    print("\nsummary: ratio of median time to the family's transformers class (below 1: bertblocks is faster)\n")
    print("| family | contender | " + " | ".join(titles) + " |")
    print("|---|---|" + "---|" * len(titles))
    for name, rows in all_results.items():
        contenders = list(dict.fromkeys(c for row in rows.values() for c in row if c != "transformers"))
        for contender in contenders:
            cells = [f"{rows[t][contender]:.2f}" if contender in rows.get(t, {}) else "-" for t in titles]
            print(f"| {name} | {contender} | " + " | ".join(cells) + " |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 layers of width 256 per family, 3 repeats")
    parser.add_argument("--tiny", action="store_true", help="the family table's tiny settings: every path in seconds")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 5; 3 with --quick)")
    parser.add_argument("--layers", type=int, default=None, help="this many layers (the shape's width kept)")
    parser.add_argument("--families", default="", help="comma-separated rows of the family table (default: all)")
    parser.add_argument("--fast-path", action=argparse.BooleanOptionalAction, default=None, help="time it")
    parser.add_argument("--compile-transformers", action="store_true", help="also torch.compile transformers' model")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.tiny else 3 if args.quick else 5
    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.getLogger("bertblocks").setLevel(logging.ERROR)  # the backbone loaded from a classifier's checkpoint
    transformers.utils.logging.disable_progress_bar()
    print(machine_line())
    if args.fast_path is None:
        args.fast_path = not (args.quick or args.tiny)
        if not args.fast_path:
            print(
                "bertblocks fast path: skipped (compiling every family takes minutes on a small machine under "
                "--quick/--tiny; pass --fast-path to time it)"
            )
    rows = family_rows([n.strip() for n in args.families.split(",") if n.strip()])
    all_results = {name: bench_family(name, family, args) for name, family in rows.items()}
    summary(all_results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
