"""Int8 inference (:func:`bertblocks.quantize`) against the fp32 fast path and ONNX Runtime's dynamic int8.

Four parts, one run (each prints the machine line: CPU model and flags, ATen's ISA, threads, load):

0. **One layer** (``--parts layer``): ``Linear(768 -> 3072)`` on 128 rows, every int8 kernel against fp32:
   ``torch._int_mm`` as PyTorch dispatches it here, ``torch._int_mm`` with oneDNN switched off (the plain loop
   that PyTorch runs on every CPU without AVX-512 VNNI: the 20-70x cliff), the two ``Int8Linear`` kernels, and
   ``torch.ao``'s dynamic per-channel linear. Run it under the AVX2 emulation (below) to see why the cliff
   needs the oneDNN switch: ``ATEN_CPU_CAPABILITY`` does not change ``_int_mm``'s dispatch, which reads the
   CPU's own AVX-512 VNNI flag.
1. **Speed, bert-base** (random weights, ``create_model("bert-base-uncased")``), batches uniform 8 x 128 and
   padded (lengths [128, 20, 35, 64, 16, 90, 12, 48], 413 of 1024 tokens real), every repeat runs each
   contender once in rotating order; medians and ratios of medians to the fp32 fast path, with the spread of
   per-repeat ratios. Contenders: the fp32 fast path (``optimize_for_inference``); the int8 fast path
   (``quantize`` then ``optimize_for_inference``); int8 eager (``quantize`` only); PyTorch's own
   ``torch.ao.quantization.quantize_dynamic`` (fbgemm, eager: it cannot be compiled; per tensor and per
   channel), for the choice of kernel; ONNX Runtime fp32 and int8 (``onnxruntime.quantization.quantize_dynamic``,
   QInt8 weights, per tensor and ``per_channel=True``) of transformers' ``BertModel`` holding the same weights,
   exported with the TorchScript exporter (opset 17), all graph optimisations on. Before timing, each
   contender's outputs on real tokens are compared with fp32 eager.
2. **Embedding accuracy, all-MiniLM-L6-v2** (the real checkpoint): 1,000+ generated sentences of varied topics
   and lengths; embeddings from sentence-transformers' fp32 ``encode`` are the reference; bertblocks int8
   (eager and fast path) and ONNX Runtime int8 (default, and ``per_channel=True``): cosine to the reference
   (mean, worst), agreement of each sentence's nearest neighbour (top-1) and overlap of its 10 nearest
   neighbours; corpus time against sentence-transformers.
3. **Classifier accuracy**: a tiny BERT classifier fine-tuned here on a synthetic task; held-out accuracy in
   fp32, bertblocks int8, ONNX Runtime int8 (of the bertblocks fp32 model exported with ``export_onnx``).

The int8 contenders use the kernel :func:`bertblocks.quantize` chooses for this CPU (printed); ``--kernel``
forces one. An AVX2-only CPU, emulated on an AVX-512 one (ATen, oneDNN, fbgemm and MKL held to AVX2; the
kernel choice then sees ``AVX2``)::

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        OMP_NUM_THREADS=1 python benchmarks/bench_quantize.py --parts layer,speed

Usage:
    OMP_NUM_THREADS=1 python benchmarks/bench_quantize.py            # all parts, 5 repeats
    python benchmarks/bench_quantize.py --quick                      # small shape, 2 repeats (a smoke run)
    python benchmarks/bench_quantize.py --parts speed                # one part: speed, minilm, classifier
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from bench_inference import export_hf_onnx  # the script's own folder is on sys.path
from machine import machine_line

import bertblocks
from bertblocks.models.export import export_onnx
from bertblocks.models.quantize import FBGEMM, INT_MM, Int8Linear, quantization_kernel, quantize
from bertblocks.sentence import encode, minilm_path

LENGTHS = [128, 20, 35, 64, 16, 90, 12, 48]
QUICK = ["hidden_size=256", "encoder.num_layers=4", "encoder.attention.num_heads=4"]
QUICK_FF = ["encoder.feedforward.intermediate_size=1024"]


# ------------------------------------------------------------------------------------------------ ONNX Runtime
def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _ort_int8(fp32_path: Path, per_channel: bool = False) -> Path:
    """ONNX Runtime's dynamic quantization: int8 weights (per tensor by default), uint8 activations per tensor."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = fp32_path.with_name(fp32_path.stem + (".int8-channel.onnx" if per_channel else ".int8.onnx"))
    quantize_dynamic(str(fp32_path), str(out), weight_type=QuantType.QInt8, per_channel=per_channel)
    return out


