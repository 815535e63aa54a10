"""Cost of the position schemes, and two of them against transformers on the same weights.

1. bertblocks encoders that differ only in their position scheme (``absolute``, ``rope``, ``rope`` with half
   the head rotated, ``relative_bucket``, ``relative_key``) and in the attention backend (``sdpa`` vs
   ``sliding_window`` of 128): forward time relative to ``absolute``.
2. ``relative_bucket`` vs transformers' ``MPNetEncoder`` (the layer stack with its shared bucket bias), same
   weights, checked equal (1e-4) before timing.
3. One rope attention sub-layer with a fused, bias-free ``Wqkv`` vs transformers' ``ModernBertAttention`` with
   its rotary tables (ours also runs the residual and LayerNorm of a post-LN sub-layer, so it does a little
   more work).

fp32, eval, ``torch.inference_mode``; repeats alternate between the contenders so machine noise hits all
alike; medians are printed (ms), with ratios.

Usage:
    python benchmarks/bench_positions.py            # 12 x 768, batch 8 x 256
    python benchmarks/bench_positions.py --quick    # 4 x 256, batch 4 x 128
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

import torch
import transformers
from transformers.models.modernbert.modeling_modernbert import ModernBertAttention, ModernBertRotaryEmbedding
from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

import bertblocks
from bertblocks.core.interfaces import Positions


def _time(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
            start = time.perf_counter()
            fns[name]()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _config(hidden: int, layers: int, heads: int, position: object, backend: object = "sdpa") -> dict:
    return {
        "hidden_size": hidden,
        "max_position_embeddings": 512,
        "position": position,
        "encoder": {
            "num_layers": layers,
            "attention": {"num_heads": heads, "backend": backend},
            "feedforward": {"intermediate_size": 4 * hidden},
        },
    }


def schemes(hidden: int, layers: int, heads: int, batch: int, length: int, repeats: int) -> None:
    ids = torch.randint(1, 30000, (batch, length))
    variants = {
        "absolute": ("absolute", "sdpa"),
        "rope": ("rope", "sdpa"),
        "rope (half rotary)": ({"name": "rope", "rotary_fraction": 0.5}, "sdpa"),
        "relative_bucket": ("relative_bucket", "sdpa"),
        "relative_key": ("relative_key", "sdpa"),
        "rope + sliding_window 128": ("rope", {"name": "sliding_window", "window": 128}),
    }
    models = {}
    for name, (position, backend) in variants.items():
        torch.manual_seed(0)
        models[name] = bertblocks.create_model(_config(hidden, layers, heads, position, backend)).eval()
    with torch.inference_mode():
        times = _time({name: (lambda m=m: m(ids)) for name, m in models.items()}, repeats)
    print(f"\n1. position schemes, {layers} x {hidden}, batch {batch} x {length} (ms, ratio to absolute)")
    for name, ms in times.items():
        print(f"   {name:28s} {ms:8.1f}  {ms / times['absolute']:.2f}")


def mpnet(hidden: int, layers: int, heads: int, batch: int, length: int, repeats: int) -> None:
    hf_config = transformers.MPNetConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=514,
        layer_norm_eps=1e-12,
    )
    hf_config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = MPNetEncoder(hf_config).eval()
    ours = bertblocks.create_model(_config(hidden, layers, heads, "relative_bucket")).eval()
    rename = {
        "attention.attn.q.": "attention.self.query.",
        "attention.attn.k.": "attention.self.key.",
        "attention.attn.v.": "attention.self.value.",
        "attention.attn.o.": "attention.output.dense.",
        "attention.LayerNorm.": "attention.output.LayerNorm.",
    }
    state = {}
    for key, value in theirs.state_dict().items():
        for old, new in rename.items():
            key = key.replace(old, new)
        state[key] = value
    ours.encoder.load_state_dict(state)
    x = torch.randn(batch, length, hidden)
    positions = Positions.contiguous(length, 0, x.device)
    with torch.inference_mode():
        diff = (ours.encoder(x, None, positions).last_hidden_state - theirs(x, return_dict=True)[0]).abs().max()
        if diff > 1e-4:
            raise SystemExit(f"relative_bucket differs from MPNetEncoder by {diff:.3g}; not timing a wrong model")
        times = _time(
            {
                "transformers MPNetEncoder": lambda: theirs(x, return_dict=True),
                "bertblocks relative_bucket": lambda: ours.encoder(x, None, positions),
            },
            repeats,
        )
    print(f"\n2. MPNet's layer stack, {layers} x {hidden}, batch {batch} x {length}, max diff {diff:.2g}")
    for name, ms in times.items():
        print(f"   {name:28s} {ms:8.1f}")
    ratio = times["bertblocks relative_bucket"] / times["transformers MPNetEncoder"]
    print(f"   ratio bertblocks / transformers: {ratio:.2f}")


def modernbert_attention(hidden: int, heads: int, batch: int, length: int, repeats: int) -> None:
    hf_config = transformers.ModernBertConfig(
        hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=3, attention_bias=False
    )
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    theirs = ModernBertAttention(hf_config, layer_idx=0).eval()
    rotary = ModernBertRotaryEmbedding(hf_config)
    cfg = _config(hidden, 1, heads, {"name": "rope", "base": 160000.0})
    cfg["encoder"]["attention"].update({"fused_qkv": True, "qkv_bias": False, "output_bias": False})
    ours = bertblocks.create_model(cfg).eval().encoder.layer[0].attention
    with torch.no_grad():
        ours.self.Wqkv.weight.copy_(theirs.Wqkv.weight)
        ours.output.dense.weight.copy_(theirs.Wo.weight)
    x = torch.randn(batch, length, hidden)
    position_ids = torch.arange(length)[None]
    positions = Positions.contiguous(length, 0, x.device)

    def hf_call() -> object:
        return theirs(x, position_embeddings=rotary(x, position_ids, "full_attention"), attention_mask=None)

    with torch.inference_mode():
        times = _time(
            {
                "transformers ModernBertAttention": hf_call,
                "bertblocks rope attention": lambda: ours(x, mask=None, positions=positions),
            },
            repeats,
        )
    print(f"\n3. one rope attention sub-layer, hidden {hidden}, {heads} heads, batch {batch} x {length}")
    for name, ms in times.items():
        print(f"   {name:32s} {ms:8.2f}")
    ratio = times["bertblocks rope attention"] / times["transformers ModernBertAttention"]
    print(f"   ratio bertblocks / transformers: {ratio:.2f} (ours includes residual + LayerNorm)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per contender (9; --quick: 5)")
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.quick:
        hidden, layers, heads, batch, length, repeats = 256, 4, 4, 4, 128, args.repeats or 5
    else:
        hidden, layers, heads, batch, length, repeats = 768, 12, 12, 8, 256, args.repeats or 9
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    schemes(hidden, layers, heads, batch, length, repeats)
    mpnet(hidden, layers, heads, batch, length, repeats)
    modernbert_attention(hidden, heads, batch, length, repeats * 4)


if __name__ == "__main__":
    main()
