"""Position schemes beyond BERT's: ``rope`` against a float64 RoFormer reference and transformers' rotary code,
``relative_bucket`` against transformers' MPNet encoder, the ``sliding_window`` backend against an explicit mask
and ModernBERT's window rule, per-layer position options, the new attention options, and their errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from bertblocks import create_model, load_config
from bertblocks.config import ConfigError
from bertblocks.core.interfaces import Positions
from bertblocks.plugins.backends import EagerBackend, SlidingWindowBackend
from bertblocks.plugins.positions import RotaryEmbedding, relative_position_bucket
from tests.conftest import TINY
from tests.tolerances import assert_close, assert_grads_close


def _config(**changes):
    cfg = copy.deepcopy(TINY)
    cfg["initializer_range"] = 0.2  # sharp attention: a wrong position shows in the numbers
    cfg.update(changes)
    return cfg


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    return create_model(cfg).eval()


def _ids(b=2, length=9, seed=0):
    return torch.randint(1, 99, (b, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------- rope
def _reference_rope(x: torch.Tensor, positions: torch.Tensor, base: float, rotary_dim: int, interleaved: bool):
    """RoFormer's formula in float64, one 2x2 rotation per pair: ``x [B, t, h, d]``, ``positions [B, t]``."""
    x = x.double()
    out = x.clone()
    half = rotary_dim // 2
    for i in range(half):
        theta = base ** (-2.0 * i / rotary_dim)
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
        angle = positions.double()[..., None] * theta  # [B, t, 1]
        cos, sin = torch.cos(angle), torch.sin(angle)
        out[..., a] = x[..., a] * cos - x[..., b] * sin
        out[..., b] = x[..., b] * cos + x[..., a] * sin
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 8, 6])  # full and partial rotary
def test_rope_equals_the_float64_roformer_formula(interleaved, rotary_dim):
    g = torch.Generator().manual_seed(0)
    query, key = (torch.randn(2, 11, 3, 16, generator=g) for _ in range(2))
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 9, 30, 31, 32, 40, 41, 50, 51, 60, 63]])
    rope = RotaryEmbedding(rotary_dim, base=10000.0, interleaved=interleaved)
    got_q, got_k = rope(query, key, positions)
    want_q = _reference_rope(query, positions, 10000.0, rotary_dim, interleaved)
    want_k = _reference_rope(key, positions, 10000.0, rotary_dim, interleaved)
    assert_close(got_q.double(), want_q)
    assert_close(got_k.double(), want_k)
    # float64 in, float64 tables, no GEMM: the closed formula to float64 rounding (tighter than the fp32 policy)
    got64, _ = rope(query.double(), key.double(), positions)
    assert (got64 - want_q).abs().max() <= 1e-12
    assert torch.equal(got_q[..., rotary_dim:], query[..., rotary_dim:])  # the rest passes through


def test_rope_equals_transformers_rotary_functions():
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb
    from transformers.models.roformer.modeling_roformer import RoFormerSelfAttention

    g = torch.Generator().manual_seed(1)
    query, key = (torch.randn(2, 4, 9, 8, generator=g) for _ in range(2))  # HF layout [b, h, t, d]
    positions = torch.arange(9)[None].expand(2, 9)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.int64).float() / 8))
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    want_q, want_k = apply_rotary_pos_emb(query, key, emb.cos(), emb.sin(), unsqueeze_dim=1)  # GPT-NeoX halves
    mine = RotaryEmbedding(8, 10000.0, interleaved=False)
    got_q, got_k = mine(query.transpose(1, 2), key.transpose(1, 2), positions)
    assert_close(got_q.transpose(1, 2), want_q)
    assert_close(got_k.transpose(1, 2), want_k)

    sinusoidal = torch.cat((freqs.sin(), freqs.cos()), dim=-1)[:, None]  # RoFormer's [sin | cos] table
    want_q, want_k = RoFormerSelfAttention.apply_rotary_position_embeddings(sinusoidal, query, key)  # pairs
    got_q, got_k = RotaryEmbedding(8, 10000.0, interleaved=True)(query.transpose(1, 2), key.transpose(1, 2), positions)
    assert_close(got_q.transpose(1, 2), want_q)
    assert_close(got_k.transpose(1, 2), want_k)


