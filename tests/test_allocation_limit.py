"""Size from the model, not from a formula: before anything is allocated, the builder measures the model the config
describes on the meta device (:func:`bertblocks.registry.builder.measure_allocation`) and refuses one whose
parameters and buffers exceed the parameter limit. Tables sized by buckets, kernels or positions are counted, and so
is whatever a third-party component registers; the refused tensors are only ever made on the meta device."""

from __future__ import annotations

import json
import resource
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import TINY
from torch import nn

import bertblocks
from bertblocks.cli import main
from bertblocks.config.limits import MAX_PARAMETERS_ENV, LimitError, estimate_size
from bertblocks.core.component import Component
from bertblocks.core.interfaces import Pooler
from bertblocks.hf.config_json import config_from_hf
from bertblocks.registry import Registry, set_registry
from bertblocks.registry.builder import measure_allocation

#: a small DeBERTa-v2 config.json; each finding adds one field
DEBERTA: dict[str, Any] = {
    "model_type": "deberta-v2",
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "relative_attention": True,
    "pos_att_type": ["p2c", "c2p"],
}
BOMBS = {
    "position_buckets": ({"position_buckets": 10**9}, "rel_embeddings.weight [2000000000, 32]"),
    "max_relative_positions": ({"max_relative_positions": 10**9}, "rel_embeddings.weight [2000000000, 32]"),
    "conv_kernel_size": ({"conv_kernel_size": 10**7 + 1}, "conv.weight [32, 32, 10000001]"),
}


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_deberta_size_bomb_is_refused_before_allocation(bomb):
    fields, largest = BOMBS[bomb]
    config = bertblocks.load_config(config_from_hf({**DEBERTA, **fields}))
    # the formula misses these tables: it is the model that says how big it is
    assert estimate_size(config).parameters < 10**6
    before = _max_rss_mib()
    with pytest.raises(LimitError, match="the model would be too big") as refused:
        bertblocks.create_model(config)
    assert largest in str(refused.value)
    assert MAX_PARAMETERS_ENV in str(refused.value)
    assert _max_rss_mib() - before < 256  # the table would be 40 to 476 GiB


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_trace_refuses_a_size_bomb_as_an_input_error_not_a_bug(bomb, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**DEBERTA, **BOMBS[bomb][0]}))
    code = main(["trace", str(tmp_path / "config.json"), "--text", "hello"])
    assert code == 1
    assert "the model would be too big" in capsys.readouterr().err


def test_a_model_under_the_limit_builds_as_before(monkeypatch):
    config = bertblocks.load_config(config_from_hf({**DEBERTA, "position_buckets": 8}))
    model = bertblocks.create_model(config)
    held = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    monkeypatch.setenv(MAX_PARAMETERS_ENV, str(held))  # exactly at the limit: allowed
    bertblocks.create_model(config)
    monkeypatch.setenv(MAX_PARAMETERS_ENV, str(held - 1))
    with pytest.raises(LimitError):
        bertblocks.create_model(config)


@pytest.mark.parametrize(
    "config",
    [
        {**TINY, "head": "masked_lm"},  # the decoder tied to the embeddings: counted once
        {**TINY, "head": "masked_lm", "tie_word_embeddings": False},
        {**TINY, "head": "sequence_classification", "num_labels": 5},
        {**TINY, "position": "relative_key"},
    ],
    ids=["tied-mlm", "untied-mlm", "classifier", "relative-key"],
)
def test_the_measure_is_what_the_model_holds(config):
    config = bertblocks.load_config(config)
    model = bertblocks.create_model(config)
    held = {id(t): t.numel() for t in (*model.parameters(), *model.buffers())}
    assert measure_allocation(config) == sum(held.values())


def test_the_measure_of_each_deberta_table_is_what_the_model_holds():
    config = bertblocks.load_config(config_from_hf({**DEBERTA, "position_buckets": 16, "conv_kernel_size": 3}))
    model = bertblocks.create_model(config)
    assert measure_allocation(config) == sum(
        {id(t): t.numel() for t in (*model.parameters(), *model.buffers())}.values()
    )


# ------------------------------------------------------------------- a third-party component with a huge buffer
#: where the planted components made their huge tensor (a real device would mean it was allocated)
MADE_ON: list[torch.device] = []
HUGE = 10**10  # 40 GB in float32


