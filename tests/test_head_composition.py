"""Task heads as compositions: every built-in head is a :class:`ComposedHead`, a head keeps no per-call state
(interleaved batches give what each gives alone), pooling survives an all-padding row, and one masked mean
serves the poolers, the heads and sentence embeddings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import bertblocks
import bertblocks.sentence
from bertblocks.core.component import Component
from bertblocks.core.interfaces import Head
from bertblocks.core.outputs import ModelOutputWithPooling, SequenceClassifierOutput
from bertblocks.plugins.heads import HEAD_PLUGINS
from bertblocks.plugins.heads import pooling as head_pooling
from bertblocks.plugins.heads.composition import ComposedHead
from bertblocks.plugins.heads.pooling import POOLINGS, pool
from bertblocks.plugins.heads.transforms import Steps
from bertblocks.plugins.poolers import MeanPooler, masked_mean
from bertblocks.registry import Registry, set_registry
from tests.conftest import TINY
from tests.tolerances import assert_close

BUILTIN_HEADS = sorted(c.name for plugin in HEAD_PLUGINS for c in plugin.bertblocks_register_components())
#: heads without a loss (retrieval heads, trained outside the model): no labels
NO_LABELS = ("splade", "colbert", "bge_m3")
#: heads whose outputs are not one tensor per branch (a multi-vector output and its mask; BGE-M3's lexical
#: weights read input_ids): plain Head subclasses, in bertblocks/plugins/heads/retrieval.py
NOT_COMPOSED = ("colbert", "bge_m3")

#: head configs that read the attention mask (pooling or loss), besides every head with its defaults
MASK_READERS = [
    {"name": "transform_classification", "pooling": "mean"},
    {"name": "transform_classification", "pooling": "first_real"},
    {"name": "transform_multiple_choice", "pooling": "mean"},
    {"name": "transform_masked_lm", "sparse_prediction": True},
    {"name": "dense_pooled_classification", "pooling": "mean"},
    {"name": "dense_pooled_classification", "pooling": "late"},
]


def _config(head: dict) -> dict:
    name = head["name"]
    config = {**TINY, "head": head, "num_labels": 3}
    if "question_answering" in name or "multiple_choice" in name:
        config["num_labels"] = 2
    if "causal_lm" in name:
        config["is_decoder"] = True
    return config


def _batch(seed: int, b: int, length: int, choices: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, length, dtype=torch.long)
    mask[1, -2:] = 0  # right padding
    mask[-1, :3] = 0  # left padding
    inputs = {"input_ids": torch.randint(1, 99, (b, length), generator=g), "attention_mask": mask}
    if choices:  # [b, 2, q]: the second choice is the batch rolled by one
        inputs = {k: torch.stack([v, v.roll(1, 0)], dim=1) for k, v in inputs.items()}
    return inputs


def _labels(name: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if name in NO_LABELS:
        return {}
    b = inputs["input_ids"].shape[0]
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    tokens = torch.where(mask.bool(), ids, -100)
    per_example = torch.arange(b) % 2
    if name.endswith("_lm") or name in ("masked_lm_gelu", "causal_lm_gelu", "causal_lm_linear"):
        return {"labels": tokens}
    if name == "pretraining":
        return {"labels": tokens, "next_sentence_label": per_example}
    if name == "sentence_order_pretraining":
        return {"labels": tokens, "sentence_order_label": per_example}
    if "question_answering" in name:
        return {"start_positions": per_example + 1, "end_positions": per_example + 2}
    if "token_classification" in name:
        return {"labels": torch.where(mask.bool(), ids % 3, -100)}
    if name == "replaced_token_detection":
        return {"labels": ids % 2}
    return {"labels": per_example}  # classification (3 labels), next sentence and multiple choice (2)


def _tensors(out) -> dict[str, torch.Tensor]:
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def test_every_builtin_head_is_a_composition():
    assert len(BUILTIN_HEADS) == 27
    for name in (n for n in BUILTIN_HEADS if n not in NOT_COMPOSED):
        model = bertblocks.create_model(_config({"name": name}))
        assert isinstance(model.head, ComposedHead), name
        assert model.head.branches, name
        for branch in model.head.branches:
            assert branch.pooling in POOLINGS
            for module in branch.modules:  # every step names a module the task model adopted (a checkpoint key)
                assert model.get_submodule(module) is model.head.get_submodule(module)


@pytest.mark.parametrize("head", [{"name": n} for n in BUILTIN_HEADS] + MASK_READERS, ids=str)
def test_interleaved_batches_give_what_each_gives_alone(head):
    """Batch B runs whole (prepare_inputs, backbone, head) while batch A is between its prepare_inputs and its
    head: a head that kept per-call state (the mask) would hand A's head B's state, or none."""
    torch.manual_seed(0)
    model = bertblocks.create_model(_config(head)).eval()
    choices = "multiple_choice" in head["name"]
    a, b = _batch(1, 3, 9, choices), _batch(2, 4, 7, choices)
    a, b = {**a, **_labels(head["name"], a)}, {**b, **_labels(head["name"], b)}
    with torch.no_grad():
        alone_a, alone_b = model(**a), model(**b)
        nested: dict[str, object] = {}

        def run_b_inside_a(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            if not nested:
                nested["running"] = True
                nested["b"] = model(**b)

        handle = model.bert.register_forward_hook(run_b_inside_a, with_kwargs=True)
        try:
            inter_a = model(**a)
        finally:
            handle.remove()
    for got, want in ((inter_a, alone_a), (nested["b"], alone_b)):
        got, want = _tensors(got), _tensors(want)
        assert got.keys() == want.keys()
        assert ("loss" in got) == (head["name"] not in NO_LABELS)
        for field, value in got.items():
            assert torch.equal(value, want[field]), field


def test_an_all_padding_row_pools_to_zeros_not_nan():
    hidden = torch.randn(2, 5, 4)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    mean = masked_mean(hidden, mask)
    assert torch.isfinite(mean).all()
    assert torch.equal(mean[1], torch.zeros(4))
    assert torch.allclose(mean[0], hidden[0, :2].mean(dim=0))
    assert torch.equal(MeanPooler()(hidden, mask), mean)
    output = ModelOutputWithPooling(last_hidden_state=hidden)
    for pooling in ("mean", "first", "first_real", "last"):
        assert torch.isfinite(pool(output, mask, pooling)).all(), pooling
    # a head pooling by the mean: finite logits and loss for the empty row too
    model = bertblocks.create_model(_config({"name": "transform_classification", "pooling": "mean"}))
    out = model.head(output.__class__(last_hidden_state=torch.randn(2, 5, 32)), {}, (2,), attention_mask=mask)
    assert torch.isfinite(out.logits).all()


def test_one_masked_mean_serves_poolers_heads_and_sentence_embeddings():
    assert head_pooling.masked_mean is masked_mean
    assert bertblocks.sentence.masked_mean is masked_mean
    hidden, mask = torch.randn(3, 6, 4), torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [0] * 2 + [1] * 4])
    want = torch.stack([hidden[0].mean(0), hidden[1, :4].mean(0), hidden[2, 2:].mean(0)])
    assert_close(masked_mean(hidden, mask), want)  # a masked sum over all rows vs a mean over the real ones
    assert torch.equal(pool(ModelOutputWithPooling(last_hidden_state=hidden), mask, "mean"), masked_mean(hidden, mask))
    # the pooler reads the last q columns of a mask that covers cached positions, and reduces a 3-D mask
    cached = torch.cat([torch.ones(3, 2, dtype=torch.long), mask], dim=1)
    assert torch.equal(MeanPooler()(hidden, cached), masked_mean(hidden, mask))
    square = mask[:, None, :] * mask[:, :, None]  # [b, q, k]
    assert torch.equal(MeanPooler()(hidden, square), masked_mean(hidden, mask))


def test_poolings_pick_the_positions_they_name():
    hidden = torch.arange(2 * 4, dtype=torch.float).view(2, 4, 1)  # the value is the flat position
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 1, 1]])  # right padding, left padding
    output = ModelOutputWithPooling(last_hidden_state=hidden, pooler_output=torch.ones(2, 1))
    assert pool(output, mask, "first").flatten().tolist() == [0, 4]
    assert pool(output, mask, "first_real").flatten().tolist() == [0, 6]
    assert pool(output, mask, "last").flatten().tolist() == [2, 7]
    assert pool(output, mask, "mean").flatten().tolist() == [1, 6.5]
    assert pool(output, None, "last").flatten().tolist() == [3, 7]
    assert pool(output, mask, "none") is hidden
    assert pool(output, mask, "pooler") is output.pooler_output
    with pytest.raises(ValueError, match="reads the pooled output, but the backbone returned none"):
        pool(ModelOutputWithPooling(last_hidden_state=hidden), mask, "pooler")


def test_steps_run_in_order_and_a_repeated_name_runs_twice():
    scale = nn.Linear(1, 1, bias=False)
    nn.init.constant_(scale.weight, 2.0)
    steps = Steps(("scale", scale), ("plus", _PlusOne()), ("scale", scale))
    assert [name for name, _ in steps.named_children()] == ["scale", "plus"]
    assert steps(torch.ones(1, 1)).item() == 6.0  # (1·2 + 1)·2
    with pytest.raises(ValueError, match="two different modules named 'scale'"):
        Steps(("scale", scale), ("scale", nn.Linear(1, 1)))


class _PlusOne(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class _MaskRecordingHead(Head):
    """A plugin head that pools with the mask it is given, and keeps the last one for the test to read."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.score = nn.Linear(hidden_size, 1)
        self.seen: list[torch.Tensor | None] = []

    def forward(self, output, labels, batch_shape, *, attention_mask):
        self.seen.append(attention_mask)
        return SequenceClassifierOutput(logits=self.score(masked_mean(output.last_hidden_state, attention_mask)))