def _manual_rope_layer(attention, hidden, positions, base, rotary_dim, interleaved, mask=None):
    """One rope attention sub-layer written out from its weights: project, rotate (reference), softmax, output."""
    proj, h = attention.self, attention.num_heads
    b, t, width = hidden.shape
    d = width // h
    q, k, v = (getattr(proj, n)(hidden).view(b, t, h, d) for n in ("query", "key", "value"))
    q = _reference_rope(q, positions, base, rotary_dim, interleaved).float()
    k = _reference_rope(k, positions, base, rotary_dim, interleaved).float()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    if mask is not None:
        scores = scores + mask
    context = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, width)
    return attention.output(context, hidden)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_rope_model_layer_equals_the_written_out_reference_with_user_position_ids(backend):
    cfg = _config(position={"name": "rope", "base": 500.0, "rotary_fraction": 0.5, "interleaved": True})
    cfg["encoder"]["attention"]["backend"] = backend
    model = _model(cfg)
    ids = _ids()
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 5, 7, 9, 11, 13, 15, 17, 19]])
    with torch.no_grad():
        out = model(ids, position_ids=position_ids, output_hidden_states=True)
        layer = model.encoder.layer[0]
        attended = _manual_rope_layer(layer.attention, out.hidden_states[0], position_ids, 500.0, 4, True)
        want = layer.output(layer.intermediate(attended), attended)
    assert_close(out.hidden_states[1], want)


def test_rope_scores_depend_on_position_differences_only():
    model = _model(_config(position="rope"))
    ids = _ids()
    with torch.no_grad():
        plain = model(ids).last_hidden_state
        shifted = model(ids, position_ids=torch.arange(9)[None] + 20).last_hidden_state
        spread = model(ids, position_ids=torch.arange(9)[None] * 3).last_hidden_state
    assert_close(shifted, plain)  # the user's positions arrive, and only differences count
    assert (spread - plain).abs().max() > 1e-3


def test_rope_adds_no_parameters_and_no_checkpoint_keys():
    absolute, rope = _model(_config()), _model(_config(position="rope"))
    extra = set(rope.state_dict()) ^ set(absolute.state_dict())
    assert extra == {"embeddings.position_embeddings.weight"}  # only the absolute table is gone


def test_per_layer_overrides_change_the_rope_base_and_the_backend_modernbert_style():
    cfg = _config(position={"name": "rope", "base": 10000.0})
    cfg["encoder"]["num_layers"] = 7
    cfg["encoder"]["attention"]["backend"] = {"name": "sliding_window", "window": 4}
    # ModernBERT: every third layer (0, 3, 6) global with base 160000, the others local with base 10000
    cfg["encoder"]["overrides"] = [{"layers": "0-6/3", "attention": {"backend": "sdpa"}, "position": {"base": 160000}}]
    model = _model(cfg)
    bases = [layer.attention.self.rotary.base for layer in model.encoder.layer]
    backends = [layer.attention.backend.name for layer in model.encoder.layer]
    assert bases == [160000.0, 10000.0, 10000.0, 160000.0, 10000.0, 10000.0, 160000.0]
    assert backends == ["sdpa", "sliding_window", "sliding_window", "sdpa", "sliding_window", "sliding_window", "sdpa"]
    with torch.no_grad():
        assert torch.isfinite(model(_ids(length=12)).last_hidden_state).all()


def _errors(cfg):
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    return [str(issue) for issue in info.value.issues]


