"""Decoding cost with and without the KV cache, and bertblocks' generate vs transformers' generate.

Both models share the same random weights (saved by transformers, loaded by bertblocks), bert-base shape
in decoder mode (is_decoder, no cross-attention), fp32, eval, inference mode.

1. Per-token latency as the sequence grows: with the cache, one step after ``L - 1`` cached tokens; without,
   a full forward over ``L`` tokens (what decoding without a cache costs per new token).
2. Greedy generation of ``--new`` tokens after a ``--prompt``-token prompt: bertblocks' ``generate`` vs
   transformers' ``generate``, same weights, same tokens checked; the ratio ours / theirs.

Usage:
    python benchmarks/bench_decode.py            # bert-base shape, lengths 32..512
    python benchmarks/bench_decode.py --quick    # small shape, for a smoke run
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time

import torch
import transformers

import bertblocks
from bertblocks.generation import generate


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small model and lengths (smoke run)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)

    if args.quick:
        shape = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
        lengths = [32, 64, 128]
    else:
        shape = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
        lengths = [32, 64, 128, 256, 512]
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, is_decoder=True, **shape)
    with tempfile.TemporaryDirectory() as tmp:
        transformers.BertLMHeadModel(config).eval().save_pretrained(tmp)
        theirs = transformers.BertLMHeadModel.from_pretrained(tmp, attn_implementation="sdpa").eval()
        ours = bertblocks.BertLMHeadModel.from_pretrained(tmp).eval()

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    print(f"shape: {shape}, fp32, batch 1\n")
    print("per-token latency (ms) as the sequence grows")
    print(f"{'length':>7} {'cached step':>12} {'no cache (full)':>16} {'ratio':>7}")
    ids = torch.randint(1000, 30000, (1, max(lengths)))
    with torch.inference_mode():
        for length in lengths:
            prefix = ours(input_ids=ids[:, : length - 1], use_cache=True).past_key_values

            def cached_step(prefix=prefix, length=length):
                cache = prefix
                out = ours(input_ids=ids[:, length - 1 : length], past_key_values=cache, use_cache=True)
                cache.crop(length - 1)  # undo the step so every repeat measures the same one
                return out

            def full(length=length):
                return ours(input_ids=ids[:, :length], use_cache=False)

            step_ms = _median_ms(cached_step, args.repeats)
            full_ms = _median_ms(full, max(2, args.repeats // 2))
            print(f"{length:>7} {step_ms:>12.2f} {full_ms:>16.2f} {full_ms / step_ms:>6.1f}x")

        prompt = ids[:, : args.prompt]
        mine = generate(ours, prompt, max_new_tokens=args.new)
        reference = theirs.generate(prompt, max_new_tokens=args.new, do_sample=False, pad_token_id=0)
        assert torch.equal(mine, reference), "generated tokens differ"
        ours_ms, theirs_ms = [], []
        for _ in range(max(3, args.repeats // 2)):  # alternate, so machine noise hits both alike
            start = time.perf_counter()
            generate(ours, prompt, max_new_tokens=args.new)
            ours_ms.append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            theirs.generate(prompt, max_new_tokens=args.new, do_sample=False, pad_token_id=0)
            theirs_ms.append((time.perf_counter() - start) * 1e3)
    o, t = statistics.median(ours_ms), statistics.median(theirs_ms)
    print(f"\ngreedy generate, prompt {args.prompt}, {args.new} new tokens (same tokens: yes)")
    print(f"  bertblocks   {o:9.1f} ms  ({o / args.new:.2f} ms/token)")
    print(f"  transformers {t:9.1f} ms  ({t / args.new:.2f} ms/token)")
    print(f"  ratio bertblocks / transformers = {o / t:.2f}")
    _framework_overhead(args)


def _framework_overhead(args: argparse.Namespace) -> None:
    """The same comparison on a model so small (12 layers of width 64) that per-step framework work, not
    the matmuls, is most of the cost."""
    torch.manual_seed(0)
    shape = {"hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 4, "intermediate_size": 128}
    config = transformers.BertConfig(vocab_size=1000, is_decoder=True, **shape)
    with tempfile.TemporaryDirectory() as tmp:
        transformers.BertLMHeadModel(config).eval().save_pretrained(tmp)
        theirs = transformers.BertLMHeadModel.from_pretrained(tmp, attn_implementation="sdpa").eval()
        ours = bertblocks.BertLMHeadModel.from_pretrained(tmp).eval()
    prompt = torch.randint(1, 1000, (1, args.prompt))
    with torch.inference_mode():
        mine = generate(ours, prompt, max_new_tokens=args.new)
        assert torch.equal(mine, theirs.generate(prompt, max_new_tokens=args.new, do_sample=False, pad_token_id=0))
        ours_ms, theirs_ms = [], []
        for _ in range(max(5, args.repeats)):
            start = time.perf_counter()
            generate(ours, prompt, max_new_tokens=args.new)
            ours_ms.append((time.perf_counter() - start) * 1e3 / args.new)
            start = time.perf_counter()
            theirs.generate(prompt, max_new_tokens=args.new, do_sample=False, pad_token_id=0)
            theirs_ms.append((time.perf_counter() - start) * 1e3 / args.new)
    o, t = statistics.median(ours_ms), statistics.median(theirs_ms)
    print(f"\nframework overhead: {shape}, greedy, same tokens: yes")
    print(f"  bertblocks {o:.2f} ms/token, transformers {t:.2f} ms/token, ratio {o / t:.2f}")


if __name__ == "__main__":
    main()
