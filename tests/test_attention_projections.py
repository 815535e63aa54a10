"""The built-in attention kinds share one projections module (``bertblocks/plugins/projections.py``): every kind's
``attention.self`` holds query, key and value built there (BERT's own ``SelfAttentionProjections`` through
``qkv_linears``, the others as ``QKVProjections``), its ``attention.output`` is the one ``AttentionOutput``, under
transformers' key names; and the encoder-only kinds refuse decoder use in the one forward they share."""

from __future__ import annotations

import pytest
import torch

import bertblocks
from bertblocks.core.capabilities import CapabilityError
from bertblocks.plugins import BUILTIN_PLUGINS
from bertblocks.plugins.attention import SelfAttentionProjections
from bertblocks.plugins.projections import AttentionOutput, EncoderOnlyAttention, QKVProjections

#: a tiny preset of each built-in attention kind
PRESETS = {
    "bert": "tiny-bert",
    "block_sparse": "tiny-big-bird",
    "convbert": "tiny-convbert",
    "grouped_conv": "tiny-squeezebert",
    "longformer": "tiny-longformer",
    "nystrom": "tiny-nystromformer",
}
ENCODER_ONLY = ("convbert", "longformer", "nystrom")


def _attention(kind: str) -> torch.nn.Module:
    model = bertblocks.create_model(PRESETS[kind]).eval()
    assert model.config.encoder.attention.name == kind
    return model.encoder.layer_at(0).attention


def test_every_builtin_attention_kind_is_covered():
    """A new built-in attention kind joins this file (and so the shared module) or fails here."""
    builtin = {
        component.name
        for plugin in BUILTIN_PLUGINS
        for component in getattr(plugin, "bertblocks_register_components", list)()
        if component.kind == "attention"
    }
    assert builtin == set(PRESETS)


@pytest.mark.parametrize("kind", list(PRESETS))
def test_each_kind_builds_its_projections_in_the_shared_module(kind: str):
    attention = _attention(kind)
    assert isinstance(attention.self, QKVProjections | SelfAttentionProjections)
    assert type(attention.output) is AttentionOutput
    keys = set(attention.state_dict())
    assert {"self.query.weight", "self.key.weight", "self.value.weight", "output.dense.weight"} <= keys
    assert isinstance(attention, EncoderOnlyAttention) == (kind in ENCODER_ONLY)


@pytest.mark.parametrize("kind", ENCODER_ONLY)
@pytest.mark.parametrize("use", ["encoder_hidden_states", "cache", "is_causal"])
def test_an_encoder_only_kind_refuses_decoder_use_naming_itself(kind: str, use: str):
    attention = _attention(kind)
    hidden = torch.zeros(1, 4, attention.output.dense.out_features)
    asked = {"encoder_hidden_states": hidden, "cache": object(), "is_causal": True}[use]
    with pytest.raises(CapabilityError, match=f"the {kind} attention is an encoder's: no cross-attention"):
        attention(hidden, mask=None, positions=None, **{use: asked})
