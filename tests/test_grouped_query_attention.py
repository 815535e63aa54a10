"""Grouped-query attention (``encoder.attention.num_kv_heads``): a model with ``kv`` key/value heads computes what
the multi-head model computes whose key/value heads are each one of those repeated for its ``h / kv`` consecutive
query heads; the cache holds the ``kv`` heads and cached decoding equals one pass; what it cannot be combined with
is refused at build time, naming the option."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import bertblocks
from tests.tolerances import assert_close


def _config(kv: int | None, **extra: Any) -> dict[str, Any]:
    attention: dict[str, Any] = {"num_heads": 4, "backend": "eager"}
    if kv is not None:
        attention["num_kv_heads"] = kv
    return {
        "vocab_size": 99,
        "hidden_size": 32,
        "max_position_embeddings": 64,
        "hidden_dropout_prob": 0.0,
        "position": {"name": "rope", "base": 50.0},
        "encoder": {"num_layers": 2, "attention": attention, "feedforward": {"intermediate_size": 37}},
        **extra,
    }


@pytest.mark.parametrize("kv", [1, 2])
def test_grouped_heads_equal_multi_head_attention_with_repeated_key_value_heads(kv):
    torch.manual_seed(0)
    grouped = bertblocks.create_model(_config(kv)).eval()
    full = bertblocks.create_model(_config(None)).eval()
    state = {}
    d = 8
    for key, tensor in grouped.state_dict().items():
        if ".attention.self.key." in key or ".attention.self.value." in key:
            # kv heads of d rows each → each repeated for 4 / kv consecutive query heads
            tensor = tensor.reshape(kv, d, *tensor.shape[1:]).repeat_interleave(4 // kv, dim=0).flatten(0, 1)
        state[key] = tensor
    full.load_state_dict(state)
    ids = torch.randint(3, 99, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        expected = full(input_ids=ids, attention_mask=mask).last_hidden_state
        got = grouped(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close(got, expected, what="grouped vs repeated heads")
    assert grouped.encoder.layer[0].attention.self.key.weight.shape == (kv * d, 32)


def test_cached_decoding_with_grouped_heads_equals_one_pass():
    torch.manual_seed(0)
    model = bertblocks.create_model(_config(2, is_decoder=True)).eval()
    ids = torch.randint(3, 99, (2, 8))
    with torch.no_grad():
        whole = model(input_ids=ids).last_hidden_state
        first = model(input_ids=ids[:, :5], use_cache=True)
        cache = first.past_key_values
        rest = model(input_ids=ids[:, 5:], past_key_values=cache, use_cache=True)
    assert cache.layer(0)[0].shape[1] == 2  # the cache holds the key/value heads only
    assert_close(torch.cat([first.last_hidden_state, rest.last_hidden_state], dim=1), whole, what="cached vs one pass")


@pytest.mark.parametrize(
    ("attention", "message"),
    [
        ({"num_heads": 4, "num_kv_heads": 3}, "num_kv_heads 3 must divide num_heads 4"),
        ({"num_heads": 4, "num_kv_heads": 2, "fused_qkv": True}, "needs fused_qkv: false"),
        ({"num_heads": 4, "qkv_layout": "heads"}, "set fused_qkv: true"),
    ],
)
def test_what_grouped_heads_cannot_do_is_refused_naming_the_option(attention, message):
    config = _config(None)
    config["encoder"]["attention"] = attention
    with pytest.raises(ValueError, match=message):
        bertblocks.create_model(config)


def test_pruning_grouped_heads_is_refused():
    model = bertblocks.create_model(_config(2))
    with pytest.raises(ValueError, match="grouped-query"):
        model.prune_heads({0: [1]})