class _Plugin:
    @staticmethod
    def bertblocks_register_components():
        return [Component("head", "mask_recording", lambda *, hidden_size, **_: _MaskRecordingHead(hidden_size))]


def test_a_plugin_head_receives_the_attention_mask():
    registry = Registry(load_entry_points=False)
    registry.register(_Plugin(), name="mask-head")
    set_registry(registry)
    model = bertblocks.create_model({**TINY, "head": "mask_recording"}).eval()
    inputs = _batch(3, 3, 9, choices=False)
    with torch.no_grad():
        model(**inputs)
        model(input_ids=inputs["input_ids"])
    assert torch.equal(model.head.seen[0], inputs["attention_mask"])
    assert model.head.seen[1] is None


class _DefaultingHead(_MaskRecordingHead):
    """A plugin head with an input of its own (``weights``) and defaults: its ``weights`` from the ids, then the
    token types from its ``weights`` (a later default reads an earlier one); the global tokens of an attention this
    model lacks, which must never be made."""

    extra_inputs = ("weights",)

    def __init__(self, hidden_size: int) -> None:
        super().__init__(hidden_size)
        self.made: list[str] = []
        self.input_defaults = {
            "weights": self._weights,
            "token_type_ids": self._types,
            "global_attention_mask": self._never,
        }

    def _weights(self, inputs, config):
        self.made.append("weights")
        return None if inputs["input_ids"] is None else (inputs["input_ids"] % 2).float()

    def _types(self, inputs, config):
        self.made.append("token_type_ids")
        return None if inputs["weights"] is None else inputs["weights"].long()

    def _never(self, inputs, config):
        raise AssertionError("a default for an input the model does not take")

    def forward(self, output, labels, batch_shape, *, attention_mask, weights=None):
        self.seen.append(weights)
        return SequenceClassifierOutput(logits=self.score(output.last_hidden_state[:, 0]))