class OrtEncoder(torch.nn.Module):
    """An ONNX session seen as a backbone (``last_hidden_state``), so ``sentence.encode`` can drive it."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.session = _session(path)
        self.names = [i.name for i in self.session.get_inputs()]
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # encode() reads the device from a parameter

    def forward(self, **inputs: torch.Tensor) -> Any:
        feeds = {name: inputs[name].numpy() for name in self.names}
        return transformers.modeling_outputs.BaseModelOutput(
            last_hidden_state=torch.from_numpy(self.session.run(None, feeds)[0])
        )


# ------------------------------------------------------------------------------------------------ timing
def _time(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate: noise hits every contender
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def _report(title: str, times: dict[str, list[float]], base_name: str) -> None:
    base = times[base_name]
    print(f"{title}: median, ratio to {base_name}, spread of per-repeat ratios")
    for name, ts in times.items():
        per_repeat = [t / b for t, b in zip(ts, base, strict=True)]
        print(
            f"  {name:<34} {statistics.median(ts) * 1000:9.1f} ms   "
            f"{statistics.median(ts) / statistics.median(base):5.2f}x   ({min(per_repeat):.2f}-{max(per_repeat):.2f})"
        )
    print()


# ------------------------------------------------------------------------------------------------ part 0
def part_layer(repeats: int) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(768, 3072).eval()
    x = torch.randn(128, 768)
    q = torch.randint(-127, 128, (128, 768), dtype=torch.int8)
    kernels = {name: Int8Linear.from_float(linear, kernel=name) for name in (INT_MM, FBGEMM)}
    weight_t = kernels[INT_MM].weight.t()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        ao = quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear: per_channel_dynamic_qconfig})

    def int_mm_without_onednn() -> torch.Tensor:
        # the branch _int_mm takes on a CPU without AVX-512 VNNI (the flags' own warning is about TF32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.backends.mkldnn.flags(enabled=False):
                return torch._int_mm(q, weight_t)

    contenders: dict[str, Callable[[], Any]] = {
        "fp32 F.linear": lambda: linear(x),
        "torch._int_mm (as dispatched)": lambda: torch._int_mm(q, weight_t),
        "torch._int_mm, oneDNN off": int_mm_without_onednn,
        "Int8Linear kernel=int_mm": lambda: kernels[INT_MM](x),
        "Int8Linear kernel=fbgemm": lambda: kernels[FBGEMM](x),
        "torch.ao dynamic, per channel": lambda: ao(x),
    }
    print(f"{machine_line()}\nLinear(768 -> 3072) on 128 rows, {repeats} repeats\n")
    with torch.inference_mode():
        for fn in contenders.values():
            fn()
        _report("one layer", _time(contenders, repeats), "fp32 F.linear")


def _ratio(times: dict[str, list[float]], name: str, base_name: str) -> None:
    per_repeat = [t / b for t, b in zip(times[name], times[base_name], strict=True)]
    ratio = statistics.median(times[name]) / statistics.median(times[base_name])
    print(f"  {name} / {base_name}: {ratio:.2f}x ({min(per_repeat):.2f}-{max(per_repeat):.2f})\n")


# ------------------------------------------------------------------------------------------------ part 1
def part_speed(repeats: int, quick: bool, tmp: Path, kernel: str) -> None:
    overrides = (QUICK + QUICK_FF) if quick else []
    torch.manual_seed(0)
    fp32 = bertblocks.create_model("bert-base-uncased", overrides=overrides).eval()
    state = fp32.state_dict()

    def fresh() -> torch.nn.Module:
        model = bertblocks.create_model("bert-base-uncased", overrides=overrides).eval()
        model.load_state_dict(state)
        return model

    fast32 = bertblocks.optimize_for_inference(fresh())
    fast8 = bertblocks.optimize_for_inference(quantize(fresh(), kernel=kernel))
    eager8 = quantize(fresh(), kernel=kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        ao8 = quantize_dynamic(fresh(), {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
        ao8c = quantize_dynamic(fresh(), {torch.nn.Linear: per_channel_dynamic_qconfig}, inplace=True)

    fp32.save_pretrained(tmp / "bert")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf = transformers.BertModel.from_pretrained(tmp / "bert", attn_implementation="sdpa").eval()
    batches: dict[str, torch.Tensor] = {
        "uniform 8 x 128": torch.ones(8, 128, dtype=torch.long),
        "padded (413 of 1024 real)": (torch.arange(128)[None, :] < torch.tensor(LENGTHS)[:, None]).long(),
    }
    g = torch.Generator().manual_seed(0)
    example = {"input_ids": torch.randint(1000, 30000, (2, 16), generator=g), "attention_mask": torch.ones(2, 16)}
    example["attention_mask"] = example["attention_mask"].long()
    onnx32 = export_hf_onnx(hf, tmp / "bert.onnx", example)
    ort32, ort8 = _session(onnx32), _session(_ort_int8(onnx32))
    ort8c = _session(_ort_int8(onnx32, per_channel=True))
    print(
        f"{machine_line()}\nbertblocks int8 kernel: {quantization_kernel(eager8)}; torch.ao engine: "
        f"{torch.backends.quantized.engine}; {repeats} repeats\n"
    )
    with torch.inference_mode():
        for title, mask in batches.items():
            ids = torch.randint(1000, 30000, mask.shape, generator=g)
            real = mask.bool()
            feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
            contenders: dict[str, Callable[[], Any]] = {
                "fp32 fast path": lambda i=ids, m=mask: fast32(input_ids=i, attention_mask=m).last_hidden_state,
                "int8 fast path (quantize + fast)": lambda i=ids, m=mask: (
                    fast8(input_ids=i, attention_mask=m).last_hidden_state
                ),
                "int8 eager (quantize)": lambda i=ids, m=mask: eager8(input_ids=i, attention_mask=m).last_hidden_state,
                "torch.ao quantize_dynamic (eager)": lambda i=ids, m=mask: (
                    ao8(input_ids=i, attention_mask=m).last_hidden_state
                ),
                "torch.ao per channel (eager)": lambda i=ids, m=mask: (
                    ao8c(input_ids=i, attention_mask=m).last_hidden_state
                ),
                "ONNX Runtime fp32": lambda f=feeds: torch.from_numpy(ort32.run(None, f)[0]),
                "ONNX Runtime int8": lambda f=feeds: torch.from_numpy(ort8.run(None, f)[0]),
                "ONNX Runtime int8 per channel": lambda f=feeds: torch.from_numpy(ort8c.run(None, f)[0]),
            }
            reference = fp32(input_ids=ids, attention_mask=mask).last_hidden_state[real]
            start = time.perf_counter()
            print(f"{title}: outputs on real tokens against fp32 eager (max abs diff, mean / worst token cosine)")
            for name, fn in contenders.items():
                out = fn()[real]
                cos = torch.nn.functional.cosine_similarity(out, reference, dim=-1)
                print(
                    f"  {name:<34} {(out - reference).abs().max().item():.2e}   "
                    f"{cos.mean().item():.5f} / {cos.min().item():.5f}"
                )
            print(f"  (first calls, compilation included: {time.perf_counter() - start:.0f} s)\n")
            times = _time(contenders, repeats)
            _report(title, times, "fp32 fast path")
            _ratio(times, "int8 fast path (quantize + fast)", "ONNX Runtime int8 per channel")
        print(f"after: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")


# ------------------------------------------------------------------------------------------------ part 2
TOPICS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "food": (
        ["The chef", "My grandmother", "A hungry student", "The baker", "Our neighbour", "The waiter"],
        ["cooked", "tasted", "served", "burned", "prepared", "ordered"],
        ["a spicy curry", "fresh bread", "pasta with tomato sauce", "a chocolate cake", "grilled fish", "soup"],
    ),
    "sport": (
        ["The striker", "Our team", "The young athlete", "The goalkeeper", "The coach", "A tennis player"],
        ["won", "lost", "trained for", "celebrated", "prepared for", "watched"],
        ["the final match", "the championship", "a marathon", "the penalty shootout", "the season", "the cup"],
    ),
    "weather": (
        ["The forecast", "The storm", "A cold wind", "Heavy rain", "The sun", "Thick fog"],
        ["covered", "flooded", "warmed", "hit", "cleared from", "swept across"],
        ["the valley", "the city", "the coast", "the mountains", "the harbour", "the fields"],
    ),
    "computing": (
        ["The programmer", "The server", "A new compiler", "The database", "Our laptop", "The engineer"],
        ["crashed during", "optimised", "compiled", "debugged", "deployed", "tested"],
        ["the update", "the kernel", "a memory leak", "the web service", "the test suite", "the release"],
    ),
    "music": (
        ["The orchestra", "A young pianist", "The band", "The singer", "The choir", "A guitarist"],
        ["performed", "recorded", "rehearsed", "composed", "played", "sang"],
        ["a symphony", "a new album", "an old folk song", "the concerto", "a love song", "the anthem"],
    ),
    "travel": (
        ["The tourists", "My brother", "A pilot", "The family", "The backpacker", "The train"],
        ["visited", "flew to", "left", "arrived in", "explored", "booked a trip to"],
        ["Paris", "a small island", "the old town", "the desert", "Tokyo", "the national park"],
    ),
    "health": (
        ["The doctor", "A nurse", "The patient", "The surgeon", "The pharmacist", "The researcher"],
        ["treated", "examined", "prescribed", "studied", "operated on", "vaccinated"],
        ["a broken arm", "the fever", "a rare disease", "the children", "a heart condition", "the infection"],
    ),
    "finance": (
        ["The bank", "Investors", "The central bank", "The company", "A trader", "The market"],
        ["raised", "cut", "reported", "sold", "bought", "predicted"],
        ["interest rates", "its profits", "government bonds", "shares", "the currency", "quarterly losses"],
    ),
}
TAILS = [
    "",
    " yesterday",
    " this morning",
    " after a long week",
    " despite the difficulties",
    " because everyone had asked for it",
    " and nobody expected what happened next",
    ", which surprised most of the people who had been following the story closely for years",
]


def sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct sentences over eight topics, of varied length (a few to about 40 tokens)."""
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < count:
        subjects, verbs, objects = TOPICS[rng.choice(list(TOPICS))]
        text = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(TAILS)}."
        if rng.random() < 0.2:  # some questions and negations
            text = f"Is it true that {text[0].lower()}{text[1:-1]}?"
        out.add(text)
    return sorted(out, key=lambda _: rng.random())