class HugePooler(Pooler):
    """A plugin's pooler that keeps a lookup table far past the limit (a buffer, not a parameter)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.register_buffer("table", torch.empty(HUGE))
        MADE_ON.append(self.table.device)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.dense(hidden_states[:, 0])


def _huge_registry() -> Registry:
    registry = Registry(load_entry_points=False)
    plugin = SimpleNamespace(
        bertblocks_register_components=lambda: [
            Component("pooler", "huge", lambda *, hidden_size, options: HugePooler(hidden_size)),
        ]
    )
    registry.register(plugin, name="huge-plugin")
    set_registry(registry)
    return registry


def test_a_third_party_component_with_a_huge_buffer_is_refused_before_allocation():
    MADE_ON.clear()
    _huge_registry()
    before = _max_rss_mib()
    with pytest.raises(LimitError, match=r"HugePooler\.table \[10000000000\]"):
        bertblocks.create_model({**TINY, "pooler": "huge"})
    assert [torch.device("meta")] == MADE_ON  # measured, never built for real
    assert _max_rss_mib() - before < 256
    # a task model builds its head first: the whole model is measured before that too
    MADE_ON.clear()
    with pytest.raises(LimitError, match=r"HugePooler\.table"):
        bertblocks.create_model({**TINY, "pooler": "huge", "head": "sequence_classification"})
    assert [torch.device("meta")] == MADE_ON


def test_a_third_party_head_with_a_huge_buffer_is_refused_before_allocation():
    MADE_ON.clear()

    class HugeHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.empty(HUGE))
            MADE_ON.append(self.table.device)

    registry = Registry(load_entry_points=False)
    base = registry.get("head", "sequence_classification")

    def factory(**kwargs: Any) -> Any:
        head = base.factory(**kwargs)
        head.extra = HugeHead()  # a child module the task model adopts
        return head

    registry.register(
        SimpleNamespace(bertblocks_register_components=lambda: [Component("head", "huge_head", factory, base.options)]),
        name="huge-head-plugin",
    )
    set_registry(registry)
    with pytest.raises(LimitError, match=r"table \[10000000000\]"):
        bertblocks.create_model({**TINY, "head": "huge_head"})
    assert [torch.device("meta")] == MADE_ON


def test_loading_a_checkpoint_measures_the_model_too(tmp_path):
    # from_pretrained builds with its parameters on meta, but buffers are real: it goes through the same measure
    folder = tmp_path / "bomb"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**DEBERTA, "max_relative_positions": 10**9}))
    with pytest.raises(LimitError, match="the model would be too big"):
        bertblocks.from_pretrained(folder)


class ReadingPooler(Pooler):
    """A plugin's pooler that reads values back while it is built (``tolist()``: impossible on the meta device),
    then keeps a huge table."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.scales = torch.arange(4).tolist()  # needs data: the measure falls back to guarding the real build
        self.register_buffer("table", torch.empty(HUGE))
        MADE_ON.append(self.table.device)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return hidden_states[:, 0]


def test_a_component_that_cannot_be_built_on_meta_is_guarded_tensor_by_tensor():
    MADE_ON.clear()
    registry = Registry(load_entry_points=False)
    plugin = SimpleNamespace(
        bertblocks_register_components=lambda: [
            Component("pooler", "reading", lambda *, hidden_size, options: ReadingPooler(hidden_size)),
        ]
    )
    registry.register(plugin, name="reading-plugin")
    set_registry(registry)
    before = _max_rss_mib()
    with pytest.raises(LimitError, match=r"empty \[10000000000\]"):
        bertblocks.create_model({**TINY, "pooler": "reading"})
    assert MADE_ON == []  # refused before its table was allocated (the meta attempt failed before it, too)
    assert _max_rss_mib() - before < 256
    # the same component with a table of a sensible size builds (guarded, not refused)
    global HUGE
    HUGE, saved = 1000, HUGE
    try:
        model = bertblocks.create_model({**TINY, "pooler": "reading"})
    finally:
        HUGE = saved
    assert model.pooler.table.device == torch.device("cpu")
    assert model.pooler.scales == [0, 1, 2, 3]
