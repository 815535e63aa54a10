"""Sparse prediction on BERT's masked-LM heads (``masked_lm``, ``masked_lm_gelu``): with labels, the decoder runs on
the labelled positions only. Against transformers' dense ``BertForMaskedLM`` / ``RobertaForMaskedLM`` on the same
weights: the loss and every gradient are equal, the logits are the dense logits' labelled rows; off (the default)
the output is transformers'; the option round-trips a checkpoint (no new weights); packed and compiled runs give the
same loss, one graph serving every length and label count."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from torch._dynamo.utils import counters

import bertblocks
from bertblocks.config.errors import ConfigError
from tests.conftest import TINY, TINY_HF
from tests.tolerances import assert_close, assert_grads_close

#: no dropout, so that training-mode (packed) runs compare with transformers' eval-free forward
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
SPARSE = ["head.sparse_prediction=true"]
#: transformers' class → (its config class, the bertblocks head it loads as)
CLASSES = {
    "BertForMaskedLM": ("BertConfig", "masked_lm"),
    "RobertaForMaskedLM": ("RobertaConfig", "masked_lm_gelu"),
}


def _save(cls: str, directory, **extra) -> torch.nn.Module:
    config_class, _ = CLASSES[cls]
    settings = {**TINY_HF, **NO_DROPOUT, **extra}
    if cls.startswith("Roberta"):
        settings.update(type_vocab_size=1, pad_token_id=1)
    torch.manual_seed(0)
    model = getattr(transformers, cls)(getattr(transformers, config_class)(**settings)).eval()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model.save_pretrained(directory)
    return model


def _batch(length: int = 10, seed: int = 1) -> dict[str, torch.Tensor]:
    """Two rows, the second right-padded; labels on some real tokens only (-100 elsewhere and on padding)."""
    g = torch.Generator().manual_seed(seed + length)
    ids = torch.randint(3, 99, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length // 2 :] = 0
    labels = torch.randint(0, 99, (2, length), generator=g).masked_fill(mask == 0, -100)
    labels[0, ::2] = -100
    return {"input_ids": ids.masked_fill(mask == 0, 1), "attention_mask": mask, "labels": labels}


#: RoBERTa's parameter names → ours (bertblocks' canonical names; its key map renames them in checkpoints)
ROBERTA_NAMES = (
    ("roberta.", "bert."),
    ("lm_head.bias", "cls.predictions.bias"),
    ("lm_head.dense.", "cls.predictions.transform.dense."),
    ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
)


def _our_name(name: str) -> str:
    for theirs, ours in ROBERTA_NAMES:
        if name.startswith(theirs):
            return ours + name.removeprefix(theirs)
    return name


@pytest.mark.parametrize("cls", list(CLASSES))
@pytest.mark.parametrize("packing", ["never", "always"])
def test_sparse_loss_and_gradients_equal_transformers_dense(tmp_path, cls, packing):
    reference = _save(cls, tmp_path)
    ours = bertblocks.from_pretrained(tmp_path, [*SPARSE, f"encoder.packing={packing}"], head="auto")
    assert ours.config.head.name == CLASSES[cls][1]
    ours.train()  # packing "always" packs in training; no dropout, so the numbers are eval's
    inputs = _batch()
    expected, got = reference(**inputs), ours(**inputs)
    labelled = inputs["labels"] != -100
    assert got.logits.shape == (int(labelled.sum()), 99)
    assert_close(got.logits, expected.logits[labelled], what="logits of the labelled positions")
    assert_close(got.loss, expected.loss, what="loss")
    expected.loss.backward()
    got.loss.backward()
    theirs = {n: g for n, g in ((n, p.grad) for n, p in reference.named_parameters()) if g is not None}
    mine = dict(ours.named_parameters())
    assert len(theirs) > 20
    for name, grad in theirs.items():
        assert_grads_close(mine[_our_name(name)].grad, grad, what=name)


@pytest.mark.parametrize("cls", list(CLASSES))
def test_off_by_default_and_without_labels_the_logits_are_dense(tmp_path, cls):
    reference = _save(cls, tmp_path)
    dense = bertblocks.from_pretrained(tmp_path, head="auto").eval()
    sparse = bertblocks.from_pretrained(tmp_path, SPARSE, head="auto").eval()
    assert dense.config.head.options()["sparse_prediction"] is False
    inputs = _batch()
    with torch.no_grad():
        expected = reference(**inputs)
        got = dense(**inputs)
        real = inputs["attention_mask"].bool()  # inference packs: padded positions hold zeros (documented)
        assert got.logits.shape == expected.logits.shape  # [b, q, vocab], transformers' output
        assert_close(got.logits[real], expected.logits[real])
        assert_close(got.loss, expected.loss)
        unlabelled = {k: v for k, v in inputs.items() if k != "labels"}
        assert_close(sparse(**unlabelled).logits[real], expected.logits[real])  # nothing to select: every position


def test_the_option_round_trips_a_checkpoint_without_new_weights(tmp_path):
    _save("BertForMaskedLM", tmp_path / "hf")
    ours = bertblocks.from_pretrained(tmp_path / "hf", SPARSE, head="auto").eval()
    dense_keys = set(bertblocks.from_pretrained(tmp_path / "hf", head="auto").state_dict())
    assert set(ours.state_dict()) == dense_keys  # an option, not a module
    ours.save_pretrained(tmp_path / "ours")
    again = bertblocks.from_pretrained(tmp_path / "ours", head="auto").eval()
    assert again.config.head.options()["sparse_prediction"] is True
    inputs = _batch()
    with torch.no_grad():
        a, b = ours(**inputs), again(**inputs)
    assert a.logits.shape == b.logits.shape == (int((inputs["labels"] != -100).sum()), 99)
    assert torch.equal(a.logits, b.logits)  # the same weights and kernels on the same data
    # transformers reads the saved checkpoint as its dense class (the option travels in the bertblocks block)
    _, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]


@pytest.mark.parametrize("head", ["causal_lm", "causal_lm_gelu", "pretraining"])
def test_heads_without_the_option_reject_it(head):
    """Causal LM shifts its labels along the sequence: it has no such option, and says so where."""
    with pytest.raises(ConfigError, match=r"head\.sparse_prediction: unknown field"):
        bertblocks.create_model(TINY, head={"name": head, "sparse_prediction": True})


def test_compiled_one_graph_for_every_length_and_label_count(tmp_path):
    """The labelled-position gather is traced with a symbolic count (the packing op): ten lengths, ten label
    counts, one graph; the compiled loss and gradients equal eager's."""
    _save("BertForMaskedLM", tmp_path)
    eager = bertblocks.from_pretrained(tmp_path, [*SPARSE, "encoder.packing=always"], head="auto").train()
    model = bertblocks.from_pretrained(tmp_path, [*SPARSE, "encoder.packing=always"], head="auto").train()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    counts = set()
    for length in range(5, 15):
        inputs = _batch(length)
        counts.add(int((inputs["labels"] != -100).sum()))
        want, got = eager(**inputs), compiled(**inputs)
        assert_close(got.loss, want.loss, what=f"loss at length {length}")
        want.loss.backward()
        got.loss.backward()
    assert len(counts) > 3
    assert counters["stats"]["unique_graphs"] == 1
    grads = dict(model.named_parameters())
    for name, p in eager.named_parameters():
        assert_grads_close(grads[name].grad, p.grad, what=name)
    torch._dynamo.reset()