def test_rope_errors_come_at_validate_with_their_place():
    odd = _config(hidden_size=36, position="rope")  # 36 / 4 heads = 9
    assert _errors(odd) == [
        "position: rope rotates pairs of dimensions, but the head dimension 9 is odd (hidden_size / num_heads); "
        "choose num_heads so that it is even (every layer)"
    ]
    wide = _config(position={"name": "rope", "rotary_dim": 16})
    assert _errors(wide) == [
        "position: rotary_dim 16 is larger than the head dimension 8 (hidden_size / num_heads) (every layer)"
    ]
    both = _config(position={"name": "rope", "rotary_dim": 4, "rotary_fraction": 0.5})
    assert _errors(both) == ["position: give rotary_dim or rotary_fraction, not both"]
    typo = _config(position={"name": "rope", "bas": 10.0})
    assert _errors(typo)[0].startswith("position.bas: unknown field; allowed fields: base, interleaved,")
    per_layer = _config(position="rope")
    per_layer["encoder"]["overrides"] = [{"layers": 1, "position": {"rotary_dim": 12}}]
    assert _errors(per_layer) == [
        "encoder.overrides: rotary_dim 12 is larger than the head dimension 8 (hidden_size / num_heads) (layers 1)"
    ]
    bad_override = _config(position="rope")
    bad_override["encoder"]["overrides"] = [{"layers": 1, "position": {"base": -1}}]
    assert _errors(bad_override)[0].startswith("encoder.overrides.0.position.base: Input should be greater than 1")


def test_layer_ranges_with_a_step():
    cfg = _config()
    cfg["encoder"]["num_layers"] = 22
    cfg["encoder"]["overrides"] = [{"layers": "0-21/3", "attention": {"backend": "eager"}}]
    assert load_config(cfg).encoder.overrides[0].layers == [0, 3, 6, 9, 12, 15, 18, 21]
    cfg["encoder"]["overrides"] = [{"layers": "0-4/0", "attention": {"backend": "eager"}}]
    assert "the step after '/' must be at least 1" in _errors(cfg)[0]


@pytest.mark.compile
def test_rope_model_compiles_in_one_graph():
    cfg = _config(position="rope")
    cfg["encoder"]["num_layers"] = 1
    model = _model(cfg)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    want = model(ids, attention_mask=mask).last_hidden_state
    torch._dynamo.reset()
    try:
        got = torch.compile(model, fullgraph=True)(ids, attention_mask=mask).last_hidden_state
    finally:
        torch._dynamo.reset()
    assert_close(got, want)


def test_rope_with_gradient_checkpointing_head_mask_and_attention_weights():
    cfg = _config(position="rope", hidden_dropout_prob=0.0)
    cfg["encoder"]["attention"]["dropout"] = 0.0
    model = _model(cfg).train()
    ids = _ids()
    plain = model(ids).last_hidden_state
    plain.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.gradient_checkpointing_enable()
    again = model(ids).last_hidden_state
    again.sum().backward()
    assert torch.equal(again, plain)  # checkpointing reruns the same kernels on the same data
    for name, p in model.named_parameters():
        if name in grads:
            assert_grads_close(p.grad, grads[name], what=name)
    model.eval()
    head_mask = torch.ones(2, 4)
    head_mask[:, 1] = 0
    with torch.no_grad():
        masked = model(ids, head_mask=head_mask, output_attentions=True)
        assert all(a.shape == (2, 4, 9, 9) for a in masked.attentions)
        model.prune_heads({0: [1], 1: [1]})
        assert_close(model(ids).last_hidden_state, masked.last_hidden_state)


# ------------------------------------------------------------------------------------- relative_bucket
def test_bucket_function_equals_transformers_mpnet():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    relative = torch.arange(-300, 301)[None, :] - torch.arange(0, 5)[:, None]
    for num_buckets, max_distance in ((32, 128), (16, 40)):
        want = MPNetEncoder.relative_position_bucket(relative, num_buckets=num_buckets, max_distance=max_distance)
        assert torch.equal(relative_position_bucket(relative, num_buckets, max_distance), want)


