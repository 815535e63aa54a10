"""The example third-party plugin (``examples/plugins/bertblocks-alibi``), installed with pip in the test set-up:
found through its entry point, listed with its version, validated like a built-in, composed with built-ins,
usable per layer, and numerically right (ALiBi against a reference written here, the local backend against
SDPA and against an explicit band mask)."""

from __future__ import annotations

import copy
import importlib.metadata as metadata
import math

import pytest
import torch
from bertblocks_alibi import AlibiOptions, LocalAttentionBackend, alibi_slopes
from safetensors.torch import load_file
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

import bertblocks
from bertblocks import cli
from bertblocks.plugins.backends import EagerBackend, SdpaBackend
from bertblocks.registry import DISABLE_AUTOLOAD_ENV, PluginInfo, Registry, set_registry
from bertblocks.testing import ConformanceSuite
from tests.conftest import TINY, V4, batch, max_diff
from tests.tolerances import assert_close


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Registry:
    """A fresh registry that discovers installed plugins (the suite's conftest switches autoload off)."""
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    return Registry()


def _config(position: object = "absolute", backend: object = "sdpa", **encoder: object) -> dict:
    config = copy.deepcopy(TINY)
    config["initializer_range"] = 0.2  # sharp attention: a wrong bias or mask shows in the numbers
    config["position"] = position
    config["encoder"]["attention"]["backend"] = backend
    config["encoder"].update(encoder)
    return config


def _model(config: dict, registry: Registry, seed: int = 0) -> bertblocks.BertModel:
    torch.manual_seed(seed)
    return bertblocks.create_model(config, registry=registry).eval()


# -------------------------------------------------------------------------------------------- discovery
def test_discovered_through_its_entry_point(registry):
    assert not registry.load_errors
    for kind, name in (("position", "alibi"), ("backend", "local")):
        component = registry.get(kind, name)
        assert component.provider == "alibi (bertblocks-alibi)"
        assert component.description
    ep = next(ep for ep in metadata.entry_points(group="bertblocks") if ep.name == "alibi")
    assert (ep.value, ep.dist.name) == ("bertblocks_alibi.plugin", "bertblocks-alibi")


def test_not_discovered_with_autoload_disabled(monkeypatch):
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    with pytest.raises(
        bertblocks.registry.UnknownComponentError, match=r"^unknown backend 'local'; available: eager, sdpa"
    ):
        Registry().get("backend", "local")


