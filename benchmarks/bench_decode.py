"""Decoding cost with and without the KV cache, and bertblocks' generate vs transformers' generate.

Both models share the same random weights (saved by transformers, loaded by bertblocks), bert-base shape
in decoder mode (is_decoder, no cross-attention), fp32, eval, inference mode.

1. Per-token latency as the sequence grows: with the cache, one step after ``L - 1`` cached tokens; without,
   a full forward over ``L`` tokens (what decoding without a cache costs per new token).
2. Greedy generation of ``--new`` tokens after a ``--prompt``-token prompt: bertblocks' ``generate`` vs
   transformers' ``generate``, same weights, same tokens checked; the ratio ours / theirs.
3. Every family with a causal head (``--families``: BERT, RoBERTa, ELECTRA, ERNIE): transformers saves its
   causal LM (width 256, 4 layers), bertblocks loads it (``head="auto"``); the cached one-token step at
   each length for both, its growth from the shortest to the longest length, and the ratio ours / theirs.

Usage:
    python benchmarks/bench_decode.py            # bert-base shape, lengths 32..512
    python benchmarks/bench_decode.py --quick    # small shape, for a smoke run
    python benchmarks/bench_decode.py --families roberta --skip-bert   # one family's rows only
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
from bertblocks.models.generation import generate


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
    parser.add_argument(
        "--families", default=",".join(CAUSAL_FAMILIES), help=f"comma-separated, of {list(CAUSAL_FAMILIES)}"
    )
    parser.add_argument("--skip-bert", action="store_true", help="only the per-family rows")
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if not args.skip_bert:
        _bert(args)
    for family in filter(None, args.families.split(",")):
        _family_steps(family.strip(), args, repeats=max(args.repeats, 15))


def _bert(args: argparse.Namespace) -> None:
    """Sections 1 and 2 (and the framework-overhead comparison) on BERT's ``BertLMHeadModel``."""
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


#: families with a causal head: transformers' config and causal-LM class names, extra config
CAUSAL_FAMILIES: dict[str, tuple[str, str, dict[str, int]]] = {
    "bert": ("BertConfig", "BertLMHeadModel", {}),
    "roberta": ("RobertaConfig", "RobertaForCausalLM", {"pad_token_id": 1, "max_position_embeddings": 514}),
    "electra": ("ElectraConfig", "ElectraForCausalLM", {"embedding_size": 128}),
    "ernie": ("ErnieConfig", "ErnieForCausalLM", {}),
}


def _family_steps(family: str, args: argparse.Namespace, repeats: int) -> None:
    """A family's cached one-token step as the sequence grows, bertblocks against transformers' causal LM."""
    config_name, class_name, extra = CAUSAL_FAMILIES[family]
    shape = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}
    lengths = [32, 64, 128] if args.quick else [32, 128, 512]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(vocab_size=30522, is_decoder=True, **shape, **extra)
    with tempfile.TemporaryDirectory() as tmp:
        getattr(transformers, class_name)(config).eval().save_pretrained(tmp)
        theirs = getattr(transformers, class_name).from_pretrained(tmp, attn_implementation="sdpa").eval()
        ours = bertblocks.from_pretrained(tmp, head="auto").eval()
    ids = torch.randint(1000, 30000, (1, max(lengths)))
    print(f"\n{family}: {class_name} {shape}, cached one-token step (ms), bertblocks vs transformers")
    print(f"{'length':>7} {'bertblocks':>11} {'transformers':>13} {'ratio':>6}")
    steps: dict[str, list[float]] = {"bertblocks": [], "transformers": []}
    with torch.inference_mode():
        for length in lengths:
            fns, logits = {}, []
            for name, model in (("bertblocks", ours), ("transformers", theirs)):
                prefix = model(input_ids=ids[:, : length - 1], use_cache=True).past_key_values

                def step(model=model, prefix=prefix, length=length):
                    out = model(input_ids=ids[:, length - 1 : length], past_key_values=prefix, use_cache=True)
                    # undo the step so every repeat measures the same one (transformers' crop takes a count to drop)
                    prefix.crop(length - 1 if model is ours else -1)
                    return out

                logits.append(step().logits)  # also the warm-up
                fns[name] = step
            assert (logits[0] - logits[1]).abs().max() <= 1e-4, f"{family}: cached step logits differ"
            times: dict[str, list[float]] = {name: [] for name in fns}
            for r in range(repeats):  # alternate, rotating the order, so machine noise hits both alike
                for name in list(fns)[r % 2 :] + list(fns)[: r % 2]:
                    start = time.perf_counter()
                    fns[name]()
                    times[name].append((time.perf_counter() - start) * 1e3)
            for name, ts in times.items():
                steps[name].append(statistics.median(ts))
            ours_ms, theirs_ms = steps["bertblocks"][-1], steps["transformers"][-1]
            print(f"{length:>7} {ours_ms:>11.2f} {theirs_ms:>13.2f} {ours_ms / theirs_ms:>6.2f}")
    growth = {name: ms[-1] / ms[0] for name, ms in steps.items()}
    print(
        f"  step at {lengths[-1]} / step at {lengths[0]}: bertblocks {growth['bertblocks']:.2f}x, "
        f"transformers {growth['transformers']:.2f}x"
    )


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
