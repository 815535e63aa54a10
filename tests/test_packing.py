"""The packed (unpadded) encoder path equals the padded path on real tokens, for every scheme and backend."""

from __future__ import annotations

import itertools

import pytest
import torch

import bertblocks
from bertblocks.core.component import Component
from bertblocks.core.interfaces import BackendCapabilities
from bertblocks.core.packing import Packing, right_padded_lengths
from bertblocks.plugins.backends import SdpaBackend
from bertblocks.registry import Registry
from tests.conftest import TINY, to_device
from tests.tolerances import assert_close


def _model(position, backend, packing):
    torch.manual_seed(0)
    model = bertblocks.create_model(
        {**TINY, "position": position, "initializer_range": 0.2},
        [f"encoder.attention.backend={backend}", f"encoder.packing={packing}"],
    ).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "distance_embedding" in name:
                param.normal_()
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 99, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 9:] = 0
    mask[3, 2:] = 0
    types = torch.randint(0, 2, (4, 12), generator=g)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("position", ["absolute", "relative_key", "relative_key_query"])
def test_packed_equals_padded_on_real_tokens(position, backend, device):
    padded, packed = _model(position, backend, "never").to(device), _model(position, backend, "always").to(device)
    x = to_device(_batch(), device)
    head_mask = torch.tensor([[1.0, 0.0, 1.0, 0.5], [1.0, 1.0, 0.0, 1.0]], device=device)
    real = x["attention_mask"].bool()
    with torch.no_grad():
        a = padded(**x, head_mask=head_mask, output_hidden_states=True, output_attentions=True)
        b = packed(**x, head_mask=head_mask, output_hidden_states=True, output_attentions=True)
    assert_close(a.last_hidden_state[real], b.last_hidden_state[real])
    assert_close(a.pooler_output, b.pooler_output)
    for x_a, x_b in zip(a.hidden_states, b.hidden_states, strict=True):
        assert_close(x_a[real], x_b[real])
    for w_a, w_b in zip(a.attentions, b.attentions, strict=True):
        # attention maps keep the padded layout; rows of padded queries are not computed in the same way
        assert_close(w_a[real[:, None, :, None].expand_as(w_a)], w_b[real[:, None, :, None].expand_as(w_b)])
    # padded positions hold zeros in a packed run (documented), never stale or random values
    assert b.last_hidden_state[~real].abs().max() == 0


def test_auto_packs_in_inference_only_and_matches():
    model = _model("relative_key", "sdpa", "auto")
    x = _batch()  # 17 of 48 positions are padding: above the default threshold
    calls = []
    hook = model.encoder.layer[0].intermediate.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
    with torch.no_grad():
        auto = model(**x).last_hidden_state
    model.train()
    model(**x)
    hook.remove()
    tokens = int(x["attention_mask"].sum())
    assert calls[0] == (1, tokens, 32)  # inference: dense layers saw the real tokens only
    assert calls[1] == (4, 12, 32)  # training: padded as before
    model.eval()
    model.config.encoder.packing = "never"
    with torch.no_grad():
        padded = model(**x).last_hidden_state
    real = x["attention_mask"].bool()
    assert_close(auto[real], padded[real])


def test_left_padding_and_little_padding_are_not_packed():
    model = _model("absolute", "sdpa", "auto")
    x = _batch()
    calls = []
    model.encoder.layer[0].intermediate.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
    left = x["attention_mask"].flip(1)
    little = torch.ones(4, 12, dtype=torch.long)
    little[0, -1] = 0
    with torch.no_grad():
        model(input_ids=x["input_ids"], attention_mask=left)
        model(input_ids=x["input_ids"], attention_mask=little)
    assert calls == [(4, 12, 32), (4, 12, 32)]


def test_packing_round_trip():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    packing = Packing.from_mask(mask)
    assert packing.cu_seqlens.tolist() == [0, 3, 4, 8]
    assert packing.max_seqlen == 4
    x = torch.randn(3, 4, 5)
    packed = packing.pack(x)
    assert packed.shape == (8, 5)
    back = packing.unpack(packed)
    assert torch.equal(back[mask.bool()], x[mask.bool()])
    assert back[~mask.bool()].abs().max() == 0
    assert right_padded_lengths(mask).tolist() == [3, 1, 4]
    assert right_padded_lengths(mask.flip(1)) is None


def test_packing_option_is_validated():
    with pytest.raises(bertblocks.config.ConfigError, match=r"encoder\.packing"):
        bertblocks.create_model({**TINY, "encoder": {**TINY["encoder"], "packing": "sometimes"}})


class _PerSequenceBackend(SdpaBackend):
    """A plugin backend declaring ``varlen``: attention per packed sequence, never in the padded layout."""

    name = "per_sequence"
    capabilities = BackendCapabilities(additive_mask=True, attention_weights=True, causal=True, varlen=True)
    calls = 0

    def varlen(self, query, key, value, *, cu_seqlens, max_seqlen, scale, dropout_p):
        type(self).calls += 1
        bounds = cu_seqlens.tolist()
        pieces = []
        for start, stop in itertools.pairwise(bounds):
            q, k, v = (x[start:stop].transpose(0, 1)[None] for x in (query, key, value))  # [1, h, l, d]
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, dropout_p=dropout_p)
            pieces.append(out[0].transpose(0, 1))  # [l, h, d]
        return torch.cat(pieces)


class _VarlenPlugin:
    @staticmethod
    def bertblocks_register_components():
        return [Component("backend", "per_sequence", lambda *, options: _PerSequenceBackend())]


def test_varlen_backend_gets_packed_sequences_and_matches_padded(device):
    registry = Registry(load_entry_points=False)
    registry.register(_VarlenPlugin(), name="varlen-test")
    torch.manual_seed(0)
    config = {**TINY, "initializer_range": 0.2}
    padded = bertblocks.create_model(config, ["encoder.packing=never"], registry=registry).to(device).eval()
    varlen = (
        bertblocks.create_model(
            config, ["encoder.packing=always", "encoder.attention.backend=per_sequence"], registry=registry
        )
        .to(device)
        .eval()
    )
    varlen.load_state_dict(padded.state_dict())
    x = to_device(_batch(), device)
    real = x["attention_mask"].bool()
    _PerSequenceBackend.calls = 0
    with torch.no_grad():
        a, b = padded(**x).last_hidden_state, varlen(**x).last_hidden_state
    assert _PerSequenceBackend.calls == 2  # once per layer: the packed path used varlen, not re-padding
    assert_close(a[real], b[real])
    with torch.no_grad():  # attention maps need the padded layout: the same backend falls back to it
        maps = varlen(**x, output_attentions=True).attentions
    assert _PerSequenceBackend.calls == 2
    assert maps[0].shape == (4, 4, 12, 12)