def _mpnet_encoder_and_ours(seed=0):
    from transformers import MPNetConfig
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    hf_config = MPNetConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=300,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(seed)
    theirs = MPNetEncoder(hf_config).eval()
    with torch.no_grad():
        for p in theirs.parameters():  # random everywhere, biases and bucket table included
            p.normal_(0.0, 0.2)
    cfg = _config(position="relative_bucket", max_position_embeddings=300, layer_norm_eps=1e-12)
    ours = _model(cfg)
    rename = {
        "attention.attn.q.": "attention.self.query.",
        "attention.attn.k.": "attention.self.key.",
        "attention.attn.v.": "attention.self.value.",
        "attention.attn.o.": "attention.output.dense.",
        "attention.LayerNorm.": "attention.output.LayerNorm.",
    }
    state = {}
    for key, value in theirs.state_dict().items():
        for old, new in rename.items():
            key = key.replace(old, new)
        state[key] = value
    missing, unexpected = ours.encoder.load_state_dict(state, strict=True)
    assert not missing
    assert not unexpected
    return theirs, ours


def test_relative_bucket_equals_transformers_mpnet_encoder_on_the_same_weights():
    theirs, ours = _mpnet_encoder_and_ours()
    assert "encoder.relative_attention_bias.weight" in ours.state_dict()  # MPNet's key, shared by every layer
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 150, 32, generator=g)  # distances beyond max_distance reach the last buckets
    mask = torch.ones(2, 150, dtype=torch.long)
    mask[1, -40:] = 0
    extended = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    with torch.no_grad():
        want = theirs(hidden, attention_mask=extended, return_dict=True).last_hidden_state
        for backend in ("sdpa", "eager"):  # the built default first, then eager swapped in
            for layer in ours.encoder.layer:
                layer.attention.backend = EagerBackend() if backend == "eager" else layer.attention.backend
            got = ours.encoder(hidden, extended, Positions.contiguous(150, 0, hidden.device)).last_hidden_state
            real = mask.bool()
            assert_close(got[real], want[real], what=backend)


def test_relative_bucket_with_pruning_and_packing():
    cfg = _config(position="relative_bucket")
    model = _model(cfg)
    ids = _ids(b=3)
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    head_mask = torch.ones(2, 4)
    head_mask[0, 2] = 0
    with torch.no_grad():
        masked = model(ids, attention_mask=mask, head_mask=head_mask).last_hidden_state
        model.prune_heads({0: [2]})
        pruned = model(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert_close(pruned[real], masked[real])


def test_relative_bucket_table_size_sizes_the_table_and_must_hold_every_bucket():
    wide = _config(position={"name": "relative_bucket", "num_buckets": 32, "table_size": 40})
    assert _model(wide).state_dict()["encoder.relative_attention_bias.weight"].shape == (40, 4)
    narrow = _config(position={"name": "relative_bucket", "num_buckets": 32, "table_size": 16})
    assert _errors(narrow) == [
        "position: table_size 16 is smaller than num_buckets 32: every bucket needs a row (every layer)"
    ]
    few = _config(position={"name": "relative_bucket", "num_buckets": 2})
    assert _errors(few) == ["position: num_buckets 2 is too small: at least 4 (2 per sign, 1 exact) (every layer)"]


# ------------------------------------------------------------------------------------- sliding window
def test_sliding_window_equals_an_explicit_band_mask_and_modernberts_rule():
    from transformers import ModernBertConfig
    from transformers.masking_utils import sliding_window_bidirectional_overlay

    window = 6  # ModernBERT's local_attention: ±3
    half = ModernBertConfig(local_attention=window).sliding_window
    assert half == 3
    overlay = sliding_window_bidirectional_overlay(half)
    visible = torch.tensor([[overlay(0, 0, i, j) for j in range(11)] for i in range(11)])
    backend = SlidingWindowBackend(window)
    assert torch.equal(~backend.band(11, 11, torch.device("cpu")), visible)

    g = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 4, 11, 8, generator=g) for _ in range(3))
    padding = torch.zeros(2, 1, 1, 11)
    padding[1, ..., -2:] = torch.finfo(torch.float32).min
    for mask in (None, padding):
        explicit = torch.zeros(11, 11).masked_fill(~visible, torch.finfo(torch.float32).min)
        full = (
            explicit if mask is None else torch.maximum(explicit + mask, torch.tensor(torch.finfo(torch.float32).min))
        )
        want, want_w = EagerBackend()(
            query, key, value, mask=full, scale=8**-0.5, dropout_p=0.0, is_causal=False, need_weights=True
        )
        for kernel in ("sdpa", "eager"):
            got, _ = SlidingWindowBackend(window, kernel)(
                query, key, value, mask=mask, scale=8**-0.5, dropout_p=0.0, is_causal=False, need_weights=False
            )
            assert_close(got, want, what=kernel)
        _, weights = backend(
            query, key, value, mask=mask, scale=8**-0.5, dropout_p=0.0, is_causal=False, need_weights=True
        )
        assert_close(weights, want_w)
        assert (weights[..., ~visible] == 0).all()


