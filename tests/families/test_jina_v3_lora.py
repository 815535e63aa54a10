"""Jina-embeddings-v3's LoRA merge refuses what it cannot merge, naming it: a parametrized weight that is not 2-D, a
task chosen for weights that hold no adapters (the output would be the same for every task), and a merge whose
scaling or sum is not finite (every merged weight inf, silently)."""

from __future__ import annotations

import pytest

import bertblocks
from bertblocks.hf.weights import CheckpointError

from .test_jina_v3 import PUBLISHED, TASKS, _native_weights, _published, _save_published


def test_a_parametrized_weight_that_is_not_2d_is_a_clear_error(tmp_path):
    state = _published(_native_weights(tmp_path))
    # the embeddings' LayerNorm weight (1-D) stored as if the remote code had parametrized it
    state["roberta.emb_ln.parametrizations.weight.original"] = state.pop("roberta.emb_ln.weight")
    folder = _save_published(tmp_path, state)
    for task in (TASKS[0], "none"):
        with pytest.raises(
            CheckpointError, match=r"roberta\.emb_ln\.parametrizations\.weight\.original: .* shape \(32,\)"
        ):
            bertblocks.from_pretrained(folder, [f"hf.lora_task={task}"])


def test_a_task_chosen_for_weights_without_adapters_is_an_error(tmp_path):
    native = {f"roberta.{key}": tensor for key, tensor in _native_weights(tmp_path).items()}
    folder = _save_published(tmp_path, native)
    with pytest.raises(CheckpointError, match=r"lora_task 'retrieval\.query' was chosen, but the checkpoint holds no"):
        bertblocks.from_pretrained(folder, ["hf.lora_task=retrieval.query"])
    # no task, or `none`: the weights as they are
    assert bertblocks.from_pretrained(folder, ["hf.lora_task=none"]).config.family == "jina_embeddings_v3"
    assert bertblocks.from_pretrained(folder).config.family == "jina_embeddings_v3"


@pytest.mark.parametrize(
    ("alpha", "rank", "match"),
    [
        (1e308, 1, r"roberta\..*\.weight: merging the LoRA adapter 0 gives \d+ non-finite values"),  # the sum overflows
        (10**400, 2, r"lora_alpha 10{400} / lora_rank 2 is no finite positive scaling"),  # float() overflows
        (1e300, 1e-300, "is no finite positive scaling"),  # the quotient overflows
    ],
    ids=["sum-overflows", "alpha-overflows-float", "quotient-overflows"],
)
def test_a_merge_that_is_not_finite_is_refused_naming_the_tensor(tmp_path, alpha, rank, match):
    state = _published(_native_weights(tmp_path))
    folder = _save_published(tmp_path, state, {**PUBLISHED, "lora_alpha": alpha, "lora_rank": rank})
    with pytest.raises(CheckpointError, match=match):
        bertblocks.from_pretrained(folder, [f"hf.lora_task={TASKS[0]}"])
