"""Which varlen kernel attends a packed batch: per-sequence SDPA calls, ``flex_attention`` with a document mask, and
(CUDA, ``--dtype bfloat16``/``float16``) FlashAttention's varlen kernel.

What ``sdpa``'s ``varlen_kernel: auto`` picks per device type comes from this measurement
(``bertblocks/plugins/varlen/flex.py``). Contenders, interleaved repeat by repeat so that machine noise hits all
alike (medians, ratios to ``per_sequence``):

1. the whole packed encoder (bert-base shape, random weights, fp32, eval, ``torch.inference_mode``) with
   ``varlen_kernel: per_sequence`` and ``varlen_kernel: flex`` (flex uncompiled on CPU, as that option runs it);
2. the attention kernel alone at bert-base heads (12 × 64) on the same lengths: per-sequence SDPA, flex
   uncompiled, and (``--compiled``) flex compiled by ``torch.compile`` (the kernel ``auto`` uses on CUDA; its
   first call compiles, tens of seconds on CPU), the block mask built once outside the timing, and its build
   timed apart (once per forward pass in the model).

``--score-bias`` measures instead how a packed batch attends with a score-bias position scheme (ALiBi, DeBERTa's
c2p/p2c terms, relative_key, MPNet's buckets), whose contenders are:

1. whole models at published shapes (random weights, fp32, eval, ``torch.inference_mode``; ``--presets``,
   ``--layers``): ``per_sequence`` (the packed path: one backend call per run of equal lengths, each sequence's own
   ``[h, l, l]`` term as the mask), ``re-padded`` (the same model with its attention re-padded in every layer, as
   before), ``padded`` (``encoder.packing: never``);
2. the kernel alone for ALiBi at bert-base heads: per-sequence SDPA with each sequence's bias as its float mask,
   flex with the document block mask and an ALiBi ``score_mod`` (uncompiled; compiled with ``--compiled``), and
   the re-padded masked SDPA call;
3. with ``--compiled-models``, each model under ``torch.compile`` (inductor, dynamic) as well: the packed graph
   holding the custom op ``bertblocks::sdpa_varlen_biased`` (each sequence's term gathered inside it) against the
   same graph re-padding in every layer (what a compiled graph did before the op).

Usage:
    python benchmarks/bench_varlen.py              # CPU (or --device cuda --dtype bfloat16)
    python benchmarks/bench_varlen.py --compiled   # also flex's compiled kernel
    OMP_NUM_THREADS=1 python benchmarks/bench_varlen.py --score-bias --layers 4
    python benchmarks/bench_varlen.py --score-bias --compiled-models --layers 2 --no-kernels
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from long_context import interleaved_medians  # the script's own folder is on sys.path
from machine import machine_line

import bertblocks
from bertblocks.core.interfaces import Positions
from bertblocks.plugins.attention import BertAttention
from bertblocks.plugins.positions import AlibiBias, alibi_slopes
from bertblocks.plugins.varlen.flash import flash_available, flash_varlen_attention
from bertblocks.plugins.varlen.flex import PackedIndex
from bertblocks.plugins.varlen.sdpa import equal_length_runs, sdpa_per_sequence

#: the padded batch of the performance issue (413 real tokens of 1024)
LENGTHS = [128, 20, 35, 64, 16, 90, 12, 48]


def _report(title: str, medians: dict[str, float]) -> None:
    base = medians["per_sequence"]
    print(title)
    for name, ms in medians.items():
        print(f"  {name:<28} {ms:9.2f} ms   x{ms / base:5.2f} of per_sequence")


def _machine(device: str) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cpu = platform.machine()
    with contextlib.suppress(OSError):
        lines = open("/proc/cpuinfo").read().splitlines()  # noqa: SIM115 (a few lines, Linux only)
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
    where = torch.cuda.get_device_name() if device == "cuda" else cpu
    return f"{where}, torch {torch.__version__}, {torch.get_num_threads()} threads, load {load:.2f}"


#: the score-bias schemes' published shapes (``--score-bias``): ALiBi (Jina v2), DeBERTa-v3, relative_key, MPNet
SCORE_BIAS_PRESETS = "jina-embeddings-v2-base-en,deberta-v3-base,bert-base-uncased-relative-key,all-mpnet-base-v2"


@contextlib.contextmanager
def _repadded() -> Iterator[None]:
    """Packed attention re-padded in every layer while inside (the path before score biases stayed packed)."""
    per_sequence = BertAttention._biased_per_sequence
    BertAttention._biased_per_sequence = lambda self, positions: False  # type: ignore[method-assign]
    try:
        yield
    finally:
        BertAttention._biased_per_sequence = per_sequence  # type: ignore[method-assign]


def _score_bias_model(preset: str, mask: torch.Tensor, args: argparse.Namespace) -> None:
    """One preset's encoder: packed per sequence, packed re-padded, padded; outputs compared, then timed."""
    device = args.device
    b, length = mask.shape
    overrides = [f"encoder.num_layers={args.layers}"] if args.layers else []
    torch.manual_seed(0)
    packed = bertblocks.create_model(preset, [*overrides, "encoder.packing=always"]).to(device).eval()
    padded = bertblocks.create_model(preset, [*overrides, "encoder.packing=never"]).to(device).eval()
    padded.load_state_dict(packed.state_dict())
    ids = torch.randint(5, packed.config.vocab_size, (b, length), device=device).masked_fill(mask == 0, 0)
    real = mask.bool()

    def run(model: torch.nn.Module, repad: bool = False) -> torch.Tensor:
        with torch.inference_mode(), _repadded() if repad else contextlib.nullcontext():
            return model(input_ids=ids, attention_mask=mask).last_hidden_state

    reference = run(padded)
    for name, out in (("per_sequence", run(packed)), ("re-padded", run(packed, True))):
        print(f"  {preset} {name}: max abs diff to padded {(out[real] - reference[real]).abs().max().item():.1e}")
    contenders = {
        "per_sequence": lambda: run(packed),
        "re-padded": lambda: run(packed, True),
        "padded (packing: never)": lambda: run(padded),
    }
    if args.compiled_models:
        # torch.compile (inductor, one dynamic graph) of the packed model: the custom op holding every sequence's term
        # (bertblocks::sdpa_varlen_biased) against the same graph re-padding in every layer (each attention told
        # that the op cannot serve it: an instance attribute, so the other model's graph is untouched)
        op_model = bertblocks.create_model(preset, [*overrides, "encoder.packing=always"]).to(device).eval()
        repad_model = bertblocks.create_model(preset, [*overrides, "encoder.packing=always"]).to(device).eval()
        for model in (op_model, repad_model):
            model.load_state_dict(packed.state_dict())
        for module in repad_model.modules():
            if isinstance(module, BertAttention):
                module._attend_per_sequence_compiled = lambda *a, **k: None  # type: ignore[method-assign]
        compiled = {
            "compiled: custom op": torch.compile(op_model, dynamic=True),
            "compiled: re-padded": torch.compile(repad_model, dynamic=True),
        }
        for name, model in compiled.items():
            start = time.perf_counter()
            out = run(model)
            print(
                f"  {preset} {name}: compiled in {time.perf_counter() - start:.0f} s, max abs diff to padded "
                f"{(out[real] - reference[real]).abs().max().item():.1e}"
            )
            contenders[name] = lambda model=model: run(model)
    layers = packed.config.encoder.num_layers
    _report(f"{preset} ({layers} layers), encoder forward", interleaved_medians(contenders, args.repeats, device))


