"""GTE in both config formats.

* ``model_type: gte`` (transformers' own ``GteConfig``/``GteModel``): the rows ``gte`` and ``gte-ntk`` of the
  shared family table (``tests/families/reference.py``) give parity both ways with every transformers class, and run
  the shared tests and every per-family path (packed and padded under both paddings, hidden states and attentions,
  in-memory names, refusals, tokenizer convention, presets; packing, compile, embed, CLI, ablation). Here: what only
  GTE does with them (other activations, the class defaults, NTK scaling read from and written as transformers'
  linear rope, gradients and training dropout against transformers).
* ``model_type: new`` (Alibaba's published remote-code format): transformers has no class for it, so the tests
  compare with a float64 reference of the published equations written out below (BERT's post-LN encoder with
  rotary positions, fixed NTK scaling, a packed QKV projection and a gated feed-forward), on tiny random checkpoints
  whose keys follow the published weight names; and every switch bertblocks cannot build is refused, naming it.

Also the three shared options GTE brought: ``rope``'s ``ntk_factor`` and ``glu``'s ``input_bias`` and
``dropout_at: both``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks import BertTokenizer
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.plugins.positions import RotaryEmbedding
from tests.families import test_tokenizers as toks
from tests.families.reference import FAMILIES, WrittenOutReference, batch, call_inputs, round_trip, save_hf
from tests.tolerances import assert_close, assert_grads_close

# ------------------------------------------------------------------------------------- transformers' gte
#: the table's rows (tests/families/reference.py): ``gte`` (two token types, a rope base far from the default) and
#: ``gte-ntk`` (gte-base-en-v1.5's shape: no token-type table, NTK scaling as transformers' linear rope_parameters)
GTE, SCALED = FAMILIES["gte"], FAMILIES["gte-ntk"]


@pytest.mark.parametrize(
    "extra",
    [
        {"hidden_act": "silu"},  # the gate's activation is hidden_act
        {"layer_norm_eps": 1e-5},
    ],
    ids=["silu-gate", "eps"],
)
def test_variants_match_both_ways(tmp_path, extra):
    round_trip(tmp_path, GTE, "GteForMaskedLM", **extra)


def test_config_maps_to_the_components_it_is_made_of():
    cfg = bertblocks.load_config(config_from_hf(GTE.hf_config()))
    assert cfg.position.name == "rope"
    assert cfg.position.options()["base"] == 30.0
    assert cfg.position.options()["ntk_factor"] == 1.0
    assert cfg.embedding.options().get("position_offset", "none") == "none"
    assert cfg.encoder.attention.options()["fused_qkv"] is True
    ff = cfg.encoder.feedforward
    assert (ff.name, ff.options()["input_bias"], ff.options()["bias"]) == ("glu", False, True)
    assert cfg.encoder.layer.name == "post_ln"
    assert cfg.pooler is None  # GteModel builds none
    back = config_to_hf(cfg)
    assert back["rope_parameters"] == {"rope_theta": 30.0, "rope_type": "default"}
    assert "bertblocks" not in back


def test_class_defaults_fill_a_sparse_config_json():
    cfg = bertblocks.load_config(config_from_hf({"model_type": "gte"}))
    theirs = transformers.GteConfig()
    assert cfg.vocab_size == theirs.vocab_size
    assert cfg.type_vocab_size == theirs.type_vocab_size
    assert cfg.max_position_embeddings == theirs.max_position_embeddings
    assert cfg.pad_token_id == theirs.pad_token_id
    assert cfg.encoder.attention.dropout == theirs.attention_probs_dropout_prob
    assert cfg.position.options()["base"] == theirs.rope_parameters["rope_theta"]


def test_linear_rope_scaling_is_read_as_ntk_scaling_and_written_back_as_linear():
    # transformers' linear scaling (base T, factor c) has the frequencies of NTK scaling by k = c^(d/2) of the base
    # T/k: bertblocks reads it as that (the gte-ntk row of the table gives transformers' numbers with it on every
    # path) and writes it back as linear, to rounding
    linear = SCALED.settings["rope_parameters"]
    assert linear == {"rope_theta": 400.0, "rope_type": "linear", "factor": 1.5}
    cfg = bertblocks.load_config(config_from_hf(SCALED.hf_config()))
    k = 1.5 ** (8 / 2)  # head size 8
    assert cfg.position.options()["ntk_factor"] == pytest.approx(k, rel=1e-12)
    assert cfg.position.options()["base"] == pytest.approx(400.0 / k, rel=1e-12)
    written = config_to_hf(cfg)["rope_parameters"]
    assert written["rope_type"] == "linear"
    assert written["factor"] == pytest.approx(1.5, rel=1e-12)
    assert written["rope_theta"] == pytest.approx(400.0, rel=1e-12)


# ------------------------------------------------------------------------------ Alibaba's format (``new``)
H, HEADS, INTER, VOCAB, LAYERS = 32, 4, 37, 99, 2
#: a published config.json's fields at test size (every field the published ones carry)
NEW_CONFIG: dict[str, Any] = {
    "architectures": ["NewModel"],
    "auto_map": {
        "AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
        "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel",
        "AutoModelForMaskedLM": "Alibaba-NLP/new-impl--modeling.NewForMaskedLM",
        "AutoModelForSequenceClassification": "Alibaba-NLP/new-impl--modeling.NewForSequenceClassification",
        "AutoModelForTokenClassification": "Alibaba-NLP/new-impl--modeling.NewForTokenClassification",
    },
    "attention_probs_dropout_prob": 0.0,
    "classifier_dropout": None,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": H,
    "initializer_range": 0.02,
    "intermediate_size": INTER,
    "layer_norm_eps": 1e-12,
    "layer_norm_type": "layer_norm",
    "logn_attention_clip1": False,
    "logn_attention_scale": False,
    "max_position_embeddings": 64,
    "model_type": "new",
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "pack_qkv": True,
    "pad_token_id": 0,
    "position_embedding_type": "rope",
    # a small base and a large factor: both change every frequency a 9-token batch reads
    "rope_scaling": {"factor": 8.0, "type": "ntk"},
    "rope_theta": 50.0,
    "torch_dtype": "float32",
    "type_vocab_size": 2,
    "unpad_inputs": False,
    "use_memory_efficient_attention": False,
    "vocab_size": VOCAB,
}
NEW_CLASSES = ("NewModel", "NewForMaskedLM", "NewForSequenceClassification", "NewForTokenClassification")
LENGTH, REAL, LABELS = 9, 5, 3


def published_weights(cls: str, config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """A random checkpoint under the published names: the backbone bare (``NewModel``) or under ``new.``."""
    g = torch.Generator().manual_seed(seed)

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    def norm(name: str) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": 1 + t(H), f"{name}.bias": t(H)}

    prefix = "" if cls == "NewModel" else "new."
    vocab = config["vocab_size"]
    w: dict[str, torch.Tensor] = {"embeddings.word_embeddings.weight": t(vocab, H), **norm("embeddings.LayerNorm")}
    if config["type_vocab_size"]:
        w["embeddings.token_type_embeddings.weight"] = t(config["type_vocab_size"], H)
    for i in range(LAYERS):
        layer = f"encoder.layer.{i}"
        w |= {f"{layer}.attention.qkv_proj.weight": t(3 * H, H), f"{layer}.attention.qkv_proj.bias": t(3 * H)}
        w |= {f"{layer}.attention.o_proj.weight": t(H, H), f"{layer}.attention.o_proj.bias": t(H)}
        w |= {f"{layer}.mlp.up_gate_proj.weight": t(2 * INTER, H)}
        w |= {f"{layer}.mlp.down_proj.weight": t(H, INTER), f"{layer}.mlp.down_proj.bias": t(H)}
        w |= norm(f"{layer}.attn_ln") | norm(f"{layer}.mlp_ln")
    if cls == "NewForSequenceClassification":
        w |= {"pooler.dense.weight": t(H, H), "pooler.dense.bias": t(H)}
    out = {prefix + k: v for k, v in w.items()}
    if cls == "NewForMaskedLM":  # the decoder's weight is the tied word embeddings (not stored)
        out |= {"lm_head.dense.weight": t(H, H), "lm_head.dense.bias": t(H), **norm("lm_head.norm")}
        out["lm_head.decoder.bias"] = t(vocab)
    if cls in ("NewForSequenceClassification", "NewForTokenClassification"):
        out |= {"classifier.weight": t(LABELS, H), "classifier.bias": t(LABELS)}
    return out


def published_checkpoint(directory: Path, cls: str, **changes: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A published-format checkpoint of ``cls`` (config changed by ``changes``) written to ``directory``."""
    config = {**NEW_CONFIG, **changes, "architectures": [cls]}
    if cls != "NewModel" and cls != "NewForMaskedLM":
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(LABELS)}
    weights = published_weights(cls, config)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, directory / "model.safetensors")
    return config, weights


