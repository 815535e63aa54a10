"""The built-in ``symmetric_alibi`` position scheme: slopes and bias against the ALiBi paper's formula in float64,
a whole model against a float64 reference of post-LN BERT with ALiBi, eager = sdpa, packing, the KV cache, the
conformance suite, and its errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from bertblocks import create_model
from bertblocks.config import ConfigError
from bertblocks.core.interfaces import Positions
from bertblocks.plugins.positions import AlibiBias, alibi_slopes
from bertblocks.registry import Registry
from bertblocks.testing import ConformanceSuite
from tests.conftest import TINY
from tests.tolerances import assert_close


def _paper_slopes(n: int) -> list[float]:
    """The ALiBi paper's slopes, written from its description in float64: for n a power of two the geometric
    sequence starting at 2^(-8/n) with that ratio; otherwise the closest power of two's, then every other one
    of twice that."""
    if math.log2(n).is_integer():
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    closest = 2 ** math.floor(math.log2(n))
    return _paper_slopes(closest) + _paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24])
def test_slopes_are_the_papers_including_non_power_of_two_head_counts(heads):
    got = alibi_slopes(heads)
    want = _paper_slopes(heads)
    assert len(got) == heads
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-15
    assert len(set(got)) == heads  # every head its own slope


def test_slopes_of_twelve_heads_are_jinas():
    # jina-embeddings-v2-base-en: 12 heads; 8 of 2^-1 … 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    assert alibi_slopes(12) == [2.0**-i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]


def test_bias_is_minus_slope_times_distance_in_float64_and_follows_the_cache_offset():
    slopes = alibi_slopes(6)
    bias = AlibiBias(slopes)
    whole = bias(Positions.contiguous(9, 0, torch.device("cpu")), torch.float64)  # [1, h, 9, 9]
    i, j = torch.arange(9, dtype=torch.float64)[:, None], torch.arange(9, dtype=torch.float64)[None, :]
    want = torch.stack([-m * (i - j).abs() for m in slopes])[None]
    assert torch.equal(whole, want)  # exact: products of a slope and a small integer
    assert torch.equal(whole, whole.transpose(-1, -2))  # symmetric: both directions
    tail = bias(Positions.contiguous(4, 5, torch.device("cpu")), torch.float64)  # 4 queries after 5 cached keys
    assert torch.equal(tail, whole[:, :, 5:])
    assert bias(Positions.contiguous(9, 0, torch.device("cpu")), torch.float32).dtype == torch.float32
    assert not dict(bias.state_dict())  # nothing to save or load


def _config(**changes):
    cfg = copy.deepcopy(TINY)
    cfg["initializer_range"] = 0.2  # sharp attention: a wrong bias shows in the numbers
    cfg["hidden_dropout_prob"] = 0.0
    cfg["position"] = {"name": "symmetric_alibi"}
    cfg["encoder"]["attention"]["num_heads"] = 4
    for path, value in changes.items():
        node = cfg
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return cfg


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    return create_model(cfg).eval()


def _reference(state: dict[str, torch.Tensor], ids, types, mask, heads: int, eps: float) -> torch.Tensor:
    """Post-LN BERT with symmetric ALiBi in float64, from the weights: embeddings (no position table), then per
    layer ``softmax(QKᵀ/√d + mask - m_h·|i-j|) V`` and BERT's feed-forward."""
    w = {k: v.double() for k, v in state.items()}
    ln = torch.nn.functional.layer_norm

    def lin(x, name):
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    def norm(x, name):
        return ln(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], eps)

    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][types]
    x = norm(x, "embeddings.LayerNorm")
    b, t, hidden = x.shape
    d = hidden // heads
    pos = torch.arange(t, dtype=torch.float64)
    slopes = torch.tensor(_paper_slopes(heads), dtype=torch.float64)
    alibi = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs()  # [h, t, t]
    additive = (1.0 - mask[:, None, None, :].double()) * torch.finfo(torch.float64).min
    layer = 0
    while f"encoder.layer.{layer}.attention.self.query.weight" in w:
        p = f"encoder.layer.{layer}"
        q, k, v = (lin(x, f"{p}.attention.self.{QKV[n]}").view(b, t, heads, d).transpose(1, 2) for n in "qkv")
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + additive + alibi
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, hidden)
        h = lin(context, f"{p}.attention.output.dense") + x
        x = norm(h, f"{p}.attention.output.LayerNorm")
        f = lin(torch.nn.functional.gelu(lin(x, f"{p}.intermediate.dense")), f"{p}.output.dense") + x
        x = norm(f, f"{p}.output.LayerNorm")
        layer += 1
    return x


QKV = {"q": "query", "k": "key", "v": "value"}


