"""Fine-tuning task models: tiny models learn toy tasks, gradient checkpointing changes no gradient, bf16
autocast on CPU runs, and a head model's parameters are the backbone's plus the head's, once each."""

from __future__ import annotations

import pytest
import torch
import transformers

import bertblocks
from tests.conftest import TINY, TINY_HF, batch
from tests.tolerances import assert_close, assert_grads_close

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "encoder": {**TINY["encoder"], "attention": {"num_heads": 4, "dropout": 0.0}}}
MASK_ID = 3


def _classification_data(seed: int = 0, n: int = 16, length: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Label 1 when token 7 occurs anywhere in the sequence, else 0 (half of each)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 99, (n, length), generator=g)
    labels = torch.arange(n) % 2
    where = torch.randint(1, length, (n,), generator=g)
    ids[labels == 1, where[labels == 1]] = 7
    return ids, labels


def _mlm_data(seed: int = 0, n: int = 16, length: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence repeats one token; a quarter of the positions are masked and must be filled in."""
    g = torch.Generator().manual_seed(seed)
    token = torch.randint(10, 99, (n, 1), generator=g)
    ids = token.expand(n, length).clone()
    masked = torch.rand(n, length, generator=g) < 0.25
    masked[:, 0] = True  # at least one target per sequence
    labels = torch.where(masked, ids, -100)
    ids[masked] = MASK_ID
    return ids, labels


def _train(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, steps: int) -> list[float]:
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(input_ids=inputs, labels=labels).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def test_sequence_classifier_learns_a_toy_task():
    torch.manual_seed(0)
    model = bertblocks.create_model({**TINY, **NO_DROPOUT}, head="sequence_classification")
    ids, labels = _classification_data()
    losses = _train(model, ids, labels, steps=30)
    assert losses[0] > 0.5  # about ln 2 at the start
    assert sum(losses[-5:]) / 5 < 0.25 * losses[0]
    model.eval()
    with torch.no_grad():
        accuracy = (model(input_ids=ids).logits.argmax(-1) == labels).float().mean().item()
    assert accuracy == 1.0


def test_masked_lm_learns_a_toy_task():
    torch.manual_seed(0)
    model = bertblocks.create_model({**TINY, **NO_DROPOUT}, head="masked_lm")
    ids, labels = _mlm_data()
    losses = _train(model, ids, labels, steps=30)
    assert losses[0] > 3.5  # about ln 99 at the start
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]
    # the tied decoder learned through the embedding table: still one parameter
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def _gradients(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(**inputs).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("cls_name", "labels"),
    [
        ("BertForSequenceClassification", torch.tensor([0, 1, 1])),
        ("BertForMaskedLM", torch.where(batch(1)["attention_mask"].bool(), batch(1)["input_ids"], -100)),
        ("BertForQuestionAnswering", None),
    ],
)
def test_gradient_checkpointing_gives_the_same_gradients(cls_name, labels):
    torch.manual_seed(1)
    model = bertblocks.create_model({**TINY, **NO_DROPOUT}, head=getattr(bertblocks, cls_name).head_name).train()
    inputs = batch(1)
    if labels is None:
        inputs.update(start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([4, 5, 3]))
    else:
        inputs["labels"] = labels
    plain = _gradients(model, inputs)
    model.gradient_checkpointing_enable()
    assert model.bert.encoder.gradient_checkpointing
    checkpointed = _gradients(model, inputs)
    assert plain.keys() == checkpointed.keys()
    assert "bert.encoder.layer.0.attention.self.query.weight" in plain
    for name in plain:
        assert_grads_close(checkpointed[name], plain[name], what=name)


@pytest.mark.parametrize("cls_name", ["BertForSequenceClassification", "BertForMaskedLM"])
def test_bf16_autocast_on_cpu_trains(cls_name):
    torch.manual_seed(2)
    model = bertblocks.create_model({**TINY, **NO_DROPOUT}, head=getattr(bertblocks, cls_name).head_name).train()
    inputs = batch(2)
    inputs["labels"] = (
        torch.tensor([0, 1, 0])
        if cls_name == "BertForSequenceClassification"
        else torch.where(inputs["attention_mask"].bool(), inputs["input_ids"], -100)
    )
    reference = model(**inputs).loss.item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**inputs)
    assert out.logits.dtype == torch.bfloat16  # the matmuls ran in bf16
    assert out.loss.dtype == torch.float32  # cross-entropy autocasts to fp32
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert abs(out.loss.item() - reference) <= 0.05 * abs(reference)


@pytest.mark.parametrize(
    "cls_name", ["BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification", "BertForQuestionAnswering"]
)
def test_parameters_are_backbone_plus_head_once_each(cls_name):
    model = bertblocks.create_model(TINY, head=getattr(bertblocks, cls_name).head_name)
    params = list(model.parameters())
    assert len(params) == len({id(p) for p in params})  # tying adds no duplicate
    hf = getattr(transformers, cls_name)(transformers.BertConfig(**TINY_HF))
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in hf.named_parameters()]
    backbone = sum(p.numel() for p in model.bert.parameters())
    head_only = {id(p) for p in params} - {id(p) for p in model.bert.parameters()}
    head = sum(p.numel() for p in params if id(p) in head_only)
    assert model.num_parameters() == backbone + head
    # train()/eval() reach the head's modules and the head object alike
    model.eval()
    assert not model.head.training
    assert all(not m.training for m in model.modules())
    model.train()
    assert model.head.training


@pytest.mark.parametrize(
    ("cls_name", "labels"),
    [
        ("BertForSequenceClassification", torch.tensor([0, 1, 1])),
        ("BertForMaskedLM", torch.where(batch(1)["attention_mask"].bool(), batch(1)["input_ids"], -100)),
    ],
)
def test_packed_training_step_gives_transformers_loss_and_gradients(hf_checkpoint, cls_name, labels):
    """`encoder.packing: always` trains on the real tokens only; loss and every gradient equal transformers'
    padded computation on the same weights."""
    directory = hf_checkpoint(cls_name, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    theirs = getattr(transformers, cls_name).from_pretrained(directory, attn_implementation="sdpa").train()
    ours = bertblocks.from_pretrained(directory, ["encoder.packing=always"], head="auto").train()
    inputs = {**batch(1), "labels": labels}
    ours.zero_grad()
    loss = ours(**inputs).loss
    loss.backward()
    expected = _gradients(theirs, inputs)
    assert_close(loss, theirs(**inputs).loss, what="loss")
    grads = {name: p.grad for name, p in ours.named_parameters() if p.grad is not None}
    assert "bert.encoder.layer.0.attention.self.query.weight" in grads
    for name, grad in grads.items():
        assert_grads_close(grad, expected[name], what=name)
    # the dense layers saw the real tokens only: a hook on the feed-forward input counts them
    seen = []
    ours.bert.encoder.layer[0].intermediate.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape))
    ours(**inputs).loss.backward()
    assert seen == [torch.Size([1, int(inputs["attention_mask"].sum()), 32])]