def _layer_norm(x: torch.Tensor, w: dict[str, torch.Tensor], name: str, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def reference(
    config: dict[str, Any], weights: dict[str, torch.Tensor], ids: torch.Tensor, mask: torch.Tensor, types: Any
) -> dict[str, torch.Tensor]:
    """The published GTE equations in float64: ``last_hidden_state`` and the head's ``logits`` if any.

    Embeddings: ``LN(word[ids] + type[types])`` (no type table when ``type_vocab_size`` is 0). Each layer (post-LN):
    ``h = LN(h + o_proj(attn(h)))``, ``h = LN(h + down(act(gate) · up))`` with ``up, gate`` the two halves of
    ``up_gate_proj(h)``; attention over the packed ``qkv_proj`` with rotary positions (halves rotated,
    ``rotate_half``), scaled by ``1/√d``, padded keys masked. Rotary frequencies with fixed NTK scaling by ``k``:
    ``θ_i = (rope_theta·k)^(-2i/d) / k^(2/d)``. Heads: masked LM ``decoder(LN(gelu(dense(h))))`` with the decoder tied
    to the word embeddings; sequence classifier ``classifier(tanh(pooler(h[:, 0])))``; token classifier
    ``classifier(h)``.
    """
    w = {k.removeprefix("new."): v.double() for k, v in weights.items()}
    eps, d = config["layer_norm_eps"], H // HEADS
    b, n = ids.shape
    x = w["embeddings.word_embeddings.weight"][ids]
    if config["type_vocab_size"]:
        x = x + w["embeddings.token_type_embeddings.weight"][types if types is not None else torch.zeros_like(ids)]
    h = _layer_norm(x, w, "embeddings.LayerNorm", eps)
    k = (config.get("rope_scaling") or {}).get("factor", 1.0)
    i = torch.arange(0, d, 2, dtype=torch.float64)
    inv_freq = (config["rope_theta"] * k) ** (-i / d) / k ** (2 / d)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq  # [n, d/2]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()  # [n, d]

    def rotate(t: torch.Tensor) -> torch.Tensor:  # [b, heads, n, d]
        return t * cos + torch.cat((-t[..., d // 2 :], t[..., : d // 2]), -1) * sin

    act = {"gelu": _gelu, "silu": torch.nn.functional.silu}[config["hidden_act"]]
    bias = torch.zeros(b, 1, 1, n, dtype=torch.float64).masked_fill(mask[:, None, None, :] == 0, -math.inf)
    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}"
        qkv = h @ w[f"{p}.attention.qkv_proj.weight"].T + w[f"{p}.attention.qkv_proj.bias"]
        q, kk, v = (part.reshape(b, n, HEADS, d).transpose(1, 2) for part in qkv.chunk(3, -1))
        scores = rotate(q) @ rotate(kk).transpose(-1, -2) / math.sqrt(d) + bias
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, H)
        attn = attn @ w[f"{p}.attention.o_proj.weight"].T + w[f"{p}.attention.o_proj.bias"]
        h = _layer_norm(h + attn, w, f"{p}.attn_ln", eps)
        up, gate = (h @ w[f"{p}.mlp.up_gate_proj.weight"].T).chunk(2, -1)
        mlp = (act(gate) * up) @ w[f"{p}.mlp.down_proj.weight"].T + w[f"{p}.mlp.down_proj.bias"]
        h = _layer_norm(h + mlp, w, f"{p}.mlp_ln", eps)
    out = {"last_hidden_state": h}
    if "lm_head.dense.weight" in w:
        t = _gelu(h @ w["lm_head.dense.weight"].T + w["lm_head.dense.bias"])
        out["logits"] = (
            _layer_norm(t, w, "lm_head.norm", eps) @ w["embeddings.word_embeddings.weight"].T
            + w["lm_head.decoder.bias"]
        )
    elif "pooler.dense.weight" in w:
        pooled = torch.tanh(h[:, 0] @ w["pooler.dense.weight"].T + w["pooler.dense.bias"])
        out["logits"] = pooled @ w["classifier.weight"].T + w["classifier.bias"]
    elif "classifier.weight" in w:
        out["logits"] = h @ w["classifier.weight"].T + w["classifier.bias"]
    return out


def published_reference(directory: Path, vocab_size: int) -> WrittenOutReference:
    """A published-format ``NewModel`` checkpoint of gte-base-en-v1.5's shape (NTK scaling, no token-type table)
    with ``vocab_size`` words, written to ``directory``; and its written-out equations."""
    config, weights = published_checkpoint(directory, "NewModel", vocab_size=vocab_size, type_vocab_size=0)
    return WrittenOutReference(
        weights, lambda w, ids, mask, types: reference(config, w, ids, mask, types)["last_hidden_state"]
    )


def _inputs(type_vocab_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, LENGTH), generator=g)
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    mask[1, REAL:] = 0
    inputs = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
    if type_vocab_size > 1:
        inputs["token_type_ids"] = (torch.arange(LENGTH) >= 3).long().expand(2, LENGTH).contiguous()
    return inputs, mask


def _compare(ours: Any, expected: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    real = mask.bool()
    for name, value in expected.items():
        got = getattr(ours, name, None)
        if name == "last_hidden_state" and got is None:
            continue  # a task model returns its logits only
        assert got is not None, f"bertblocks returned no {name}"
        if got.dim() >= 2 and got.shape[:2] == mask.shape:  # per token: real tokens only
            got, value = got[real], value[real]
        assert_close(got, value.float(), what=name)


@pytest.mark.parametrize("cls", NEW_CLASSES)
def test_published_format_matches_the_written_out_equations(tmp_path, cls):
    config, weights = published_checkpoint(tmp_path / "published", cls)
    ours, info = bertblocks.from_pretrained(tmp_path / "published", head="auto", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    inputs, mask = _inputs(config["type_vocab_size"])
    expected = reference(config, weights, inputs["input_ids"], mask, inputs.get("token_type_ids"))
    with torch.no_grad():
        _compare(ours.eval()(**inputs), expected, mask)


@pytest.mark.parametrize(
    "changes",
    [
        {"type_vocab_size": 0, "rope_scaling": {"type": "ntk", "factor": 2.0}, "rope_theta": 500000},  # en-v1.5
        {"type_vocab_size": 1, "rope_scaling": None, "hidden_act": "silu"},
    ],
    ids=["en-v1.5-shape", "no-scaling-silu"],
)
def test_published_variants_match_the_written_out_equations(tmp_path, changes):
    config, weights = published_checkpoint(tmp_path / "published", "NewModel", **changes)
    ours = bertblocks.from_pretrained(tmp_path / "published").eval()
    inputs, mask = _inputs(config["type_vocab_size"])
    expected = reference(config, weights, inputs["input_ids"], mask, inputs.get("token_type_ids"))
    with torch.no_grad():
        _compare(ours(**inputs), expected, mask)


def test_ntk_scaling_is_in_the_numbers(tmp_path):
    # the same weights without the scaling give other outputs: the factor is read, not ignored
    config, weights = published_checkpoint(tmp_path / "published", "NewModel")
    ours = bertblocks.from_pretrained(tmp_path / "published").eval()
    inputs, mask = _inputs(config["type_vocab_size"])
    unscaled = reference({**config, "rope_scaling": None}, weights, inputs["input_ids"], mask, inputs["token_type_ids"])
    with torch.no_grad():
        got = ours(**inputs).last_hidden_state
    assert (got[mask.bool()] - unscaled["last_hidden_state"][mask.bool()].float()).abs().max() > 1e-2


@pytest.mark.parametrize("cls", NEW_CLASSES)
def test_published_format_saves_back_in_its_own_names(tmp_path, cls):
    config, weights = published_checkpoint(tmp_path / "published", cls)
    ours = bertblocks.from_pretrained(tmp_path / "published", head="auto").eval()
    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    for field in ("model_type", "architectures", "auto_map", "rope_theta", "rope_scaling", "pack_qkv", "unpad_inputs"):
        assert written[field] == config[field], field
    assert "bertblocks" not in written  # the published fields say everything
    saved = load_file(tmp_path / "ours" / "model.safetensors")
    assert set(saved) == set(weights)
    for key, value in weights.items():
        assert torch.equal(saved[key], value), key  # a copy of the same tensor: exactly equal
    again = bertblocks.from_pretrained(tmp_path / "ours", head="auto").eval()
    inputs, _ = _inputs(config["type_vocab_size"])
    with torch.no_grad():
        assert torch.equal(again(**inputs)[0], ours(**inputs)[0])  # the same weights in the same model


@pytest.mark.parametrize("cls", ["NewModel", "NewForMaskedLM"])
def test_stored_rotary_tables_are_ignored(tmp_path, cls):
    # inverse frequencies some exports store beside the weights: recomputed from the config, never read
    config, weights = published_checkpoint(tmp_path / "published", cls)
    prefix = "" if cls == "NewModel" else "new."
    extra = {f"{prefix}embeddings.rotary_emb.inv_freq": torch.ones(4), f"{prefix}rotary_emb.inv_freq": torch.ones(4)}
    save_file({**weights, **extra}, tmp_path / "published" / "model.safetensors")
    ours, info = bertblocks.from_pretrained(tmp_path / "published", head="auto", output_loading_info=True)
    assert info.unexpected_keys == []
    inputs, mask = _inputs(config["type_vocab_size"])
    expected = reference(config, weights, inputs["input_ids"], mask, inputs.get("token_type_ids"))
    with torch.no_grad():
        _compare(ours.eval()(**inputs), expected, mask)


def test_native_and_published_checkpoints_share_their_weights(tmp_path):
    # a published checkpoint, saved as transformers' gte (family switched; its NTK scaling written as linear
    # rope_parameters), loads in transformers' GteModel and gives the written-out equations' numbers
    config, weights = published_checkpoint(tmp_path / "published", "NewModel")  # NTK scaling by 8
    ours = bertblocks.from_pretrained(tmp_path / "published").eval()
    data = ours.config.model_dump()
    data["family"] = "gte"
    native = bertblocks.create_model(bertblocks.load_config(data))
    native.load_state_dict(ours.state_dict())
    native.save_pretrained(tmp_path / "native")
    theirs = transformers.GteModel.from_pretrained(tmp_path / "native").eval()
    inputs, mask = _inputs(config["type_vocab_size"])
    expected = reference(config, weights, inputs["input_ids"], mask, inputs["token_type_ids"])
    with torch.no_grad():
        _compare(theirs(**inputs), expected, mask)


REFUSED = {
    "position_embedding_type": "absolute",
    "layer_norm_type": "rms_norm",
    "pack_qkv": False,
    "logn_attention_scale": True,
    "logn_attention_clip1": True,
}


@pytest.mark.parametrize(("field", "value"), REFUSED.items())
def test_a_switch_bertblocks_cannot_build_is_refused_naming_it(field, value):
    with pytest.raises(ConfigError, match=f"{field} is {value!r}"):
        config_from_hf({**NEW_CONFIG, field: value})


@pytest.mark.parametrize(
    ("rope_scaling", "message"),
    [
        ({"type": "dynamic", "factor": 2.0}, "rope_scaling.type is 'dynamic'"),
        ({"type": "ntk", "factor": 2.0, "mixed_b": 0.5}, "rope_scaling.mixed_b is 0.5"),
        ({"type": "ntk", "factor": 0.5}, "rope_scaling.factor must be a number >= 1"),
        ({"type": "ntk", "factor": 2.0, "alpha": 1}, "cannot represent: alpha"),
    ],
)
def test_a_rope_scaling_other_than_fixed_ntk_is_refused_naming_it(rope_scaling, message):
    with pytest.raises(ConfigError, match=message):
        config_from_hf({**NEW_CONFIG, "rope_scaling": rope_scaling})


def test_a_config_without_rope_theta_is_refused():
    hf = {k: v for k, v in NEW_CONFIG.items() if k != "rope_theta"}
    with pytest.raises(ConfigError, match="rope_theta is missing"):
        config_from_hf(hf)


def test_an_auto_map_is_still_refused_for_the_families_that_do_not_read_it():
    # accepting `new` changes nothing for other model types: remote classes beside gte are refused
    with pytest.raises(ConfigError, match="auto_map: names remote-code classes"):
        config_from_hf({**GTE.hf_config(), "auto_map": NEW_CONFIG["auto_map"]})


def test_a_new_config_naming_other_remote_classes_is_refused():
    auto_map = {**NEW_CONFIG["auto_map"], "AutoModel": "someone/other-impl--modeling.OtherModel"}
    with pytest.raises(ConfigError, match=r"auto_map: names remote-code classes \(.*OtherModel"):
        config_from_hf({**NEW_CONFIG, "auto_map": auto_map})


# ------------------------------------------------------------------------------- training, against transformers
def test_gradients_match_transformers(tmp_path):
    """Backward through the NTK-scaled rotary attention, the split gated feed-forward and the tied masked LM: the
    gradients of the loss equal transformers' (dropout off), relative to their magnitude."""
    settings = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    reference = save_hf(SCALED, "GteForMaskedLM", tmp_path, **settings).train()
    ours = bertblocks.from_pretrained(tmp_path, head="auto").train()
    inputs, _ = batch(SCALED, "GteForMaskedLM")
    reference(**inputs).loss.backward()
    ours(**inputs).loss.backward()
    theirs, mine = dict(reference.named_parameters()), dict(ours.named_parameters())
    wqkv, h = mine["bert.encoder.layer.0.attention.self.Wqkv.weight"].grad, SCALED.settings["hidden_size"]
    pairs = {
        "gte.layers.1.mlp.gate_proj.weight": mine["bert.encoder.layer.1.intermediate.gate.weight"].grad,
        "gte.layers.1.mlp.up_proj.weight": mine["bert.encoder.layer.1.intermediate.up.weight"].grad,
        "gte.layers.0.mlp.down_proj.bias": mine["bert.encoder.layer.0.output.dense.bias"].grad,
        "gte.layers.0.self_attn.q_proj.weight": wqkv[:h],
        "gte.layers.0.self_attn.k_proj.weight": wqkv[
            SCALED.settings["hidden_size"] : 2 * SCALED.settings["hidden_size"]
        ],
        "gte.embeddings.word_embeddings.weight": mine["bert.embeddings.word_embeddings.weight"].grad,
        "lm_head.layer_norm.weight": mine["cls.predictions.transform.LayerNorm.weight"].grad,
    }
    for name, grad in pairs.items():
        assert_grads_close(grad, theirs[name].grad, what=name)


def test_training_dropout_matches_transformers_mask_for_mask(tmp_path):
    """In training, transformers' GTE drops out the embeddings, the attention output, the gated product inside the
    feed-forward and its output; bertblocks draws the same masks in the same order (same seed), so the outputs agree.
    Without the gated product's dropout (``dropout_at: both`` rather than ``output``) every mask after it is drawn
    at another offset."""
    settings = {"hidden_dropout_prob": 0.3, "attention_probs_dropout_prob": 0.0}
    reference = save_hf(SCALED, "GteModel", tmp_path, **settings).train()
    ours = bertblocks.from_pretrained(tmp_path, ["encoder.attention.backend=eager"]).train()
    inputs, mask = batch(SCALED, "GteModel")
    inputs = call_inputs("GteModel", inputs)
    torch.manual_seed(5)
    theirs = reference(**inputs).last_hidden_state
    torch.manual_seed(5)
    got = ours(**inputs).last_hidden_state
    assert_close(got[mask.bool()], theirs[mask.bool()], what="last_hidden_state in training")


# ----------------------------------------------------------------------------------- the shared options
def test_rope_ntk_factor_gives_the_scaled_frequencies():
    positions = torch.arange(7)[None]
    q = torch.randn(1, 7, 2, 8, dtype=torch.float64)
    scaled, _ = RotaryEmbedding(8, 50.0, False, ntk_factor=4.0)(q, q, positions)
    # the closed formula in float64 (no GEMM between the two sides: bound tighter than OUTPUT_ATOL)
    inv_freq = (50.0 * 4.0) ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8) / 4.0 ** (2 / 8)
    angles = positions[0, :, None].double() * inv_freq
    cos, sin = torch.cat((angles, angles), -1)[:, None], torch.cat((angles, angles), -1)[:, None]
    expected = q * cos.cos() + torch.cat((-q[..., 4:], q[..., :4]), -1) * sin.sin()
    assert_close(scaled, expected, atol=1e-12, what="rope with ntk_factor 4 (float64 closed formula)")
    plain, _ = RotaryEmbedding(8, 50.0, False)(q, q, positions)
    assert (plain - scaled).abs().max() > 1e-2


def test_glu_input_bias_leaves_the_output_bias():
    cfg = bertblocks.load_config("tiny-gte")
    model = bertblocks.create_model(cfg)
    keys = set(model.state_dict())
    assert "encoder.layer.0.intermediate.gate.bias" not in keys
    assert "encoder.layer.0.intermediate.up.bias" not in keys
    assert "encoder.layer.0.output.dense.bias" in keys
    biased = bertblocks.create_model(bertblocks.load_config("tiny-gte", ["encoder.feedforward.input_bias=null"]))
    assert "encoder.layer.0.intermediate.gate.bias" in set(biased.state_dict())


def test_tiny_preset_saves_a_gte_checkpoint_transformers_loads(tmp_path):
    torch.manual_seed(0)
    model = bertblocks.create_model("tiny-gte").eval()
    model.save_pretrained(tmp_path)
    theirs, info = transformers.GteModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    ids = torch.randint(3, 1000, (2, 7))
    with torch.no_grad():
        assert_close(model(input_ids=ids).last_hidden_state, theirs.eval()(input_ids=ids).last_hidden_state)


def test_the_published_format_frames_texts_as_bert_without_a_post_processor(tmp_path):
    # `new` cannot be a row of the shared tables (no transformers class), so its tokenizer convention is tested
    # here: a WordPiece tokenizer.json with no post-processor beside a published config.json gets BERT's template
    # ([CLS] A [SEP] B [SEP], token types 0/1), as transformers' BertTokenizer frames it
    tok = toks.wordpiece()
    directory = toks.save(tmp_path, tok, "BertTokenizer")
    (directory / "config.json").write_text(json.dumps(NEW_CONFIG))
    theirs = transformers.BertTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    for args in ((toks.TEXTS,), (toks.TEXTS, toks.PAIRS)):
        expected = theirs(*args, padding=True, return_tensors="pt")
        got = ours(*args)
        assert sorted(got) == sorted(expected.keys())
        for key in got:
            assert got[key].tolist() == expected[key].tolist(), key
    assert ours.pad_token_id == theirs.pad_token_id == 0


@pytest.mark.parametrize(
    ("head", "source", "labels", "block", "head_keys"),
    [
        (
            "question_answering",
            "GteModel",
            2,
            {"head": {"name": "question_answering"}},
            {"qa_outputs.weight", "qa_outputs.bias"},
        ),
        # GteForSequenceClassification's pooler and a one-label classifier: the multiple-choice head's shapes; GteModel
        # has no pooler, so the block keeps it too
        (
            "multiple_choice",
            "GteForSequenceClassification",
            1,
            {"head": {"name": "multiple_choice"}, "pooler": {"name": "first_token"}},
            {"classifier.weight", "classifier.bias", "gte.pooler.dense.weight", "gte.pooler.dense.bias"},
        ),
    ],
)
def test_a_head_transformers_has_no_gte_class_for_is_kept_in_the_bertblocks_block(
    tmp_path, head, source, labels, block, head_keys
):
    """transformers has no GteForQuestionAnswering or GteForMultipleChoice, so the table cannot compare them: saved,
    such a model's config.json names GteModel and keeps the head in its ``bertblocks`` block; bertblocks reloads the
    head and its numbers, and transformers' GteModel loads the backbone (the head's tensors its only unexpected
    keys) and gives the backbone's numbers."""
    save_hf(GTE, source, tmp_path / "hf", num_labels=labels)
    torch.manual_seed(3)  # the question-answering head is new: initialised at random
    ours = bertblocks.from_pretrained(tmp_path / "hf", head=head).eval()
    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == "gte"
    assert written["architectures"] == ["GteModel"]
    assert written["bertblocks"] == block
    again, info = bertblocks.from_pretrained(tmp_path / "ours", head="auto", output_loading_info=True)
    assert again.config.head is not None
    assert again.config.head.name == head
    assert info.missing_keys == info.unexpected_keys == []
    inputs, _ = batch(GTE, "ForMultipleChoice" if head == "multiple_choice" else "ForQuestionAnswering")
    inputs = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():  # the same weights in the same modules
        for a, b in zip(ours(**inputs).to_tuple(), again.eval()(**inputs).to_tuple(), strict=True):
            assert torch.equal(a, b)
    theirs, hf_info = transformers.GteModel.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not hf_info["missing_keys"]
    assert set(hf_info["unexpected_keys"]) == head_keys
    backbone, backbone_mask = batch(GTE, "GteModel")
    backbone = call_inputs("GteModel", backbone)
    with torch.no_grad():
        want = theirs.eval()(**backbone).last_hidden_state
        got = again.bert(**backbone).last_hidden_state
    assert_close(got[backbone_mask.bool()], want[backbone_mask.bool()])