def _batch(b=3, t=11, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 99, (b, t), generator=g)
    types = torch.randint(0, 2, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    return ids, types, mask


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("heads", [4, 8, 2])  # 8 heads of 4 dims; the 6-head case below is not a power of two
def test_model_equals_the_float64_reference(backend, heads):
    model = _model(_config(**{"encoder.attention.backend": backend, "encoder.attention.num_heads": heads}))
    ids, types, mask = _batch()
    state = {k.removeprefix("bert."): v for k, v in model.state_dict().items()}
    want = _reference(state, ids, types, mask, heads, model.config.layer_norm_eps)
    with torch.no_grad():
        got = model(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert_close(got[real].double(), want[real])


def test_non_power_of_two_heads_equal_the_float64_reference():
    cfg = _config(**{"hidden_size": 36, "encoder.attention.num_heads": 6})
    model = _model(cfg)
    ids, types, mask = _batch()
    state = {k.removeprefix("bert."): v for k, v in model.state_dict().items()}
    want = _reference(state, ids, types, mask, 6, model.config.layer_norm_eps)
    with torch.no_grad():
        got = model(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert_close(got[mask.bool()].double(), want[mask.bool()])


def test_a_wrong_bias_fails_the_reference():
    """The reference is sensitive: the same weights without ALiBi are far from it."""
    model = _model(_config())
    ids, types, mask = _batch()
    state = {k.removeprefix("bert."): v for k, v in model.state_dict().items()}
    want = _reference(state, ids, types, mask, 4, model.config.layer_norm_eps)
    plain = _model(_config(**{"position": {"name": "none"}}))
    with torch.no_grad():
        got = plain(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert (got[mask.bool()].double() - want[mask.bool()]).abs().max() > 1e-2


def test_eager_equals_sdpa_with_padding_attentions_and_hidden_states():
    ids, types, mask = _batch()
    out = {}
    for backend in ("eager", "sdpa"):
        model = _model(_config(**{"encoder.attention.backend": backend}))
        with torch.no_grad():
            out[backend] = model(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
    for a, b in zip(out["eager"].hidden_states, out["sdpa"].hidden_states, strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_packed_equals_padded_on_real_tokens(backend):
    """A shared score bias sends the packed path to the padded layout for attention (docs/explanation/packing.md):
    exact, with the dense layers still on the real tokens only."""
    ids, types, mask = _batch()
    padded = _model(_config(**{"encoder.attention.backend": backend, "encoder.packing": "never"}))
    packed = _model(_config(**{"encoder.attention.backend": backend, "encoder.packing": "always"}))
    shapes = []
    packed.encoder.layer[0].intermediate.register_forward_hook(lambda m, i, o: shapes.append(tuple(i[0].shape)))
    with torch.no_grad():
        a = padded(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
        b = packed(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert shapes == [(1, int(mask.sum()), 32)]  # packed: the feed-forward saw the real tokens only
    real = mask.bool()
    assert_close(a[real], b[real])
    assert b[~real].abs().max() == 0


def test_kv_cache_chunks_equal_the_whole_causal_pass():
    cfg = _config(**{"is_decoder": True, "encoder.attention.backend": "eager"})
    model = _model(cfg)
    ids = torch.randint(1, 99, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = model(input_ids=ids).last_hidden_state
        first = model(input_ids=ids[:, :5], use_cache=True)
        rest = model(input_ids=ids[:, 5:], past_key_values=first.past_key_values, use_cache=True).last_hidden_state
    assert_close(torch.cat([first.last_hidden_state, rest], dim=1), whole)


def test_longer_than_max_position_embeddings_is_allowed():
    model = _model(_config(max_position_embeddings=8))
    with torch.no_grad():
        out = model(input_ids=torch.randint(1, 99, (1, 20))).last_hidden_state
    assert out.shape == (1, 20, 32)


def test_explicit_slopes_and_their_count_error():
    model = _model(_config(position={"name": "symmetric_alibi", "slopes": [0.5, 0.25, 0.125, 1.0]}))
    assert model.encoder.alibi.slopes.tolist() == [0.5, 0.25, 0.125, 1.0]
    with pytest.raises(ConfigError, match=r"slopes lists 3 values, one per head, but the layer has 4 heads"):
        create_model(_config(position={"name": "symmetric_alibi", "slopes": [0.5, 0.25, 0.125]}))
    with pytest.raises(ConfigError, match=r"position\.slopes"):
        create_model(_config(position={"name": "symmetric_alibi", "slopes": [0.5, -1.0, 0.1, 0.1]}))


def test_the_conformance_suite_passes():
    suite = ConformanceSuite(Registry(), compile_backend="aot_eager")
    cases = suite.cases(kinds=["position"], names=["symmetric_alibi"])
    ran = []
    for case in cases:
        try:
            case.run()
        except pytest.skip.Exception:  # a check that does not apply (rotation: ALiBi rotates nothing)
            continue
        ran.append(case)
    assert len(ran) >= 3, [str(c) for c in cases]


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_analytic_flops_know_the_scheme_and_match_the_counter(backend):
    """ALiBi adds a bias, no matrix product: the ablation's analytic count equals torch's flop counter."""
    from bertblocks.ablation.flops import analytic_flops_per_token, counted_flops

    model = _model(_config(**{"encoder.attention.backend": backend}))
    for batch, length in [(2, 16), (1, 7)]:
        counted = counted_flops(model, batch, length, model.config.vocab_size) / (batch * length)
        analytic = analytic_flops_per_token(model.config, length)
        assert analytic.note == ""  # not "assumed absolute"
        assert analytic.per_token == pytest.approx(counted, rel=1e-9)
