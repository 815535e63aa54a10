"""Jina-embeddings-v2 (family ``jina_bert``): the published format (``model_type: bert`` with an ``auto_map`` to the
remote ``JinaBert*`` classes) is translated into bertblocks components and checked against a float64 reference of
the published modelling equations, written here from the config.json fields and the published description (no
remote code is copied or run): ALiBi on the scaled scores, the gated MLP ``wo(act(g₁) · g₂)`` with its own
post-LN, BERT's embeddings, attention, pooler and masked-LM head. Tiny random checkpoints carry the published key
names. Saving writes the same format back; other remote code under ``model_type: bert`` stays refused. The packed
path, ``torch.compile``, sentence embeddings (JinaBERT's ``emb_pooler: mean``), the CLI and an ablation study run on
a published-format checkpoint with its tokenizer against the same reference (:func:`published_reference`): the
``jina_bert`` row of ``REMOTE`` in ``test_family_paths.py``."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.hf.families import add_prefix, model_to_checkpoint, strip_prefix
from tests.families.reference import WrittenOutReference
from tests.tolerances import assert_close

REPO = "jinaai/jina-bert-implementation"
#: jina-embeddings-v2-base-en's config.json fields, at the test's tiny sizes
PUBLISHED: dict[str, Any] = {
    "_name_or_path": REPO,
    "model_max_length": 8192,
    "architectures": ["JinaBertForMaskedLM"],
    "attention_probs_dropout_prob": 0.0,
    "auto_map": {
        "AutoConfig": f"{REPO}--configuration_bert.JinaBertConfig",
        "AutoModelForMaskedLM": f"{REPO}--modeling_bert.JinaBertForMaskedLM",
        "AutoModel": f"{REPO}--modeling_bert.JinaBertModel",
        "AutoModelForSequenceClassification": f"{REPO}--modeling_bert.JinaBertForSequenceClassification",
    },
    "classifier_dropout": None,
    "gradient_checkpointing": False,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 48,
    "initializer_range": 0.02,
    "intermediate_size": 40,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 64,
    "model_type": "bert",
    "num_attention_heads": 6,  # not a power of two: the paper's slope workaround
    "num_hidden_layers": 2,
    "pad_token_id": 0,
    "position_embedding_type": "alibi",
    "torch_dtype": "float32",
    "transformers_version": "4.26.0",
    "type_vocab_size": 2,
    "use_cache": True,
    "vocab_size": 99,
    "feed_forward_type": "geglu",
    "emb_pooler": "mean",
}


def _published_weights(config: dict[str, Any], *, prefix: str = "", mlm: bool = False, seed: int = 0):
    """Random tensors under the published checkpoints' key names (JinaBertModel: no prefix; task models:
    ``bert.``), scaled so that attention is sharp and a wrong term shows."""
    g = torch.Generator().manual_seed(seed)
    h, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]

    def rnd(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    def norm():
        return 1.0 + rnd(h, scale=0.1), rnd(h, scale=0.1)

    w: dict[str, torch.Tensor] = {
        "embeddings.word_embeddings.weight": rnd(vocab, h, scale=1.0),
        "embeddings.token_type_embeddings.weight": rnd(config["type_vocab_size"], h, scale=1.0),
    }
    w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"] = norm()
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        for name in ("query", "key", "value"):
            w[f"{p}.attention.self.{name}.weight"] = rnd(h, h)
            w[f"{p}.attention.self.{name}.bias"] = rnd(h, scale=0.1)
        w[f"{p}.attention.output.dense.weight"], w[f"{p}.attention.output.dense.bias"] = rnd(h, h), rnd(h, scale=0.1)
        w[f"{p}.attention.output.LayerNorm.weight"], w[f"{p}.attention.output.LayerNorm.bias"] = norm()
        w[f"{p}.mlp.gated_layers.weight"] = rnd(2 * inner, h)  # no bias
        w[f"{p}.mlp.wo.weight"], w[f"{p}.mlp.wo.bias"] = rnd(h, inner), rnd(h, scale=0.1)
        w[f"{p}.mlp.layernorm.weight"], w[f"{p}.mlp.layernorm.bias"] = norm()
    if not mlm:
        w["pooler.dense.weight"], w["pooler.dense.bias"] = rnd(h, h), rnd(h, scale=0.1)
    w = {prefix + k: v for k, v in w.items()}
    if mlm:
        w["cls.predictions.transform.dense.weight"] = rnd(h, h)
        w["cls.predictions.transform.dense.bias"] = rnd(h, scale=0.1)
        w["cls.predictions.transform.LayerNorm.weight"], w["cls.predictions.transform.LayerNorm.bias"] = norm()
        w["cls.predictions.bias"] = rnd(vocab, scale=0.1)  # the decoder is tied to the word embeddings
    return w


def _save(folder: Path, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in weights.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _slopes(n: int) -> list[float]:
    """The ALiBi paper's head slopes (powers of two: 2^(-8i/n); otherwise the closest power of two's, then every
    other slope of twice that)."""
    if math.log2(n).is_integer():
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    c = 2 ** math.floor(math.log2(n))
    return _slopes(c) + _slopes(2 * c)[0::2][: n - c]


def _reference(w: dict[str, torch.Tensor], config: dict[str, Any], ids, types, mask, *, prefix: str = ""):
    """JinaBERT's published equations in float64: ``(last_hidden_state, pooler_output or MLM logits)``."""
    w = {k.removeprefix(prefix): v.double() for k, v in w.items()}
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]
    inner = config["intermediate_size"]
    act = {"geglu": torch.nn.functional.gelu, "reglu": torch.relu}[config["feed_forward_type"]]

    def lin(x, name, bias=True):
        y = x @ w[f"{name}.weight"].T
        return y + w[f"{name}.bias"] if bias else y

    def norm(x, name):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], eps)

    # embeddings: word + token type (ALiBi: no position table), LayerNorm
    x = norm(
        w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][types],
        "embeddings.LayerNorm",
    )
    b, t, hidden = x.shape
    d = hidden // heads
    pos = torch.arange(t, dtype=torch.float64)
    alibi = -torch.tensor(_slopes(heads), dtype=torch.float64)[:, None, None] * (pos[None, :] - pos[:, None]).abs()
    extended = (1.0 - mask[:, None, None, :].double()) * torch.finfo(torch.float64).min
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        q, k, v = (
            lin(x, f"{p}.attention.self.{n}").view(b, t, heads, d).transpose(1, 2) for n in ("query", "key", "value")
        )
        probs = (q @ k.transpose(-1, -2) / math.sqrt(d) + extended + alibi).softmax(-1)  # bias on scaled scores
        context = (probs @ v).transpose(1, 2).reshape(b, t, hidden)
        x = norm(lin(context, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
        g = lin(x, f"{p}.mlp.gated_layers", bias=False)  # [b, t, 2I]: gated half first, then the linear half
        x = norm(lin(act(g[..., :inner]) * g[..., inner:], f"{p}.mlp.wo") + x, f"{p}.mlp.layernorm")
    if "cls.predictions.bias" in w:
        h = norm(
            torch.nn.functional.gelu(lin(x, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm"
        )
        return x, h @ w["embeddings.word_embeddings.weight"].T + w["cls.predictions.bias"]
    return x, torch.tanh(lin(x[:, 0], "pooler.dense"))


def published_reference(directory: Path, vocab_size: int) -> WrittenOutReference:
    """A published-format ``JinaBertModel`` checkpoint with ``vocab_size`` words, hidden size 32 (four heads), written
    to ``directory``; and its written-out equations."""
    config = {**PUBLISHED, "vocab_size": vocab_size, "hidden_size": 32, "num_attention_heads": 4}
    config["architectures"] = ["JinaBertModel"]
    weights = _published_weights(config, seed=4)
    _save(directory, config, weights)

    def hidden_states(w, ids, mask, types):
        return _reference(w, config, ids, torch.zeros_like(ids) if types is None else types, mask)[0]

    return WrittenOutReference(weights, hidden_states)


def _batch(config, b=3, t=13, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, config["vocab_size"], (b, t), generator=g)
    types = torch.randint(0, 2, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    return ids, types, mask


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("heads", [6, 4])
def test_published_backbone_equals_the_float64_reference(tmp_path, backend, heads):
    config = {**PUBLISHED, "num_attention_heads": heads}
    weights = _published_weights(config)
    folder = _save(tmp_path / "published", config, weights)
    model, info = bertblocks.from_pretrained(folder, [f"encoder.attention.backend={backend}"], output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    assert model.config.family == "jina_bert"
    ids, types, mask = _batch(config)
    want_hidden, want_pooled = _reference(weights, config, ids, types, mask)
    with torch.no_grad():
        out = model.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask)
    real = mask.bool()
    assert_close(out.last_hidden_state[real].double(), want_hidden[real])
    assert_close(out.pooler_output.double(), want_pooled)


def test_reglu_checkpoint_equals_the_float64_reference(tmp_path):
    config = {**PUBLISHED, "feed_forward_type": "reglu", "hidden_act": "relu"}
    weights = _published_weights(config, seed=2)
    model = bertblocks.from_pretrained(_save(tmp_path, config, weights)).eval()
    assert model.config.encoder.feedforward.activation == "relu"
    ids, types, mask = _batch(config)
    want, _ = _reference(weights, config, ids, types, mask)
    with torch.no_grad():
        got = model(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert_close(got[mask.bool()].double(), want[mask.bool()])


def test_the_reference_catches_a_wrong_gate_half(tmp_path):
    """Swapping the gated and linear halves of mlp.gated_layers changes the numbers: the test sees the layout."""
    weights = _published_weights(PUBLISHED)
    swapped = dict(weights)
    for i in range(PUBLISHED["num_hidden_layers"]):
        key = f"encoder.layer.{i}.mlp.gated_layers.weight"
        swapped[key] = torch.cat(weights[key].chunk(2)[::-1])
    model = bertblocks.from_pretrained(_save(tmp_path, PUBLISHED, swapped)).eval()
    ids, types, mask = _batch(PUBLISHED)
    want, _ = _reference(weights, PUBLISHED, ids, types, mask)
    with torch.no_grad():
        got = model(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert (got[mask.bool()].double() - want[mask.bool()]).abs().max() > 1e-2


def test_masked_lm_checkpoint_equals_the_float64_reference(tmp_path):
    weights = _published_weights(PUBLISHED, prefix="bert.", mlm=True, seed=3)
    folder = _save(tmp_path, PUBLISHED, weights)
    model, info = bertblocks.from_pretrained(folder, head="auto", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    assert model.config.head.name == "masked_lm"
    ids, types, mask = _batch(PUBLISHED)
    _, want = _reference(weights, PUBLISHED, ids, types, mask, prefix="bert.")
    # in float64: logits of size ~10 over a 48-wide dot product carry fp32's rounding of the hidden states ×
    # the embedding norms (1e-4 here), which says nothing about the equations
    with torch.no_grad():
        logits = model.eval().double()(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    assert_close(logits[mask.bool()], want[mask.bool()])


def test_save_writes_the_published_format_back(tmp_path):
    weights = _published_weights(PUBLISHED)
    model = bertblocks.from_pretrained(_save(tmp_path / "published", PUBLISHED, weights)).eval()
    model.save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert written["model_type"] == "bert"
    assert written["auto_map"] == PUBLISHED["auto_map"]
    assert written["position_embedding_type"] == "alibi"
    assert written["feed_forward_type"] == "geglu"
    assert written["emb_pooler"] == "mean"
    assert written["architectures"] == ["JinaBertModel"]
    assert "bertblocks" not in written  # everything said in the published fields
    saved = load_file(tmp_path / "saved" / "model.safetensors")
    assert set(saved) == set(weights)  # the published key names, nothing more
    for key, tensor in weights.items():
        assert torch.equal(saved[key], tensor), key
    again = bertblocks.from_pretrained(tmp_path / "saved").eval()
    ids, types, mask = _batch(PUBLISHED)
    with torch.no_grad():
        a = model(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
        b = again(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert torch.equal(a, b)


def test_config_json_round_trips_and_maps_to_components():
    cfg = bertblocks.load_config(config_from_hf(PUBLISHED))
    assert cfg.family == "jina_bert"
    assert cfg.position.name == "symmetric_alibi"
    assert cfg.encoder.feedforward.name == "glu"
    assert cfg.encoder.feedforward.activation == "gelu"
    assert cfg.encoder.feedforward.changed_options() == {
        "bias": False,
        "output_bias": True,
        "fused": True,
        "dropout_at": "gated",
    }
    attention = cfg.encoder.attention.options()
    assert {k: attention[k] for k in ("qkv_bias", "output_bias", "fused_qkv")} == {
        "qkv_bias": True,
        "output_bias": True,
        "fused_qkv": False,
    }
    back = config_to_hf(cfg)
    for key in ("model_type", "auto_map", "position_embedding_type", "feed_forward_type", "emb_pooler"):
        assert back[key] == PUBLISHED[key], key
    assert bertblocks.load_config(config_from_hf(back)) == cfg


def test_transformers_reads_the_format_as_plain_bert_which_is_why_bertblocks_does_not(tmp_path):
    """What the docs say transformers does without remote code: a BertModel that leaves the GLU weights
    unused and its own feed-forward random."""
    model = bertblocks.create_model("tiny-jina-v2")
    model.save_pretrained(tmp_path)
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(theirs) is transformers.BertConfig
    _, info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert any(".mlp.gated_layers." in key for key in info["unexpected_keys"])
    assert any(".intermediate.dense." in key for key in info["missing_keys"])


#: a field left out of config.json
ABSENT = object()


def _refused(change: dict[str, Any], match: str) -> None:
    hf = {k: v for k, v in {**copy.deepcopy(PUBLISHED), **change}.items() if v is not ABSENT}
    with pytest.raises(ConfigError, match=match):
        bertblocks.load_config(config_from_hf(hf))


def test_other_remote_code_under_model_type_bert_stays_refused():
    qk_norm = {k: v.replace(REPO, "jinaai/jina-bert-v2-qk-post-norm") for k, v in PUBLISHED["auto_map"].items()}
    _refused({"auto_map": qk_norm}, r"auto_map: names remote-code classes \(jinaai/jina-bert-v2-qk-post-norm--")
    # the folder's own modelling files: code bertblocks has never seen
    local = {k: v.split("--")[1] for k, v in PUBLISHED["auto_map"].items()}
    _refused({"auto_map": local}, r"names remote-code classes \(configuration_bert\.JinaBertConfig")
    # MosaicBERT-era JBert classes
    _refused({"auto_map": {"AutoModel": "modeling_jbert.JBertModel"}}, "modeling_jbert.JBertModel")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"feed_forward_type": "original"}, "feed_forward_type is 'original'"),
        ({"feed_forward_type": ABSENT}, "feed_forward_type is 'original'"),  # JinaBertConfig's default
        ({"feed_forward_type": "swiglu"}, "feed_forward_type is 'swiglu'"),
        ({"alibi_scaling": 2}, "alibi_scaling is 2"),
        ({"hidden_act": "relu"}, "hidden_act 'relu' differs from the geglu gate's 'gelu'"),
    ],
)
def test_jina_switches_bertblocks_does_not_implement_are_errors(change, match):
    _refused(change, match)


def test_glu_output_bias_option_keeps_a_bias_on_the_output_projection_alone():
    model = bertblocks.create_model("tiny-jina-v2")
    keys = set(model.state_dict())
    assert "encoder.layer.0.output.dense.bias" in keys
    assert "encoder.layer.0.intermediate.dense.bias" not in keys
    plain = bertblocks.create_model("tiny-jina-v2", ["encoder.feedforward.output_bias=false"])
    assert "encoder.layer.0.output.dense.bias" not in set(plain.state_dict())


def test_tiny_preset_saves_a_config_json_that_reads_back(tmp_path):
    model = bertblocks.create_model("tiny-jina-v2")
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "bert"
    assert "bertblocks" not in written
    again = bertblocks.from_pretrained(tmp_path).config.model_dump()
    assert again.pop("hf").pop("auto_map") == PUBLISHED["auto_map"]  # read back as what it is: the file's auto_map
    mine = model.config.model_dump()
    mine.pop("hf")
    assert again == mine


@pytest.mark.parametrize(
    ("name", "sizes", "parameters"),
    [
        # the published models' sizes; parameters as their model cards round them (33M, 137M)
        ("jina-embeddings-v2-small-en", (512, 4, 8, 2048), 32_690_688),
        ("jina-embeddings-v2-base-en", (768, 12, 12, 3072), 137_368_320),
    ],
)
def test_presets_hold_the_published_keys_and_shapes(name, sizes, parameters):
    hidden, layers, heads, inner = sizes
    cfg = bertblocks.load_config(name)
    published = {
        **PUBLISHED,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": inner,
        "vocab_size": 30528,
        "max_position_embeddings": 8192,
    }
    # the preset is what the published config.json says
    read = bertblocks.load_config(config_from_hf(published))
    assert read.model_dump(exclude={"hf", "head"}) == cfg.model_dump(exclude={"hf", "head"})
    with torch.device("meta"):
        model = bertblocks.create_model(cfg)
        expected = {k: tuple(v.shape) for k, v in _published_weights(published).items()}
    mapped = strip_prefix(model_to_checkpoint(add_prefix(model.state_dict(), "bert"), cfg), "bert")
    assert {k: tuple(v.shape) for k, v in mapped.items()} == expected
    assert model.num_parameters() == parameters


def test_training_dropout_falls_on_the_gated_product_as_jinabert_drops_it():
    """In training, the feed-forward equals JinaBERT's MLP with the dropout mask drawn on the gated product
    (same RNG draws), not after the output projection."""
    model = bertblocks.create_model("tiny-jina-v2", ["hidden_dropout_prob=0.5"]).train()
    layer = model.encoder.layer[0]
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    state = {k: v.detach().double() for k, v in layer.state_dict().items()}
    torch.manual_seed(7)
    with torch.no_grad():
        got = layer.output(layer.intermediate(x), x)
    torch.manual_seed(7)
    g = x.double() @ state["intermediate.dense.weight"].T  # [b, t, 2I], no bias
    inner = g.shape[-1] // 2
    dropped = torch.nn.functional.dropout(torch.nn.functional.gelu(g[..., :inner]) * g[..., inner:], 0.5)
    h = dropped @ state["output.dense.weight"].T + state["output.dense.bias"] + x.double()
    ln = state["output.LayerNorm.weight"], state["output.LayerNorm.bias"]
    want = torch.nn.functional.layer_norm(h, h.shape[-1:], *ln, 1e-12)
    assert_close(got.double(), want)
    bert_place = bertblocks.create_model(
        "tiny-jina-v2", ["hidden_dropout_prob=0.5", "encoder.feedforward.dropout_at=output"]
    )
    bert_place.load_state_dict(model.state_dict())
    bert_layer = bert_place.train().encoder.layer[0]
    torch.manual_seed(7)
    with torch.no_grad():
        other = bert_layer.output(bert_layer.intermediate(x), x)
    assert (other.double() - want).abs().max() > 1e-3  # the other place is another model in training


def test_choices_the_published_fields_cannot_say_travel_in_the_bertblocks_block(tmp_path):
    model = bertblocks.create_model("tiny-jina-v2", ["encoder.attention.backend=eager", "position.max_bias=4.0"])
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "bert"
    assert written["bertblocks"]["position"] == {"name": "symmetric_alibi", "max_bias": 4.0}
    again = bertblocks.from_pretrained(tmp_path)
    assert again.config.family == "jina_bert"
    assert again.config.position.options()["max_bias"] == 4.0
    assert again.encoder.alibi.slopes.tolist() == model.encoder.alibi.slopes.tolist()
