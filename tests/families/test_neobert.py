"""NeoBERT (``neobert``): transformers has no class for it (its checkpoints ship remote code, which bertblocks never
runs), so a tiny random checkpoint under the published weight names and config.json fields is compared with a
float64 reference of the published equations written out below; bertblocks saves the same keys and fields back.
Refusals of what is not built, naming the field. The packed path, ``torch.compile``, sentence embeddings, the CLI
and an ablation study run on a published-format checkpoint against the same reference (:func:`published_reference`):
the ``neobert`` row of ``REMOTE`` in ``test_family_paths.py``.

The equations (NeoBERT's published description): ``x = E[ids]``; per layer
``x += wo(attn(rope(q), rope(k), v))`` with ``q, k, v`` the three ``d``-row blocks of each head's ``3·d`` rows of
``qkv(rmsnorm(x))``, RoPE on consecutive pairs with θ = 10000, softmax over the real keys; ``x += w3(silu(a) · b)``
with ``a, b`` the halves of ``w12(rmsnorm(x))``; a final RMSNorm. ``NeoBERTLMHead``: ``decoder(x)``;
``NeoBERTForSequenceClassification``: ``classifier(tanh(dense(x[:, 0])))`` (dropout off in eval).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.config import deep_merge
from bertblocks.config.errors import ConfigError
from bertblocks.errors import BertBlocksError
from bertblocks.families.neobert import swiglu_width
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.registry import validate_config
from tests.families.reference import WrittenOutReference
from tests.tolerances import assert_close

#: NeoBERT's published config.json fields at test size, with its remote-code bookkeeping
CONFIG: dict[str, Any] = {
    "architectures": ["NeoBERTLMHead"],
    "auto_map": {
        "AutoConfig": "model.NeoBERTConfig",
        "AutoModel": "model.NeoBERT",
        "AutoModelForMaskedLM": "model.NeoBERTLMHead",
        "AutoModelForSequenceClassification": "model.NeoBERTForSequenceClassification",
    },
    "classifier_init_range": 0.02,
    "decoder_init_range": 0.02,
    "dim_head": 8,
    "embedding_init_range": 0.02,
    "hidden_size": 32,
    "intermediate_size": 60,  # SwiGLU width int(2·60/3) = 40, a multiple of 8
    "max_length": 64,
    "model_type": "neobert",
    "norm_eps": 1e-05,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "pad_token_id": 0,
    "trust_remote_code": True,
    "vocab_size": 99,
}
H, HEADS, D, WIDTH, VOCAB, LAYERS = 32, 4, 8, 40, 99, 2


def _weights(
    head: str | None, seed: int = 0, tied: bool = False, bias: bool = True, vocab: int = VOCAB
) -> dict[str, torch.Tensor]:
    """Random float32 tensors under the published key names (scales that make attention and norms matter)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.3) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    w = {"model.encoder.weight": rand(vocab, H), "model.layer_norm.weight": 1 + rand(H, scale=0.1)}
    for i in range(LAYERS):
        p = f"model.transformer_encoder.{i}."
        w[p + "attention_norm.weight"] = 1 + rand(H, scale=0.1)
        w[p + "qkv.weight"] = rand(3 * H, H)
        w[p + "wo.weight"] = rand(H, H)
        w[p + "ffn_norm.weight"] = 1 + rand(H, scale=0.1)
        w[p + "ffn.w12.weight"] = rand(2 * WIDTH, H)
        w[p + "ffn.w3.weight"] = rand(H, WIDTH)
    if head == "NeoBERTLMHead":
        if not tied:
            w["decoder.weight"] = rand(vocab, H)
        if bias:
            w["decoder.bias"] = rand(vocab)
    elif head == "NeoBERTForSequenceClassification":
        w["dense.weight"], w["dense.bias"] = rand(H, H), rand(H)
        w["classifier.weight"], w["classifier.bias"] = rand(3, H), rand(3)
    return w