class _DefaultingPlugin:
    @staticmethod
    def bertblocks_register_components():
        return [Component("head", "defaulting", lambda *, hidden_size, **_: _DefaultingHead(hidden_size))]


def test_a_plugin_head_makes_inputs_a_call_leaves_out_and_reads_its_own():
    """The input-default hook (``Head.input_defaults``): applied in order to the inputs the call leaves out, never to
    one given, never for an input the model does not take; the head's own input reaches its forward."""
    registry = Registry(load_entry_points=False)
    registry.register(_DefaultingPlugin(), name="defaulting-head")
    set_registry(registry)
    model = bertblocks.create_model({**TINY, "head": "defaulting"}).eval()
    ids = _batch(3, 3, 9, choices=False)["input_ids"]
    types = (ids % 2).long()
    with torch.no_grad():
        defaulted = model(input_ids=ids).logits
        assert torch.equal(model.head.seen[-1], (ids % 2).float())
        assert model.head.made == ["weights", "token_type_ids"]
        assert torch.equal(defaulted, model(input_ids=ids, token_type_ids=types).logits)  # the default was used
        given = torch.ones_like(ids, dtype=torch.float)
        model(input_ids=ids, weights=given, token_type_ids=torch.zeros_like(ids))
        assert model.head.seen[-1] is given
        assert model.head.made == ["weights", "token_type_ids", "weights"]  # nothing made for what was given


# ----------------------------------------------------------------------------- the how-to's plugin heads
HOW_TO = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "task-heads.md"


def _how_to_heads() -> list[dict]:
    """The namespaces of the Python examples of the how-to's "Write your own head" section, run."""
    section = HOW_TO.read_text(encoding="utf-8").split("## Write your own head", 1)[1]
    namespaces = []
    for code in re.findall(r"^```python\n(.*?)^```", section, re.S | re.M):
        namespace: dict = {"__name__": "how_to_head"}
        exec(compile(code, str(HOW_TO), "exec"), namespace)
        namespaces.append(namespace)
    return namespaces


def test_the_how_to_heads_build_train_and_agree():
    composed, written = _how_to_heads()
    models = []
    for i, namespace in enumerate((composed, written)):
        plugin = type(
            "Plugin", (), {"bertblocks_register_components": staticmethod(namespace["bertblocks_register_components"])}
        )
        registry = Registry(load_entry_points=False)
        registry.register(plugin(), name=f"how-to-{i}")
        set_registry(registry)
        torch.manual_seed(0)
        models.append(bertblocks.create_model({**TINY, "head": "mean_regression"}).eval())
    ours, theirs = models
    assert [k for k in ours.state_dict() if not k.startswith("bert.")] == ["regressor.weight", "regressor.bias"]
    theirs.load_state_dict(ours.state_dict())
    inputs = _batch(4, 3, 9, choices=False)
    target = torch.tensor([0.1, -0.2, 0.3])
    a, b = ours(**inputs, labels=target), theirs(**inputs, labels=target)
    assert_close(a.logits, b.logits, what="logits")  # the composition is the hand-written head
    assert_close(a.loss, b.loss, what="loss")
    a.loss.backward()
    assert ours.regressor.weight.grad is not None
