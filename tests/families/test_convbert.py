"""ConvBERT (``convbert``), what only this family does: its mixed attention as a component other families use from
YAML, the attention's other option sets through the conformance suite (one softmax head per convolution head,
grouped feed-forward projections), the packed path computing each sequence as transformers computes it alone, and
what is refused (position terms, a decoder, even windows, groups that do not divide). Parity of every head, hidden
states and attention probabilities, the preset and the per-family paths: the ``convbert`` row of
``tests/families/reference.py``."""

from __future__ import annotations

import pytest
import torch
import transformers

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.core.capabilities import CapabilityError
from bertblocks.errors import BertBlocksError
from bertblocks.registry import Registry
from bertblocks.testing import ConformanceSuite
from tests.families.reference import FAMILIES, batch, save_hf
from tests.tolerances import assert_close

CONVBERT = FAMILIES["convbert"]
#: other option sets than the suite's defaults (head_ratio 2, window 9, dense feed-forward): as many softmax as
#: convolution heads (head_ratio 1: every head has probabilities), a window of 3, and grouped projections
SUITE = ConformanceSuite(
    Registry(load_entry_points=False),
    options={
        ("attention", "convbert"): {"head_ratio": 1, "conv_kernel_size": 3},
        ("feedforward", "bert"): {"groups": 2},
    },
    configs={("feedforward", "bert"): {"encoder": {"feedforward": {"intermediate_size": 38}}}},  # 2 groups of 19
    compile_backend="aot_eager",
)


@pytest.mark.parametrize(
    "case",
    [
        *SUITE.params(kinds=["attention"], names=["convbert"], exclude=["compile"]),
        *SUITE.params(kinds=["feedforward"], names=["bert"], exclude=["compile"]),
    ],
)
def test_other_option_sets_conform(case):
    case.run()


def _bert_with_convbert_attention(**extra: object) -> bertblocks.BertConfig:
    return bertblocks.load_config(
        "tiny-bert", {"encoder.attention.name": "convbert", "encoder.attention.conv_kernel_size": 3, **extra}
    )


def test_another_family_uses_the_attention_from_yaml(tmp_path):
    """A BERT config with ``encoder.attention.name: convbert``: built, saved (the choice travels in config.json's
    ``bertblocks`` block), and loaded back with the same outputs."""
    config = _bert_with_convbert_attention()
    torch.manual_seed(0)
    model = bertblocks.create_model(config).eval()
    assert type(model.encoder.layer_at(0).attention).__name__ == "ConvBertAttention"
    ids = torch.randint(5, 99, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    model.save_pretrained(tmp_path)
    again = bertblocks.from_pretrained(tmp_path).eval()
    assert again.config.encoder.attention.name == "convbert"
    with torch.no_grad():
        # the same kernel on the same weights: exact
        assert torch.equal(again(input_ids=ids, attention_mask=mask).last_hidden_state, out)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"position": "rope"}, "takes no position terms"),
        ({"position": "relative_key"}, "takes no position terms"),
        ({"is_decoder": True}, "cannot be a causal decoder"),
        ({"encoder.attention.conv_kernel_size": 4}, "conv_kernel_size 4 must be odd"),
        ({"encoder.feedforward.groups": 5}, "groups 5 must divide hidden_size 32"),
    ],
)
def test_what_the_attention_cannot_do_is_refused_naming_it(overrides, message):
    with pytest.raises(BertBlocksError, match=message):
        bertblocks.create_model(_bert_with_convbert_attention(**overrides))


def test_heads_that_do_not_split_the_width_are_refused():
    # 32 heads, head_ratio 5: 6 softmax and 6 convolution heads cannot share a width of 32
    overrides = {"encoder.attention.num_heads": 32, "encoder.attention.head_ratio": 5}
    with pytest.raises(BertBlocksError, match="2 · 6 must divide it"):
        bertblocks.create_model(_bert_with_convbert_attention(**overrides))


def test_pruning_and_the_cache_are_refused_as_declared():
    model = bertblocks.create_model(_bert_with_convbert_attention()).eval()
    with pytest.raises(CapabilityError, match="cannot be pruned"):
        model.prune_heads({0: [0]})
    with pytest.raises(ConfigError, match="cross-attention"):
        bertblocks.load_config(
            "tiny-bert", {"encoder.attention.name": "convbert", "add_cross_attention": True, "is_decoder": True}
        )


def test_packed_sequences_equal_transformers_on_each_sequence_alone(tmp_path):
    """``packing: always``: each sequence's windows see zeros past its end, as transformers' convolutions do on the
    sequence alone; the padded path reads the padded positions, as transformers does on the padded batch."""
    reference = save_hf(CONVBERT, "ConvBertModel", tmp_path)
    inputs, mask = batch(CONVBERT, "ConvBertModel")
    inputs = {k: v for k, v in inputs.items() if k != "labels"}
    packed = bertblocks.from_pretrained(tmp_path, ["encoder.packing=always"]).eval()
    padded = bertblocks.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        got = packed(**inputs).last_hidden_state
        for row, length in enumerate(mask.sum(1).tolist()):
            alone = {k: v[row : row + 1, :length] for k, v in inputs.items()}
            assert_close(got[row, :length], reference(**alone).last_hidden_state[0])
        # the window of 5 reaches the padding of the short row: the two paths differ there, by declaration
        difference = (padded(**inputs).last_hidden_state - got)[mask.bool()].abs().max()
    assert difference > 1e-3
    assert "reads_padded_positions" in padded.packing_off_reason


def test_a_grouped_projection_is_each_group_through_its_own_weight():
    from bertblocks.plugins.grouped_linear import GroupedLinear

    torch.manual_seed(0)
    layer = GroupedLinear(6, 4, groups=2)
    assert layer.weight.shape == (2, 3, 2)  # transformers' GroupedLinearLayer: [groups, in/groups, out/groups]
    layer.reset_parameters_like_hf(0.5)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    weight, bias = layer.weight.double(), layer.bias.double()
    # written out: slice g of the input through weight[g], the outputs side by side, then the bias
    expected = torch.cat([x[..., 3 * g : 3 * (g + 1)] @ weight[g] for g in range(2)], dim=-1) + bias
    assert_close(layer.double()(x), expected)


def test_transformers_reads_the_grouped_and_mixed_fields_back(tmp_path):
    reference = save_hf(CONVBERT, "ConvBertModel", tmp_path / "hf")
    bertblocks.from_pretrained(tmp_path / "hf").save_pretrained(tmp_path / "ours")
    again = transformers.ConvBertModel.from_pretrained(tmp_path / "ours")
    for field in ("head_ratio", "conv_kernel_size", "num_groups", "embedding_size", "pad_token_id"):
        assert getattr(again.config, field) == getattr(reference.config, field), field