def test_compiled_batch_without_a_label_gives_eager_loss(tmp_path):
    """A compiled batch with no label at all: the loss is eager's nan (the dense loss's), not an error."""
    _save("BertForMaskedLM", tmp_path)
    model = bertblocks.from_pretrained(tmp_path, SPARSE, head="auto").eval()
    inputs = _batch()
    inputs["labels"] = torch.full_like(inputs["labels"], -100)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    with torch.no_grad():
        assert torch.isnan(model(**inputs).loss)
        assert torch.isnan(compiled(**inputs).loss)
    torch._dynamo.reset()


def test_an_ablation_study_override_reaches_the_mlm_model(tmp_path):
    """The study's own overrides turn it on for the model its MLM runs train (no study option needed)."""
    from bertblocks.ablation.study import load_study
    from bertblocks.ablation.training import task_model

    study = tmp_path / "study.yaml"
    study.write_text(
        "base: bert-mini-uncased\noverrides:\n  head: {name: masked_lm, sparse_prediction: true}\nvariants:\n  a: {}\n",
        encoding="utf-8",
    )
    (variant,) = load_study(study).variants
    model = task_model("mlm", variant.config)
    assert model.config.head.options()["sparse_prediction"] is True
    inputs = _batch()
    labelled = int((inputs["labels"] != -100).sum())
    assert model(**inputs).logits.shape[0] == labelled
