"""Layer kinds (post_ln, pre_ln, parallel), norms (layernorm with/without bias, rmsnorm), the glu feed-forward
and cross-layer sharing: each against a reference written out here from the model's own weights."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from bertblocks import BertModel, create_model, load_config
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import config_to_hf
from tests.conftest import TINY
from tests.tolerances import OUTPUT_ATOL, assert_close

torch.set_default_dtype(torch.float32)


def _config(**encoder: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(TINY)
    cfg["initializer_range"] = 0.2
    cfg["encoder"].update(encoder)
    return cfg


def _model(seed: int = 0, **encoder: Any) -> BertModel:
    torch.manual_seed(seed)
    return create_model(_config(**encoder)).eval()


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, -3:] = 0
    mask[2, -5:] = 0
    return {"input_ids": torch.randint(1, 99, (3, 9), generator=g), "attention_mask": mask}


def _perturb(model: BertModel, seed: int = 1) -> None:
    """Random norm weights and biases (they start at 1 and 0, which would hide a missing or misplaced norm)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if name.endswith("weight") else 0.0))


# ------------------------------------------------------------------------------- written-out references
def _ln(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    if isinstance(norm, torch.nn.Identity):
        return x
    if isinstance(norm, torch.nn.LayerNorm):
        return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)
    return norm.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)  # rmsnorm


def _linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    out = x @ layer.weight.T
    return out + layer.bias if layer.bias is not None else out