def test_sliding_window_wider_than_the_sequence_is_plain_attention():
    cfg = _config()
    plain = _model(cfg)
    cfg["encoder"]["attention"]["backend"] = {"name": "sliding_window", "window": 64}
    local = _model(cfg)
    ids = _ids()
    with torch.no_grad():
        assert_close(local(ids).last_hidden_state, plain(ids).last_hidden_state)


# ------------------------------------------------------------------------------------ attention options
def test_fused_qkv_equals_separate_projections_and_keeps_default_keys():
    plain = _model(_config())
    assert "encoder.layer.0.attention.self.query.weight" in plain.state_dict()
    cfg = _config()
    cfg["encoder"]["attention"]["fused_qkv"] = True
    fused = _model(cfg)
    state = {}
    for key, value in plain.state_dict().items():
        if ".attention.self.query." in key:
            base = key.replace(".query.", ".{}.")
            parts = [plain.state_dict()[base.format(n)] for n in ("query", "key", "value")]
            state[key.replace(".query.", ".Wqkv.")] = torch.cat(parts)
        elif ".attention.self.key." not in key and ".attention.self.value." not in key:
            state[key] = value
    fused.load_state_dict(state, strict=True)
    ids = _ids()
    with torch.no_grad():
        assert_close(fused(ids).last_hidden_state, plain(ids).last_hidden_state)


@pytest.mark.parametrize("fused", [False, True])
def test_attention_without_biases_prunes_and_head_masks(fused):
    cfg = _config(position="rope")
    cfg["encoder"]["attention"].update({"qkv_bias": False, "output_bias": False, "fused_qkv": fused})
    model = _model(cfg)
    names = [n for n in model.state_dict() if ".attention." in n and n.endswith(".bias")]
    assert names == [n for n in names if "LayerNorm" in n]  # no projection bias exists
    ids = _ids()
    head_mask = torch.ones(2, 4)
    head_mask[1, 3] = 0
    with torch.no_grad():
        masked = model(ids, head_mask=head_mask).last_hidden_state
        model.prune_heads({1: [3]})
        assert_close(model(ids).last_hidden_state, masked)
    assert model.encoder.layer[1].attention.output.dense.bias is None