def test_listed_with_distribution_and_version(registry, monkeypatch, capsys):
    version = metadata.version("bertblocks-alibi")
    assert PluginInfo("alibi", "bertblocks-alibi", version, ("bertblocks_register_components",)) in (registry.plugins())
    # and by the command line, which uses the process-wide registry
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    set_registry(None)
    assert cli.main(["plugins"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("alibi "))
    assert line.split() == ["alibi", "bertblocks-alibi", version, "register_components"]


# ------------------------------------------------------------------------------------------- validation
def test_a_wrong_option_gets_the_same_error_as_a_builtins(registry):
    """Options of plugin components are checked by the plugin's pydantic model, reported like the built-ins'."""
    builtin = _config(backend={"name": "sdpa", "windw": 3})
    with pytest.raises(bertblocks.config.ConfigError) as theirs:
        bertblocks.load_config(builtin, registry=registry)
    plugin = _config(position={"name": "alibi", "max_bais": 4}, backend={"name": "local", "windw": 3})
    with pytest.raises(bertblocks.config.ConfigError) as ours:
        bertblocks.load_config(plugin, registry=registry)
    assert [str(i) for i in theirs.value.issues] == [
        "encoder.attention.backend.windw: unknown field; allowed fields: name, varlen_kernel"
    ]
    assert [str(i) for i in ours.value.issues] == [
        "position.max_bais: unknown field; allowed fields: max_bias, name, slopes (did you mean 'max_bias'?)",
        "encoder.attention.backend.windw: unknown field; allowed fields: kernel, name, window (did you mean 'window'?)",
    ]


def test_wrong_values_are_reported_with_their_paths_all_at_once(registry):
    config = _config(
        position={"name": "alibi", "slopes": "linear", "max_bias": -1},
        backend={"name": "local", "window": -2, "kernel": "flash"},
        overrides=[{"layers": 1, "attention": {"backend": {"name": "local", "window": "wide"}}}],
    )
    with pytest.raises(bertblocks.config.ConfigError) as info:
        bertblocks.load_config(config, registry=registry)
    where = {issue.loc for issue in info.value.issues}
    assert where == {
        "encoder.attention.backend.kernel",
        "encoder.attention.backend.window",
        # the override keeps the encoder-wide kernel (same component), so its bad value shows there too
        "encoder.overrides.0.attention.backend.kernel",
        "encoder.overrides.0.attention.backend.window",
        "position.max_bias",
        # neither 'geometric' nor a list of positive numbers: pydantic names both members of the union
        "position.slopes.literal['geometric']",
        "position.slopes.list[constrained-float]",
    }
    text = str(info.value)
    assert "encoder.attention.backend.window: Input should be greater than or equal to 0" in text
    assert "encoder.attention.backend.kernel: Input should be 'sdpa' or 'eager'" in text


def test_a_misspelt_plugin_component_name_gets_a_hint(registry):
    with pytest.raises(bertblocks.config.ConfigError) as info:
        bertblocks.load_config(_config(position="alibii", backend="locl"), registry=registry)
    messages = [str(issue) for issue in info.value.issues]
    assert messages[0].startswith("position: unknown position 'alibii'; available: absolute, alibi,")
    assert messages[0].endswith("(did you mean 'alibi'?)")
    assert messages[1].endswith("(did you mean 'local'?)")


def test_validated_config_shows_the_plugins_defaults(registry):
    config = bertblocks.load_config(_config(position="alibi", backend="local"), registry=registry)
    assert config.position.options() == {"slopes": "geometric", "max_bias": 8.0}
    assert config.encoder.attention.backend.options() == {"window": 128, "kernel": "sdpa"}


def test_explicit_slopes_must_match_the_head_count(registry):
    with pytest.raises(ValueError, match="alibi: slopes lists 3 values but the layer has 4 heads"):
        _model(_config(position={"name": "alibi", "slopes": [0.5, 0.25, 0.125]}), registry)


# ------------------------------------------------------------------------------- composition, per layer
def test_composed_with_builtins_in_one_model(registry):
    """alibi + local with built-in embeddings, attention, feed-forward, activation and mean pooler; trains."""
    config = _config(position="alibi", backend={"name": "local", "window": 3}, num_layers=2)
    config["encoder"]["feedforward"]["activation"] = "gelu_new"
    config["pooler"] = "mean"
    model = _model(config, registry).train()
    out = model(**batch())
    assert out.last_hidden_state.shape == (3, 9, 32)
    assert out.pooler_output.shape == (3, 32)
    (out.last_hidden_state.mean() + out.pooler_output.mean()).backward()
    assert all(p.grad is not None for p in model.parameters())
    # ALiBi adds no position table, and no weights: the keys are those of a BERT without position embeddings
    keys = set(model.state_dict())
    assert not any("position_embeddings" in k or "distance_embedding" in k or "alibi" in k for k in keys)


def test_local_backend_under_a_builtin_relative_scheme_matches_transformers_4(registry):
    """The plugin's backend takes the built-in relative bias through its mask: with a window covering the
    sequence, a transformers 4 relative_key_query checkpoint gives transformers 4's numbers (golden fixture)."""
    directory = V4 / "relative_key_query"
    io = load_file(directory / "io.safetensors")
    ours = bertblocks.from_pretrained(
        directory, ["encoder.attention.backend={name: local, window: 64}"], registry=registry
    )
    assert isinstance(ours.encoder.layer[0].attention.backend, LocalAttentionBackend)
    inputs = {k: io[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        mine = ours.eval()(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    assert_close(mine[real], io["last_hidden_state"][real])


def test_usable_per_layer(registry, tmp_path):
    overrides = [{"layers": 1, "attention": {"backend": {"name": "local", "window": 1, "kernel": "eager"}}}]
    config = _config(position="alibi", backend="sdpa", overrides=overrides)
    model = _model(config, registry)
    first, second = (layer.attention.backend for layer in model.encoder.layer)
    assert isinstance(first, SdpaBackend)
    assert isinstance(second, LocalAttentionBackend)
    assert (second.window, second.kernel) == (1, "eager")
    # the override is the only difference: a wide window in layer 1 gives the all-sdpa model's numbers exactly
    wide = copy.deepcopy(config)
    wide["encoder"]["overrides"][0]["attention"]["backend"]["window"] = 64
    inputs = batch()
    with torch.no_grad():
        plain = _model(_config(position="alibi"), registry)(**inputs).last_hidden_state
        assert_close(_model(wide, registry)(**inputs).last_hidden_state, plain)
        assert max_diff(model(**inputs).last_hidden_state, plain) > 1e-2
    # the per-layer choice survives an HF-format checkpoint
    model.save_pretrained(tmp_path)
    loaded = bertblocks.from_pretrained(tmp_path, registry=registry).eval()
    assert loaded.config.encoder.overrides == model.config.encoder.overrides
    with torch.no_grad():  # a reload into the same modules: the same kernels on the same data
        assert torch.equal(loaded(**inputs).last_hidden_state, model(**inputs).last_hidden_state)


# ------------------------------------------------------------------------------------------------ ALiBi
def _paper_slopes(n: int) -> list[float]:
    """The ALiBi authors' reference ``get_slopes`` (github.com/ofirpress/attention_with_linear_biases)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [1, 2, 4, 6, 8, 12, 16])
def test_geometric_slopes_match_the_papers_code_and_bloom(heads):
    ours = torch.tensor(alibi_slopes(heads))
    # closed formulas in float64, no GEMM: tighter than the fp32 policy
    assert torch.allclose(ours, torch.tensor(_paper_slopes(heads)), rtol=1e-12, atol=0)
    # transformers' BLOOM builds slope * position; position 1 gives the slopes
    bloom = build_alibi_tensor(torch.ones(1, 2), heads, torch.float64)[:, 0, 1]
    assert torch.allclose(ours.double(), bloom, rtol=1e-6, atol=0)


def test_max_bias_scales_the_exponent():
    assert alibi_slopes(4, max_bias=4.0) == [2.0**-1, 2.0**-2, 2.0**-3, 2.0**-4]


def _reference_alibi_forward(model: bertblocks.BertModel, inputs: dict, slopes: torch.Tensor) -> torch.Tensor:
    """BERT with ALiBi written out: explicit softmax attention with ``-m_h·|i-j|`` on the scaled scores."""
    emb = model.embeddings
    ids, types, mask = inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"]
    h = emb.LayerNorm(emb.word_embeddings(ids) + emb.token_type_embeddings(types))  # no position embedding
    b, q, hidden = h.shape
    heads = model.config.encoder.attention.num_heads
    d = hidden // heads
    pos = torch.arange(q)
    bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs()  # [h, q, k]
    pad = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min  # [b, 1, 1, k]
    for layer in model.encoder.layer:
        att = layer.attention

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, q, heads, d).transpose(1, 2)

        Q, K, V = (split(getattr(att.self, n)(h)) for n in ("query", "key", "value"))
        scores = Q @ K.transpose(-1, -2) / math.sqrt(d) + bias + pad
        context = (torch.softmax(scores, dim=-1) @ V).transpose(1, 2).reshape(b, q, hidden)
        h = att.output.LayerNorm(att.output.dense(context) + h)
        inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(h))
        h = layer.output.LayerNorm(layer.output.dense(inner) + h)
    return h


@pytest.mark.parametrize("backend", ["eager", "sdpa", "local"])
@pytest.mark.parametrize("max_bias", [8.0, 2.0])
def test_alibi_model_matches_a_reference_written_out(registry, backend, max_bias):
    model = _model(_config(position={"name": "alibi", "max_bias": max_bias}, backend=backend), registry)
    inputs = batch()
    slopes = torch.tensor([2.0 ** (-max_bias * i / 4) for i in range(1, 5)])  # the paper's, 4 heads
    with torch.no_grad():
        want = _reference_alibi_forward(model, inputs, slopes)
        got = model(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    assert_close(got[real], want[real])
    # and the bias matters: without it the numbers are far off
    with torch.no_grad():
        flat = _reference_alibi_forward(model, inputs, torch.zeros(4))
    assert max_diff(flat[real], want[real]) > 1e-2


def test_alibi_is_translation_invariant(registry):
    """Only distances matter: a sequence gives the same outputs wherever it sits behind left padding."""
    model = _model(_config(position="alibi"), registry)
    ids = batch()["input_ids"][:1, :6]
    shifted = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)], dim=1)
    with torch.no_grad():
        plain = model(input_ids=ids).last_hidden_state
        padded = model(input_ids=shifted, attention_mask=mask, token_type_ids=torch.zeros_like(shifted))
    assert_close(padded.last_hidden_state[:, 3:], plain)


def test_alibi_options_model_forbids_extra_keys():
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        AlibiOptions.model_validate({"slope": "geometric"})


# ------------------------------------------------------------------------------------------------ local
def _qkv(q: int = 9, k: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 4, n, 8, generator=g) * 2 for n in (q, k, k))  # type: ignore[return-value]


def _call(backend, query, key, value, mask=None, is_causal=False, need_weights=False):
    return backend(
        query, key, value, mask=mask, scale=8**-0.5, dropout_p=0.0, is_causal=is_causal, need_weights=need_weights
    )


def _padding(k: int = 9) -> torch.Tensor:
    mask = torch.zeros(2, 1, 1, k)
    mask[1, ..., -4:] = torch.finfo(torch.float32).min
    return mask


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
@pytest.mark.parametrize("window", [8, 9, 100])
def test_a_window_covering_the_sequence_equals_the_plain_kernel_exactly(kernel, window):
    plain = SdpaBackend() if kernel == "sdpa" else EagerBackend()
    local = LocalAttentionBackend(window, kernel)
    query, key, value = _qkv()
    for mask in (None, _padding()):  # the window masks nothing: the plain kernel runs on the same inputs
        assert torch.equal(_call(local, query, key, value, mask)[0], _call(plain, query, key, value, mask)[0])


def test_local_model_with_a_wide_window_equals_the_sdpa_model_exactly(registry):
    # padded on both sides: packed, sdpa would take its varlen kernel (unmasked calls, other last bits)
    inputs = batch()
    with torch.no_grad():
        local = _model(_config(backend={"name": "local", "window": 8}, packing="never"), registry)
        sdpa = _model(_config(backend="sdpa", packing="never"), registry)
        assert torch.equal(local(**inputs).last_hidden_state, sdpa(**inputs).last_hidden_state)


def _band_reference(q: int, k: int, window: int, causal: bool = False) -> torch.Tensor:
    """The additive band mask spelled out with loops: query row r sits at position k - q + r."""
    mask = torch.zeros(q, k)
    for r in range(q):
        i = k - q + r
        for j in range(k):
            if abs(i - j) > window or (causal and j > i):
                mask[r, j] = torch.finfo(torch.float32).min
    return mask


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
@pytest.mark.parametrize("window", [0, 1, 3])
def test_a_narrow_window_equals_eager_with_an_explicit_band(kernel, window):
    local = LocalAttentionBackend(window, kernel)
    query, key, value = _qkv()
    band = _band_reference(9, 9, window)
    for mask in (None, _padding()):
        want = _call(EagerBackend(), query, key, value, band if mask is None else torch.minimum(band, mask))[0]
        assert_close(_call(local, query, key, value, mask)[0], want)
    # fewer queries than keys (after a cache), causal: the band is aligned bottom-right
    tail = query[:, :, 6:]
    want = _call(EagerBackend(), tail, key, value, _band_reference(3, 9, window, causal=True))[0]
    assert_close(_call(local, tail, key, value, is_causal=True)[0], want)


def test_a_narrow_window_blocks_far_tokens(registry):
    model = _model(_config(backend={"name": "local", "window": 1}, num_layers=2), registry)
    ids = batch()["input_ids"][:1]
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)  # the explicit path, for the probabilities
        base = model(input_ids=ids).last_hidden_state
        # two layers of window 1: position 0 sees positions 0..2, nothing farther
        far = ids.clone()
        far[0, 3:] = (far[0, 3:] % 98) + 1
        near = ids.clone()
        near[0, 2] = (near[0, 2] % 98) + 1
        # tokens beyond the window get probability exactly 0, so they add exact zeros: bit-equal
        assert torch.equal(model(input_ids=far).last_hidden_state[0, 0], base[0, 0])
        assert max_diff(model(input_ids=near).last_hidden_state[0, 0], base[0, 0]) > 1e-3
    for weights in out.attentions:  # probabilities beyond the window are exactly zero
        distance = (torch.arange(9)[:, None] - torch.arange(9)[None, :]).abs()
        assert torch.all(weights[..., distance > 1] == 0)
        assert torch.all(weights[..., distance <= 1] > 0)


# ------------------------------------------------------------------------------- conformance, narrow window
NARROW = {("backend", "local"): {"window": 1, "kernel": "eager"}}


def _narrow_reference(query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):
    """The plugin's own reference for window 1: eager softmax over the explicit band (loops, above), which hides
    what it hides whatever the mask adds there."""
    band = _band_reference(query.shape[-2], key.shape[-2], 1, causal=is_causal)
    full = band if mask is None else torch.where(band < 0, band, mask)
    return EagerBackend()(
        query, key, value, mask=full, scale=scale, dropout_p=dropout_p, is_causal=False, need_weights=need_weights
    )


@pytest.mark.parametrize("check", [c.name for c in ConformanceSuite().checks if "backend" in c.kinds and not c.slow])
def test_a_narrow_local_backend_honours_the_interface(registry, check):
    """Every check, against the plugin's own reference (no exclusions); compile runs in test_conformance."""
    suite = ConformanceSuite(registry, options=NARROW, reference=_narrow_reference)
    (case,) = suite.cases(kinds=["backend"], names=["local"], include=[check])
    case.run()