def _attention(x: torch.Tensor, attention: Any, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention written out: ``dense(softmax(QKᵀ/√d + mask) V)`` (no residual, no norm)."""
    b, q, _ = x.shape
    h = attention.num_heads
    d = attention.head_dim

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, q, h, d).transpose(1, 2)

    proj = attention.self
    scores = heads(_linear(x, proj.query)) @ heads(_linear(x, proj.key)).transpose(-1, -2) / d**0.5
    scores = scores + (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
    context = (scores.softmax(-1) @ heads(_linear(x, proj.value))).transpose(1, 2).reshape(b, q, h * d)
    return _linear(context, attention.output.dense)


def _feedforward(x: torch.Tensor, layer: Any) -> torch.Tensor:
    inter = layer.intermediate
    if hasattr(inter, "gate") or getattr(inter, "fused", False):
        if inter.fused:
            gate, up = _linear(x, inter.dense).chunk(2, dim=-1)
        else:
            gate, up = _linear(x, inter.gate), _linear(x, inter.up)
        hidden = inter.intermediate_act_fn(gate) * up
    else:
        hidden = F.gelu(_linear(x, inter.dense))
    return _linear(hidden, layer.output.dense)


@torch.no_grad()
def _reference(model: BertModel, batch: dict[str, torch.Tensor], kind: str) -> torch.Tensor:
    x = model.embeddings(batch["input_ids"], None, None, None)
    mask = batch["attention_mask"]
    enc = model.encoder
    for i in range(enc.num_layers):
        layer = enc.layer_at(i)
        if kind == "post_ln":
            x = _ln(x + _attention(x, layer.attention, mask), layer.attention.output.LayerNorm)
            x = _ln(x + _feedforward(x, layer), layer.output.LayerNorm)
        elif kind == "pre_ln":
            x = x + _attention(_ln(x, layer.attention_norm), layer.attention, mask)
            x = x + _feedforward(_ln(x, layer.feedforward_norm), layer)
        else:  # parallel
            a = _ln(x, layer.norm if layer.shared_norm else layer.attention_norm)
            f = _ln(x, layer.norm if layer.shared_norm else layer.feedforward_norm)
            x = x + _attention(a, layer.attention, mask) + _feedforward(f, layer)
    if enc.final_norm is not None:
        x = _ln(x, enc.final_norm)
    return x


def _close(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor, atol: float = OUTPUT_ATOL) -> None:
    keep = mask.bool()
    assert_close(got[keep], want[keep], atol=atol)


# ----------------------------------------------------------------------------------------------- post_ln
def test_post_ln_and_layernorm_spelled_out_are_bit_for_bit_the_default():
    batch = _batch()
    default = _model()
    spelled = _model(layer="post_ln", norm={"name": "layernorm", "bias": True})
    assert list(default.state_dict()) == list(spelled.state_dict())
    with torch.no_grad():
        # the defaults spelled out build the same modules: same kernels, same data
        assert torch.equal(default(**batch).last_hidden_state, spelled(**batch).last_hidden_state)
    assert "bertblocks" not in config_to_hf(spelled.config)  # the defaults say nothing in config.json


def test_post_ln_equals_the_written_out_reference():
    model = _model()
    _perturb(model)
    batch = _batch()
    with torch.no_grad():
        got = model(**batch).last_hidden_state
    _close(got, _reference(model, batch, "post_ln"), batch["attention_mask"])


# ------------------------------------------------------------------------------------ pre_ln / parallel
@pytest.mark.parametrize(
    ("encoder", "kind"),
    [
        ({"layer": "pre_ln"}, "pre_ln"),
        ({"layer": {"name": "pre_ln", "first_attention_norm": False}, "norm": "rmsnorm"}, "pre_ln"),
        ({"layer": "parallel"}, "parallel"),
        (
            {"layer": {"name": "parallel", "shared_norm": False}, "norm": {"name": "layernorm", "bias": False}},
            "parallel",
        ),
        (
            {"layer": "pre_ln", "feedforward": {"name": "glu", "activation": "swiglu", "intermediate_size": 24}},
            "pre_ln",
        ),
    ],
    ids=["pre_ln", "pre_ln-rms-no-first-norm", "parallel", "parallel-two-norms-no-bias", "pre_ln-swiglu"],
)
def test_layer_kind_equals_the_written_out_reference(encoder, kind):
    model = _model(**encoder)
    _perturb(model)
    batch = _batch()
    with torch.no_grad():
        got = model(**batch).last_hidden_state
    _close(got, _reference(model, batch, kind), batch["attention_mask"])


def test_pre_ln_keys_final_norm_and_the_missing_first_norm():
    model = _model(layer={"name": "pre_ln", "first_attention_norm": False})
    keys = set(model.state_dict())
    assert {"encoder.final_norm.weight", "encoder.final_norm.bias"} <= keys
    assert "encoder.layer.0.attention_norm.weight" not in keys  # ModernBERT's layer 0: no attention norm
    assert {"encoder.layer.1.attention_norm.weight", "encoder.layer.0.feedforward_norm.weight"} <= keys
    assert not any("attention.output.LayerNorm" in k or ".output.LayerNorm" in k for k in keys)
    no_final = _model(layer={"name": "pre_ln", "final_norm": False})
    assert no_final.encoder.final_norm is None


def test_final_norm_is_in_the_last_hidden_states_entry():
    # transformers 5 ties hidden_states[-1] to last_hidden_state (its ModernBERT, final norm included)
    model = _model(layer="pre_ln")
    _perturb(model)
    with torch.no_grad():
        batch = _batch()
        out = model(**batch, output_hidden_states=True)
        assert len(out.hidden_states) == model.encoder.num_layers + 1
        assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
        norm, model.encoder.final_norm = model.encoder.final_norm, None
        unnormed = model(**batch).last_hidden_state
        _close(norm(unnormed), out.last_hidden_state, batch["attention_mask"])
        assert (unnormed - out.last_hidden_state).abs().max() > 0.1


# ------------------------------------------------------------------------------------------------ norms
def test_rmsnorm_equals_a_reference_and_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    model = _model(norm="rmsnorm")
    norm = model.encoder.layer[0].output.LayerNorm  # HF's key, whatever the norm kind
    assert "output.LayerNorm.bias" not in str(list(model.state_dict()))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32, generator=g))
        x = torch.randn(2, 5, 32, generator=g) * 3
        want = norm.weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + norm.eps)
        assert_close(norm(x), want)
        llama = LlamaRMSNorm(32, eps=norm.eps)
        llama.weight.copy_(norm.weight)
        assert_close(norm(x), llama(x))
        half = x.to(torch.bfloat16)
        assert norm.to(torch.bfloat16)(half).dtype == torch.bfloat16


def test_layernorm_without_bias_initialises_and_loads(tmp_path):
    model = _model(norm={"name": "layernorm", "bias": False}, layer="pre_ln")
    assert not any(k.endswith("norm.bias") for k in model.state_dict())
    assert torch.equal(model.encoder.final_norm.weight, torch.ones(32))
    model.save_pretrained(tmp_path)
    loaded, info = BertModel.from_pretrained(tmp_path, output_loading_info=True)
    loaded.eval()
    assert not info.missing_keys
    assert not info.unexpected_keys
    batch = _batch()
    with torch.no_grad():
        # the same weights in the same model class: the same kernels on the same data, so bit-equal
        _close(loaded(**batch).last_hidden_state, model(**batch).last_hidden_state, batch["attention_mask"], 0.0)


# -------------------------------------------------------------------------------------------------- glu
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize(("activation", "gate"), [("geglu", F.gelu), ("swiglu", F.silu), ("reglu", F.relu)])
def test_glu_equals_the_written_out_formula(fused, activation, gate):
    ff = {"name": "glu", "activation": activation, "intermediate_size": 24, "fused": fused}
    model = _model(feedforward=ff)
    layer = model.encoder.layer[0]
    inter = layer.intermediate
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 32, generator=g)
    with torch.no_grad():
        if fused:
            assert inter.dense.weight.shape == (48, 32)
            w_gate, w_up = inter.dense.weight[:24], inter.dense.weight[24:]
            b_gate, b_up = inter.dense.bias[:24], inter.dense.bias[24:]
        else:
            w_gate, w_up, b_gate, b_up = inter.gate.weight, inter.up.weight, inter.gate.bias, inter.up.bias
        want = gate(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)
        assert_close(inter(x), want)  # one fused GEMM vs two: fp32 parity


def test_fused_glu_is_transformers_modernbert_mlp():
    from transformers import ModernBertConfig
    from transformers.models.modernbert.modeling_modernbert import ModernBertMLP

    hf = ModernBertMLP(
        ModernBertConfig(hidden_size=32, intermediate_size=24, hidden_activation="gelu", mlp_bias=False)
    ).eval()
    model = _model(
        layer="pre_ln",
        feedforward={"name": "glu", "activation": "geglu", "intermediate_size": 24, "fused": True, "bias": False},
    )
    layer = model.encoder.layer[0]
    with torch.no_grad():
        layer.intermediate.dense.weight.copy_(hf.Wi.weight)
        layer.output.dense.weight.copy_(hf.Wo.weight)
        x = torch.randn(2, 5, 32)
        assert_close(layer.output(layer.intermediate(x), x), hf(x))


def test_feedforward_bias_off():
    model = _model(feedforward={"name": "bert", "bias": False})
    keys = set(model.state_dict())
    assert "encoder.layer.0.intermediate.dense.weight" in keys
    assert not any(
        k.endswith(("intermediate.dense.bias", "output.dense.bias")) and ".attention." not in k for k in keys
    )


# ---------------------------------------------------------------------------------------------- sharing
def test_sharing_has_n_times_fewer_layer_parameters_and_equals_copies():
    shared = _model(num_layers=4, num_layer_groups=1)
    plain = _model(num_layers=4)
    per_layer = sum(p.numel() for p in plain.encoder.layer[0].parameters())
    assert sum(p.numel() for p in plain.encoder.parameters()) == 4 * per_layer
    assert sum(p.numel() for p in shared.encoder.parameters()) == per_layer
    assert not any(k.startswith("encoder.layer.1.") for k in shared.state_dict())
    _perturb(shared)
    # four copies of the one shared layer in an unshared model
    state = {k: v for k, v in shared.state_dict().items() if not k.startswith("encoder.layer.")}
    for i in range(4):
        state.update(
            {
                k.replace("encoder.layer.0.", f"encoder.layer.{i}."): v
                for k, v in shared.state_dict().items()
                if k.startswith("encoder.layer.0.")
            }
        )
    plain.load_state_dict(state)
    batch = _batch()
    with torch.no_grad():
        a = shared(**batch, output_hidden_states=True, output_attentions=True)
        b = plain(**batch, output_hidden_states=True, output_attentions=True)
    # the same weights run through the same modules in the same order: bit-equal
    assert torch.equal(a.last_hidden_state, b.last_hidden_state)
    assert len(a.hidden_states) == 5
    assert len(a.attentions) == 4


def test_sharing_groups_follow_albert():
    model = _model(num_layers=6, num_layer_groups=2)
    assert len(model.encoder.layer) == 2
    assert model.encoder.groups == (0, 0, 0, 1, 1, 1)  # ALBERT: int(i / (num_layers / groups))


def test_sharing_with_pruning_head_mask_checkpointing_and_reload(tmp_path):
    model = _model(num_layers=4, num_layer_groups=2)
    model.prune_heads({0: [1]})  # prunes group 0, so layers 0 and 1
    assert [model.encoder.layer_at(i).attention.num_heads for i in range(4)] == [3, 3, 4, 4]
    model.save_pretrained(tmp_path)
    loaded = BertModel.from_pretrained(tmp_path).eval()
    batch = _batch()
    head_mask = torch.ones(4, 4)
    head_mask[3, 2] = 0.0
    with torch.no_grad():
        _close(  # a reload into the same model class: same kernels, same data, so bit-equal
            loaded(**batch, head_mask=head_mask).last_hidden_state,
            model(**batch, head_mask=head_mask).last_hidden_state,
            batch["attention_mask"],
            0.0,
        )
    model.train()
    model.gradient_checkpointing_enable()
    out = model(**batch)
    (out.last_hidden_state.sum() + out.pooler_output.sum()).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_pre_ln_decoder_cache_equals_one_pass():
    cfg = _config(layer="pre_ln", norm="rmsnorm", feedforward={"name": "glu", "activation": "swiglu"})
    cfg.update({"is_decoder": True, "add_cross_attention": True})
    torch.manual_seed(0)
    model = create_model(cfg).eval()
    ids = torch.randint(1, 99, (2, 7))
    encoder_states = torch.randn(2, 4, 32)
    with torch.no_grad():
        full = model(ids, encoder_hidden_states=encoder_states).last_hidden_state
        first = model(ids[:, :4], encoder_hidden_states=encoder_states, use_cache=True)
        rest = model(ids[:, 4:], encoder_hidden_states=encoder_states, past_key_values=first.past_key_values)
    assert_close(rest.last_hidden_state, full[:, 4:])
    assert "encoder.layer.0.crossattention_norm.weight" in model.state_dict()


# ------------------------------------------------------------------------------------------- bad input
def _issues(encoder: dict[str, Any], **top: Any) -> str:
    cfg = _config(**encoder)
    cfg.update(top)
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    return str(info.value)


def test_final_norm_on_a_post_ln_stack_is_an_error_at_validate():
    message = _issues({"layer": {"name": "post_ln", "final_norm": True}})
    assert "encoder.layer.final_norm: a post_ln stack already ends with a norm" in message


def test_sharing_with_overrides_that_differ_is_an_error_at_validate():
    message = _issues(
        {"num_layers": 4, "num_layer_groups": 2, "overrides": [{"layers": 1, "attention": {"backend": "eager"}}]}
    )
    assert "encoder.overrides.0: changes attention of layer 1 but not of layer 0" in message
    # the same override over a whole group is fine
    load_config(
        _config(num_layers=4, num_layer_groups=2, overrides=[{"layers": "0-1", "attention": {"backend": "eager"}}])
    )
    assert "num_layer_groups: is 5, more than num_layers 2" in _issues({"num_layer_groups": 5})


def test_parallel_layer_with_cross_attention_is_an_error_at_validate():
    message = _issues({"layer": "parallel"}, is_decoder=True, add_cross_attention=True)
    assert "encoder.layer: a parallel layer has no cross-attention sub-layer" in message


def test_gated_activation_names_are_the_gates_activation():
    # the gating is the glu block's: on the plain block the name is just its gate's element-wise activation
    plain = _model(feedforward={"activation": "swiglu"})
    assert isinstance(plain.encoder.layer[0].intermediate.intermediate_act_fn, torch.nn.SiLU)


def test_overrides_cover_every_kind_and_refuse_unknown_keys():
    config = load_config(
        _config(overrides=[{"layers": 1, "layer": "pre_ln", "norm": "rmsnorm", "feedforward": {"name": "glu"}}])
    )
    assert config.encoder.layer_spec(1, "layer").name == "pre_ln"
    assert config.encoder.layer_spec(1, "norm").name == "rmsnorm"
    assert config.encoder.layer_spec(0, "layer").name == "post_ln"
    model = create_model(config)
    assert type(model.encoder.layer[0]).__name__ == "TransformerLayer"
    assert type(model.encoder.layer[1]).__name__ == "PreLNLayer"
    unknown = _issues({"overrides": [{"layers": 1, "layer": "pre_lm"}]})
    assert "encoder.overrides.0.layer: unknown layer 'pre_lm'" in unknown
    assert "did you mean 'pre_ln'" in unknown

    assert "encoder.overrides.0.nrom: unknown field" in _issues({"overrides": [{"layers": 1, "nrom": "rmsnorm"}]})
    assert "encoder.layer.first_attention_norms: unknown field" in _issues(
        {"layer": {"name": "pre_ln", "first_attention_norms": False}}
    )


# ------------------------------------------------------------------------------------------------- cli
def test_summary_line_names_glu_plugin_attention_layer_and_sharing(tmp_path, capsys):
    import yaml

    from bertblocks import cli

    cfg = _config(
        layer="pre_ln", norm="rmsnorm", num_layer_groups=1, feedforward={"name": "glu", "activation": "swiglu"}
    )
    path = tmp_path / "modern.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "feed-forward glu 3072 swiglu" in out
    assert "layer pre_ln rmsnorm" in out
    assert "1 shared layer group" in out
    from bertblocks.cli.commands import _summary

    named = load_config(_config(attention={"num_heads": 4, "name": "bert"}))
    assert "4 heads," in _summary(named)  # the default attention is not named
    plugin_attention = named.model_copy(deep=True)
    plugin_attention.encoder.attention.name = "gated"
    assert "4 heads gated" in _summary(plugin_attention)


def test_components_verbose_shows_real_types_and_descriptions(capsys):
    from bertblocks import cli

    assert cli.main(["components", "layer", "-v"]) == 0
    out = capsys.readouterr().out
    assert "layer pre_ln: first_attention_norm (bool, default True): norm the input of layer 0's attention" in out
    assert "Optional" not in out


# ------------------------------------------------------------------------------------- ablation support
def test_analytic_flops_of_glu_and_pre_ln_match_the_flop_counter():
    from bertblocks.ablation.flops import analytic_flops_per_token, counted_flops

    config = load_config(
        _config(layer="pre_ln", num_layer_groups=1, feedforward={"name": "glu", "intermediate_size": 24})
    )
    model = create_model(config)
    counted = counted_flops(model, 2, 16, config.vocab_size) / 32
    analytic = analytic_flops_per_token(config, 16)
    assert analytic.note == ""
    assert analytic.per_token == pytest.approx(counted, rel=1e-9)


def test_the_modern_encoder_study_validates_at_equal_parameters():
    from pathlib import Path

    from bertblocks.ablation import load_study

    path = Path(__file__).parents[1] / "examples" / "studies" / "modern-encoder.yaml"
    assert path.read_text().startswith("# modern-encoder: ")
    study = load_study(path)
    assert [v.name for v in study.variants] == [
        "bert",
        "pre_ln",
        "pre_ln-swiglu",
        "pre_ln-swiglu-rmsnorm",
        "pre_ln-swiglu-rmsnorm-rope",
    ]
    counts = [create_model(v.config).num_parameters() for v in study.variants]
    assert max(counts) / min(counts) < 1.002  # equal parameter count, within 0.2 %


def test_a_per_layer_position_override_acts_in_that_layers_attention():
    model = _model(overrides=[{"layers": 1, "position": "relative_key"}])
    keys = set(model.state_dict())
    assert "embeddings.position_embeddings.weight" in keys  # the model-wide scheme stays in the embeddings
    assert "encoder.layer.1.attention.self.distance_embedding.weight" in keys
    assert "encoder.layer.0.attention.self.distance_embedding.weight" not in keys


def test_a_task_head_on_a_swiglu_model_uses_the_gate_activation():

    cfg = _config(layer="pre_ln", feedforward={"name": "glu", "activation": "swiglu", "intermediate_size": 24})
    model = create_model(cfg, head="masked_lm").eval()
    assert any(isinstance(m, torch.nn.SiLU) for m in model.cls.modules())
    batch = _batch()
    out = model(**batch, labels=batch["input_ids"])
    assert torch.isfinite(out.loss)


def test_diagram_labels_name_the_layer_kind_and_norm_and_hide_default_options():
    from bertblocks.introspect import layer_groups

    config = load_config(_config(overrides=[{"layers": 1, "layer": "pre_ln", "norm": {"bias": False}}]))
    (first, _, plain), (second, _, modern) = layer_groups(config)
    assert (first, second) == (0, 1)
    assert "layer:" not in plain
    assert "bias=True" not in plain  # a default option is not news
    assert "layer: pre_ln · norm: layernorm, bias=False" in modern