# --------------------------------------------------------------------------- ModernBERT's attention, whole
@pytest.mark.parametrize("layer_index", [0, 1])  # 0: global (base 160000), 1: local (±2 tokens, base 10000)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_rope_fused_qkv_no_bias_and_sliding_window_equal_transformers_modernbert_attention(layer_index, implementation):
    from transformers import ModernBertConfig
    from transformers.masking_utils import create_bidirectional_mask, create_bidirectional_sliding_window_mask
    from transformers.models.modernbert.modeling_modernbert import ModernBertAttention, ModernBertRotaryEmbedding

    hf_config = ModernBertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=37,
        local_attention=4,
        global_attn_every_n_layers=3,
        global_rope_theta=160000.0,
        local_rope_theta=10000.0,
        attention_bias=False,
        attention_dropout=0.0,
    )
    hf_config._attn_implementation = implementation
    torch.manual_seed(0)
    theirs = ModernBertAttention(hf_config, layer_idx=layer_index).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.2)

    cfg = _config(position={"name": "rope", "base": 10000.0}, max_position_embeddings=64)
    cfg["encoder"]["num_layers"] = 3
    cfg["encoder"]["attention"].update({"qkv_bias": False, "output_bias": False, "fused_qkv": True, "dropout": 0.0})
    cfg["encoder"]["attention"]["backend"] = {"name": "sliding_window", "window": 4, "kernel": implementation}
    cfg["encoder"]["overrides"] = [
        {"layers": "0-2/3", "attention": {"backend": implementation}, "position": {"base": 160000.0}}
    ]
    ours = _model(cfg).encoder.layer[layer_index].attention
    with torch.no_grad():
        ours.self.Wqkv.weight.copy_(theirs.Wqkv.weight)
        ours.output.dense.weight.copy_(theirs.Wo.weight)
    captured = []
    ours.output.dense.register_forward_hook(lambda module, args, out: captured.append(out))

    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 11, 32, generator=g)
    padding = torch.ones(2, 11, dtype=torch.long)
    padding[1, -3:] = 0
    position_ids = torch.arange(11)[None]
    layer_type = hf_config.layer_types[layer_index]
    make_mask = (
        create_bidirectional_mask if layer_type == "full_attention" else create_bidirectional_sliding_window_mask
    )
    with torch.no_grad():
        mask = make_mask(config=hf_config, inputs_embeds=hidden, attention_mask=padding)
        cos_sin = ModernBertRotaryEmbedding(hf_config)(hidden, position_ids, layer_type)
        want, _ = theirs(hidden, position_embeddings=cos_sin, attention_mask=mask)
        additive = (1.0 - padding[:, None, None, :].float()) * torch.finfo(torch.float32).min
        ours(hidden, mask=additive, positions=Positions.contiguous(11, 0, hidden.device))
    real = padding.bool()
    assert_close(captured[0][real], want[real])


# --------------------------------------------------------------------------------- a plugin's varlen backend
@pytest.mark.parametrize("position", ["rope", "relative_bucket"])
def test_varlen_backend_with_rope_and_shared_bias_equals_padded(position):
    from bertblocks.registry import Registry
    from tests.test_packing import _PerSequenceBackend, _VarlenPlugin

    registry = Registry(load_entry_points=False)
    registry.register(_VarlenPlugin(), name="varlen-test")
    cfg = _config(position=position)
    torch.manual_seed(0)
    padded = create_model(cfg, ["encoder.packing=never"], registry=registry).eval()
    varlen = create_model(
        cfg, ["encoder.packing=always", "encoder.attention.backend=per_sequence"], registry=registry
    ).eval()
    varlen.load_state_dict(padded.state_dict())
    ids = _ids(b=3)
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    mask[2, -7:] = 0
    spaced = torch.arange(9)[None] * torch.tensor([[1], [2], [3]])  # per-row positions
    real = mask.bool()
    for extra in ({}, {"position_ids": spaced}):
        _PerSequenceBackend.calls = 0
        with torch.no_grad():
            want = padded(ids, attention_mask=mask, **extra).last_hidden_state
            got = varlen(ids, attention_mask=mask, **extra).last_hidden_state
        # rope runs per packed sequence (varlen); a shared bias needs the padded layout, so it falls back
        assert _PerSequenceBackend.calls == (2 if position == "rope" else 0)
        assert_close(got[real], want[real])