def _neighbours(emb: torch.Tensor, k: int) -> torch.Tensor:
    sims = emb @ emb.T
    sims.fill_diagonal_(-2.0)
    return sims.topk(k, dim=1).indices


def _agreement(reference: torch.Tensor, other: torch.Tensor, k: int = 10) -> tuple[float, float]:
    """Share of sentences whose nearest neighbour is the same; mean overlap of the ``k`` nearest."""
    a, b = _neighbours(reference, k), _neighbours(other, k)
    top1 = (a[:, 0] == b[:, 0]).float().mean().item()
    overlap = statistics.mean(len(set(x.tolist()) & set(y.tolist())) / k for x, y in zip(a, b, strict=True))
    return top1, overlap


def part_minilm(count: int, repeats: int, tmp: Path, kernel: str) -> None:
    import sentence_transformers

    logging.getLogger("transformers").setLevel(logging.ERROR)
    path = minilm_path()
    texts = sentences(count)
    tokenizer = bertblocks.BertTokenizer.from_pretrained(path)
    lengths = [len(ids) for ids in tokenizer(texts, padding=False, return_tensors=None)["input_ids"]]
    print(
        f"all-MiniLM-L6-v2, {len(texts)} sentences over {len(TOPICS)} topics, {min(lengths)}-{max(lengths)} "
        f"tokens (mean {statistics.mean(lengths):.0f})"
    )
    st = sentence_transformers.SentenceTransformer(str(path), device="cpu").eval()
    int8 = quantize(bertblocks.from_pretrained(path).eval(), kernel=kernel)
    fast8 = bertblocks.optimize_for_inference(quantize(bertblocks.from_pretrained(path).eval(), kernel=kernel))
    print(f"{machine_line()}\nbertblocks int8 kernel: {quantization_kernel(int8)}")
    hf = transformers.BertModel.from_pretrained(path, attn_implementation="sdpa").eval()
    example = {"input_ids": torch.randint(1000, 20000, (2, 16)), "attention_mask": torch.ones(2, 16, dtype=torch.long)}
    onnx32 = export_hf_onnx(hf, tmp / "minilm.onnx", example)
    ort8, ort8_channel = OrtEncoder(_ort_int8(onnx32)), OrtEncoder(_ort_int8(onnx32, per_channel=True))
    contenders: dict[str, Callable[[], torch.Tensor]] = {
        "sentence-transformers fp32": lambda: st.encode(
            texts, batch_size=32, convert_to_tensor=True, show_progress_bar=False, normalize_embeddings=True
        ),
        "bertblocks int8 (eager)": lambda: encode(int8, tokenizer, texts),
        "bertblocks int8 fast path": lambda: encode(fast8, tokenizer, texts),
        "ONNX Runtime int8": lambda: encode(ort8, tokenizer, texts),
        "ONNX Runtime int8 per_channel": lambda: encode(ort8_channel, tokenizer, texts),
    }
    with torch.inference_mode():
        reference = contenders["sentence-transformers fp32"]()
        print("against sentence-transformers fp32: cosine mean / worst; nearest neighbour same; top-10 overlap")
        for name, fn in list(contenders.items())[1:]:
            emb = fn()
            cos = (emb * reference).sum(-1)
            top1, overlap = _agreement(reference, emb)
            print(f"  {name:<30} {cos.mean().item():.5f} / {cos.min().item():.5f}   {top1:.1%}   {overlap:.1%}")
        print()
        _report("MiniLM corpus", _time(contenders, repeats), "sentence-transformers fp32")