def score_bias(args: argparse.Namespace) -> None:
    """The ``--score-bias`` measurement (see the module)."""
    device = args.device
    print(machine_line())
    b, length = len(LENGTHS), max(LENGTHS)
    mask = (torch.arange(length)[None, :] < torch.tensor(LENGTHS)[:, None]).long().to(device)
    print(f"padded batch {b} x {length}, lengths {LENGTHS}: {sum(LENGTHS)} of {b * length} tokens real")
    for preset in [p.strip() for p in args.presets.split(",") if p.strip()]:
        _score_bias_model(preset, mask, args)
    if not args.kernels:
        return
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    tokens, heads, dim = sum(LENGTHS), 12, 64
    q, k, v = (torch.randn(tokens, heads, dim, device=device) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device=device)
    index = PackedIndex.from_cu_seqlens(cu, tokens)
    document, position = index.document, index.position
    slopes = torch.tensor(alibi_slopes(heads), dtype=torch.float32, device=device)
    alibi = AlibiBias(alibi_slopes(heads)).to(device)(Positions.contiguous(length, 0, torch.device(device)), q.dtype)
    scale = dim**-0.5

    def per_sequence() -> torch.Tensor:
        out = torch.empty_like(q)
        for start, count, size in equal_length_runs(cu):
            span = slice(start, start + count * size)
            qq, kk, vv = (x[span].unflatten(0, (count, size)).transpose(1, 2) for x in (q, k, v))
            bias = alibi[:, :, :size, :size]
            attended = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=bias, scale=scale)
            out[span] = attended.transpose(1, 2).flatten(0, 1)
        return out

    def same_sequence(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return document[q_idx] == document[kv_idx]

    def alibi_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> Any:
        return score - slopes[h] * (position[qi] - position[ki]).abs()

    block_mask = create_block_mask(same_sequence, None, None, tokens, tokens, device=device)
    Q, K, V = (x.transpose(0, 1)[None] for x in (q, k, v))
    flat = torch.cat([torch.arange(n, device=device) + row * length for row, n in enumerate(LENGTHS)])
    padding = torch.zeros(b, 1, 1, length, device=device).masked_fill(mask[:, None, None, :] == 0, -3.4e38)

    def repad() -> torch.Tensor:
        def up(x: torch.Tensor) -> torch.Tensor:
            z = x.new_zeros(b * length, heads, dim)
            z[flat] = x
            return z.view(b, length, heads, dim).transpose(1, 2)

        out = torch.nn.functional.scaled_dot_product_attention(
            up(q), up(k), up(v), attn_mask=alibi + padding, scale=scale
        )
        return out.transpose(1, 2).reshape(b * length, heads, dim)[flat]

    kernels: dict[str, Callable[[], object]] = {
        "per_sequence": per_sequence,
        "flex score_mod (uncompiled)": lambda: flex_attention(
            Q, K, V, score_mod=alibi_mod, block_mask=block_mask, scale=scale
        ),
        "re-padded masked SDPA": repad,
        # what a compiled graph calls (the bias as the op's `fixed` term; the op is opaque, so compiling adds nothing)
        "custom op sdpa_varlen_biased": lambda: torch.ops.bertblocks.sdpa_varlen_biased(
            q, k, v, cu, scale, 1.0, None, None, None, alibi
        ),
    }
    if args.compiled:
        compiled = torch.compile(flex_attention, dynamic=False)
        compiled(Q, K, V, score_mod=alibi_mod, block_mask=block_mask, scale=scale)
        kernels["flex score_mod (compiled)"] = lambda: compiled(
            Q, K, V, score_mod=alibi_mod, block_mask=block_mask, scale=scale
        )
    with torch.inference_mode():
        want = per_sequence()
        for name, fn in kernels.items():
            got = fn()
            got = got[0].transpose(0, 1) if got.dim() == 4 else got  # type: ignore[union-attr]
            print(f"  ALiBi kernel {name}: max abs diff to per_sequence {(got - want).abs().max().item():.1e}")
        _report(
            "ALiBi attention kernel alone, one layer (12 heads x 64)",
            interleaved_medians(kernels, args.repeats, device),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="FlashAttention needs 16 bits"
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compiled", action="store_true", help="also flex's compiled kernel (compiles first)")
    parser.add_argument("--score-bias", action="store_true", help="score-bias schemes: per sequence vs re-padded")
    parser.add_argument("--presets", default=SCORE_BIAS_PRESETS, help="--score-bias: the models (presets)")
    parser.add_argument("--layers", type=int, default=None, help="--score-bias: this many layers of each preset")
    parser.add_argument(
        "--compiled-models",
        action="store_true",
        help="--score-bias: also each model under torch.compile, custom op vs re-padded (compiles first, minutes)",
    )
    parser.add_argument("--kernels", action=argparse.BooleanOptionalAction, default=True, help="--score-bias: kernels")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    if args.score_bias:
        score_bias(args)
        return
    device, dtype = args.device, getattr(torch, args.dtype)
    print(_machine(device), args.dtype)
    # FlashAttention's varlen kernel (auto's choice on CUDA) runs CUDA float16/bfloat16 only
    flash = device == "cuda" and dtype != torch.float32 and flash_available()

    ids, mask = torch.randint(1000, 30000, (len(LENGTHS), max(LENGTHS))), torch.zeros(len(LENGTHS), max(LENGTHS))
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    ids, mask = ids.to(device), mask.long().to(device)
    models = {}
    for kernel in ("per_sequence", "flex", *(("flash",) if flash else ())):
        torch.manual_seed(0)
        config = bertblocks.load_config("bert-base-uncased")
        config.encoder.attention.backend = config.encoder.attention.backend.model_validate(
            {"name": "sdpa", "varlen_kernel": kernel}
        )
        model = bertblocks.create_model(config, ["encoder.packing=always"])
        models[kernel] = model.to(device=device, dtype=dtype).eval()

    def forward(kernel: str) -> Callable[[], object]:
        def run() -> object:
            with torch.inference_mode():
                return models[kernel](input_ids=ids, attention_mask=mask)

        return run

    _report(
        f"packed bert-base encoder, lengths {LENGTHS} ({sum(LENGTHS)} tokens)",
        interleaved_medians({kernel: forward(kernel) for kernel in models}, args.repeats, device),
    )

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    tokens, heads, dim = sum(LENGTHS), 12, 64
    q, k, v = (torch.randn(tokens, heads, dim, device=device, dtype=dtype) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device=device)
    document = PackedIndex.from_cu_seqlens(cu, tokens).document

    def same_sequence(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return document[q_idx] == document[kv_idx]

    block_mask = create_block_mask(same_sequence, None, None, tokens, tokens, device=device)
    Q, K, V = (x.transpose(0, 1)[None] for x in (q, k, v))
    kernels: dict[str, Callable[[], object]] = {
        "per_sequence": lambda: sdpa_per_sequence(q, k, v, cu, dim**-0.5),
        "flex (uncompiled)": lambda: flex_attention(Q, K, V, block_mask=block_mask, scale=dim**-0.5),
        "block mask build": lambda: create_block_mask(same_sequence, None, None, tokens, tokens, device=device),
    }
    if flash:
        kernels["flash"] = lambda: flash_varlen_attention(q, k, v, cu, dim**-0.5, 0.0, max(LENGTHS))
    if args.compiled:
        compiled = torch.compile(flex_attention, dynamic=False)
        start = time.perf_counter()
        compiled(Q, K, V, block_mask=block_mask, scale=dim**-0.5)
        print(f"flex compile (first call): {time.perf_counter() - start:.1f} s")
        kernels["flex (compiled)"] = lambda: compiled(Q, K, V, block_mask=block_mask, scale=dim**-0.5)
    with torch.inference_mode():
        _report("attention kernel alone, one layer (12 heads x 64)", interleaved_medians(kernels, args.repeats, device))


if __name__ == "__main__":
    main()