def _checkpoint(folder: Path, head: str | None, **fields: Any) -> dict[str, torch.Tensor]:
    folder.mkdir(parents=True, exist_ok=True)
    weights = _weights(head, vocab=fields.get("vocab_size", VOCAB))
    if head is None:  # the bare NeoBERT saves without the `model.` prefix
        weights = {k.removeprefix("model."): v for k, v in weights.items()}
    save_file(weights, str(folder / "model.safetensors"))
    config = {**CONFIG, "architectures": [head or "NeoBERT"], **fields}
    (folder / "config.json").write_text(json.dumps(config))
    return weights


# ------------------------------------------------------------------------------------- float64 reference
def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Consecutive pairs ``(x[2i], x[2i+1])`` of ``x [b, s, h, d]`` rotated by ``p · 10000^(-2i/d)``."""
    s, d = x.shape[1], x.shape[-1]
    freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    angle = torch.arange(s, dtype=torch.float64)[:, None] * freq  # [s, d/2]
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def reference(
    weights: dict[str, torch.Tensor], ids: torch.Tensor, mask: torch.Tensor, eps: float = 1e-5, lm: bool = False
) -> Any:
    """NeoBERT's equations in float64: the last hidden state, and the heads' logits where their weights exist."""
    w = {k.removeprefix("model."): v.double() for k, v in weights.items()}
    b, s = ids.shape
    x = w["encoder.weight"][ids]  # [b, s, H]
    hidden_mask = torch.where(mask.bool(), 0.0, -math.inf).double()[:, None, None, :]  # [b, 1, 1, s]
    for i in range(LAYERS):
        p = f"transformer_encoder.{i}."
        h = _rmsnorm(x, w[p + "attention_norm.weight"], eps)
        q, k, v = (h @ w[p + "qkv.weight"].T).view(b, s, HEADS, 3 * D).chunk(3, dim=-1)  # [b, s, h, d] each
        q, k = _rope(q), _rope(k)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D) + hidden_mask
        context = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, s, H)
        x = x + context @ w[p + "wo.weight"].T
        h = _rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        gate, up = (h @ w[p + "ffn.w12.weight"].T).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "ffn.w3.weight"].T
    x = _rmsnorm(x, w["layer_norm.weight"], eps)
    out = {"last_hidden_state": x}
    if lm or "decoder.weight" in w:
        decoder = w.get("decoder.weight", w["encoder.weight"])  # tied: the embedding table
        out["logits"] = x @ decoder.T + w.get("decoder.bias", 0.0)
    if "classifier.weight" in w:
        pooled = torch.tanh(x[:, 0] @ w["dense.weight"].T + w["dense.bias"])
        out["logits"] = pooled @ w["classifier.weight"].T + w["classifier.bias"]
    return out


def published_reference(directory: Path, vocab_size: int) -> WrittenOutReference:
    """A published-format ``NeoBERT`` backbone checkpoint with ``vocab_size`` words, written to ``directory``; and
    its written-out equations."""
    weights = _checkpoint(directory, None, vocab_size=vocab_size)
    # NeoBERT has no token types
    return WrittenOutReference(weights, lambda w, ids, mask, types: reference(w, ids, mask)["last_hidden_state"])


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return ids.masked_fill(mask == 0, 0), mask


# ------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("head", [None, "NeoBERTLMHead", "NeoBERTForSequenceClassification"])
def test_bertblocks_computes_the_published_equations_and_saves_the_published_format(tmp_path, head):
    labels = {"id2label": {"0": "a", "1": "b", "2": "c"}} if head == "NeoBERTForSequenceClassification" else {}
    weights = _checkpoint(tmp_path / "neo", head, **labels)
    ours, info = bertblocks.from_pretrained(tmp_path / "neo", head="auto", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    ids, mask = _batch()
    expected = reference(weights, ids, mask)
    with torch.no_grad():
        got = ours.eval()(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    if head is not None:  # a task model returns its logits (the backbone's output is compared without a head)
        expected.pop("last_hidden_state")
    for field, value in expected.items():
        theirs, mine = value.float(), getattr(got, field)
        if field == "last_hidden_state" or theirs.dim() == 3:  # per token: real tokens only
            theirs, mine = theirs[real], mine[real]
        assert_close(mine, theirs, what=field)

    ours.save_pretrained(tmp_path / "ours")
    saved = load_file(str(tmp_path / "ours" / "model.safetensors"))
    assert sorted(saved) == sorted(weights)  # the published names, nothing more or less
    for key, tensor in weights.items():
        assert torch.equal(saved[key], tensor), key
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    for field in ("hidden_size", "intermediate_size", "max_length", "norm_eps", "dim_head", "auto_map"):
        assert written[field] == CONFIG[field], field
    assert written["architectures"] == [head or "NeoBERT"]
    assert "bertblocks" not in written  # NeoBERT's own fields say everything


def test_the_reference_is_sensitive_to_what_the_family_must_get_right(tmp_path):
    """The layout of qkv and the RoPE pairing each change the numbers: a family reading either wrongly fails."""
    weights = _checkpoint(tmp_path / "neo", None)
    ids, mask = _batch()
    real = mask.bool()
    expected = reference(weights, ids, mask)["last_hidden_state"][real].float()
    for override in ("encoder.attention.qkv_layout=blocks", "position.interleaved=false"):
        wrong = bertblocks.from_pretrained(tmp_path / "neo", [override]).eval()
        with torch.no_grad():
            got = wrong(input_ids=ids, attention_mask=mask).last_hidden_state[real]
        assert (got - expected).abs().max().item() > 1e-3, override


def test_the_swiglu_width_is_published_rounding():
    assert swiglu_width(3072) == 2048  # NeoBERT's published 768-wide model
    assert swiglu_width(50) == 40  # int(33.3) = 33, rounded up to a multiple of 8
    config = validate_config(config_from_hf({**CONFIG, "intermediate_size": 50}))
    assert config.encoder.feedforward.intermediate_size == 40
    assert config_to_hf(config)["intermediate_size"] == 50  # the field as written, not 3·40/2


def test_a_config_json_naming_remote_classes_is_accepted_because_the_family_translates_it():
    config = validate_config(config_from_hf(CONFIG))
    assert config.family == "neobert"
    assert config.hf["auto_map"] == CONFIG["auto_map"]  # kept for the round trip, never imported


REFUSED = {
    "dim_head": ({"dim_head": 16}, "dim_head=16"),
    "hidden_act": ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    "rms_norm": ({"rms_norm": False}, "rms_norm=False"),
    "rope": ({"rope": False}, "rope=False"),
    "ngpt": ({"ngpt": True}, "ngpt=True"),
    "rope_theta": ({"rope_theta": 500.0}, "rope_theta=500.0"),
    "max_position_embeddings": ({"max_position_embeddings": 32}, "max_position_embeddings=32"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_fields_bertblocks_cannot_honour_are_refused_by_name(case):
    extra, message = REFUSED[case]
    with pytest.raises(BertBlocksError, match=re.escape(message)):
        config_from_hf({**CONFIG, **extra})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"encoder": {"feedforward": {"intermediate_size": 44}}}, "intermediate_size=44"),
        ({"position": {"base": 500.0}}, "position.base=500.0"),
        ({"head": {"name": "dense_pooled_classification", "pooling": "mean"}}, "pooling: first"),
    ],
)
def test_a_neobert_config_its_fields_cannot_state_is_refused_on_save(change, message):
    config = validate_config(deep_merge(config_from_hf(CONFIG), change))
    with pytest.raises(BertBlocksError, match=re.escape(message)):
        config_to_hf(config)


def test_the_family_fixes_its_composition():
    with pytest.raises(ConfigError, match=r"encoder\.attention\.qkv_layout"):
        config_from_hf({**CONFIG, "bertblocks": {"encoder": {"attention": {"qkv_layout": "blocks"}}}})


def test_pruning_a_head_of_the_per_head_fused_projection_equals_masking_it(tmp_path):
    _checkpoint(tmp_path / "neo", None)
    model = bertblocks.from_pretrained(tmp_path / "neo").eval()
    ids, mask = _batch()
    head_mask = torch.ones(LAYERS, HEADS)
    head_mask[0, 1] = head_mask[1, 3] = 0
    with torch.no_grad():
        masked = model(input_ids=ids, attention_mask=mask, head_mask=head_mask).last_hidden_state
        model.prune_heads({0: [1], 1: [3]})
        pruned = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert model.encoder.layer[0].attention.self.Wqkv.weight.shape == (3 * (HEADS - 1) * D, H)
    assert_close(pruned[mask.bool()], masked[mask.bool()], what="pruned vs masked")


#: the published checkpoint's tensors (172: 4 outside the layers, 6 per layer), with their shapes
PUBLISHED_SHAPES = {
    "decoder.bias": (30522,),
    "decoder.weight": (30522, 768),
    "model.encoder.weight": (30522, 768),
    "model.layer_norm.weight": (768,),
    **{
        f"model.transformer_encoder.{i}.{name}": shape
        for i in range(28)
        for name, shape in {
            "attention_norm.weight": (768,),
            "ffn.w12.weight": (4096, 768),
            "ffn.w3.weight": (768, 2048),
            "ffn_norm.weight": (768,),
            "qkv.weight": (2304, 768),
            "wo.weight": (768, 768),
        }.items()
    },
}


def test_the_neobert_preset_has_the_published_checkpoint_s_tensors():
    from bertblocks.hf.families import model_to_checkpoint

    config = validate_config({**bertblocks.load_config("neobert").model_dump(), "head": {"name": "linear_masked_lm"}})
    with torch.device("meta"):
        model = bertblocks.create_model(config)  # a task model: its keys are bert.… and decoder.…
    mapped = model_to_checkpoint(model.state_dict(), config)
    assert {k: tuple(v.shape) for k, v in mapped.items()} == PUBLISHED_SHAPES
    assert len(PUBLISHED_SHAPES) == 172


def test_tiny_neobert_saves_and_loads_back(tmp_path):
    torch.manual_seed(0)
    model = bertblocks.create_model("tiny-neobert").eval()
    model.save_pretrained(tmp_path)
    again = bertblocks.from_pretrained(tmp_path).eval()
    ids = torch.randint(1, 1024, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).last_hidden_state, again(input_ids=ids).last_hidden_state)


@pytest.mark.parametrize(("tied", "bias"), [(True, True), (False, False), (True, False)])
def test_later_exports_tied_decoder_and_no_decoder_bias(tmp_path, tied, bias):
    """Later NeoBERT exports may tie the decoder to the embeddings and drop its bias (``tie_word_embeddings``,
    ``lm_head_bias``): the checkpoint then holds no decoder weight (tied) or no bias."""
    weights = _weights("NeoBERTLMHead", tied=tied, bias=bias)
    folder = tmp_path / "neo"
    folder.mkdir()
    save_file(weights, str(folder / "model.safetensors"))
    fields = {"tie_word_embeddings": tied, "lm_head_bias": bias}
    (folder / "config.json").write_text(json.dumps({**CONFIG, **fields}))
    ours, info = bertblocks.from_pretrained(folder, head="auto", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    ids, mask = _batch()
    with torch.no_grad():
        got = ours.eval()(input_ids=ids, attention_mask=mask).logits
    expected = reference(weights, ids, mask, lm=True)["logits"].float()
    assert_close(got[mask.bool()], expected[mask.bool()], what="logits")
    ours.save_pretrained(tmp_path / "ours")
    assert sorted(load_file(str(tmp_path / "ours" / "model.safetensors"))) == sorted(weights)
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["tie_word_embeddings"] is tied
    assert written.get("lm_head_bias", True) is bias


def test_the_tokenizer_is_bert_s_wordpiece_without_token_types(tmp_path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from bertblocks import BertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        ["the quick brown fox jumps over the lazy dog"] * 20,
        trainers.WordPieceTrainer(vocab_size=100, special_tokens=specials),
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))  # the published file, auto_map included
    ours = BertTokenizer.from_pretrained(tmp_path)
    encoded = ours("the fox", "a dog", return_tensors=None)
    assert "token_type_ids" not in encoded
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    a, b = (tok.encode(text, add_special_tokens=False).ids for text in ("the fox", "a dog"))
    assert encoded["input_ids"] == [cls, *a, sep, *b, sep]