# ------------------------------------------------------------------------------------------------ part 3
def classification_task(n: int, seed: int, length: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids from 5..98, label: 1 when more tokens fall in 5..51 than in 52..98, else 0 (odd real counts)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (n, length), generator=g)
    real = torch.randint(length // 2, length + 1, (n,), generator=g) | 1  # odd: no ties
    real = real.clamp(max=length if length % 2 else length - 1)
    mask = (torch.arange(length)[None, :] < real[:, None]).long()
    ids[:, 0] = 2  # a [CLS]-like first token
    low = ((ids < 52) & mask.bool()).sum(1) - (ids[:, 0] < 52).long()
    high = ((ids >= 52) & mask.bool()).sum(1)
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask, (low > high).long()


TINY_CLASSIFIER = {
    "vocab_size": 99,
    "hidden_size": 64,
    "max_position_embeddings": 64,
    "encoder": {"num_layers": 2, "attention": {"num_heads": 4}, "feedforward": {"intermediate_size": 128}},
    "hidden_dropout_prob": 0.0,
    "num_labels": 2,
}


def train_classifier(steps: int = 300, seed: int = 0) -> torch.nn.Module:
    """A tiny BERT sequence classifier fine-tuned on :func:`classification_task` (fp32, eval mode at the end)."""
    torch.manual_seed(seed)
    model = bertblocks.create_model(TINY_CLASSIFIER, head="sequence_classification")
    ids, mask, labels = classification_task(4096, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model.train()
    for step in range(steps):
        chosen = torch.randint(0, len(ids), (64,), generator=torch.Generator().manual_seed(step))
        loss = model(input_ids=ids[chosen], attention_mask=mask[chosen], labels=labels[chosen]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def accuracy(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits
    return (logits.argmax(-1) == labels).float().mean().item()


def part_classifier(tmp: Path) -> None:
    model = train_classifier()
    ids, mask, labels = classification_task(2000, seed=2)  # held out: another seed
    fp32_acc = accuracy(model, ids, mask, labels)
    onnx32 = export_onnx(model, tmp / "cls.onnx", input_names=("input_ids", "attention_mask"))
    session = _session(_ort_int8(onnx32))
    ort_logits = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    ort_acc = float((np.argmax(ort_logits, -1) == labels.numpy()).mean())
    with torch.inference_mode():
        fp32_logits = model(input_ids=ids, attention_mask=mask).logits
    int8_acc = accuracy(quantize(model), ids, mask, labels)
    with torch.inference_mode():
        int8_logits = model(input_ids=ids, attention_mask=mask).logits
    print(f"tiny classifier (hidden 64, 2 layers), {len(labels)} held-out examples: accuracy")
    print(
        f"  fp32 {fp32_acc:.4f}   bertblocks int8 {int8_acc:.4f} ({int8_acc - fp32_acc:+.4f})   "
        f"ONNX Runtime int8 {ort_acc:.4f} ({ort_acc - fp32_acc:+.4f})"
    )
    agree = (int8_logits.argmax(-1) == fp32_logits.argmax(-1)).float().mean().item()
    ort_agree = float((np.argmax(ort_logits, -1) == fp32_logits.argmax(-1).numpy()).mean())
    print(
        f"  predictions equal to fp32's: int8 {agree:.2%}, ONNX Runtime int8 {ort_agree:.2%}; max logit diff: "
        f"int8 {(int8_logits - fp32_logits).abs().max().item():.3f}, "
        f"ONNX Runtime int8 {np.abs(ort_logits - fp32_logits.numpy()).max():.3f}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="small shape, 2 repeats, 200 sentences")
    parser.add_argument("--parts", default="layer,speed,minilm,classifier")
    parser.add_argument("--kernel", default="auto", help="int8 kernel for bertblocks: auto, int_mm or fbgemm")
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats
    parts = set(args.parts.split(","))
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization's shape-inference notes
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        if "classifier" in parts:
            part_classifier(tmp)
        if "minilm" in parts:
            part_minilm(200 if args.quick else args.sentences, repeats, tmp, args.kernel)
        if "layer" in parts:
            part_layer(max(repeats, 10))
        if "speed" in parts:
            part_speed(repeats, args.quick, tmp, args.kernel)


if __name__ == "__main__":
    main()
