"""ModernBERT, every head transformers has for it: tiny random checkpoints saved by transformers' own classes (4
layers, so global and local layers both occur; a local window shorter than the batch, so it matters) load with
``from_pretrained(dir, head="auto")`` and give the same numbers on padded batches, losses included; saved by
bertblocks, the same class loads them with no missing or unexpected keys and gives the same numbers again. Plus the
config.json forms (old and new), what the family refuses, the presets and the tokenizer convention."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import bertblocks
from bertblocks import BertTokenizer
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import config_from_hf, config_to_hf

TOL = 1e-5
B, L, C = 2, 14, 3  # batch, sequence (> local window 4), choices
PAD = 0
TINY: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 32,
    "intermediate_size": 24,
    "num_hidden_layers": 4,  # layers 0 and 3 global, 1 and 2 local
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "initializer_range": 0.2,  # sharp attention: a wrong query/key/mask/window shows in the numbers
    "local_attention": 4,  # ±2 tokens
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 1000.0,
    "local_rope_theta": 50.0,
    "pad_token_id": PAD,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "cls_token_id": 1,
    "sep_token_id": 2,
    "num_labels": 3,
}
#: every bias and the other choices flipped from ModernBERT's defaults
BIASED = {
    **TINY,
    "attention_bias": True,
    "mlp_bias": True,
    "norm_bias": True,
    "classifier_bias": True,
    "decoder_bias": False,
    "classifier_pooling": "mean",
    "classifier_activation": "silu",
    "hidden_activation": "gelu_pytorch_tanh",
}
CLASSES = (
    "ModernBertModel",
    "ModernBertForMaskedLM",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertForQuestionAnswering",
    "ModernBertForMultipleChoice",
)
VARIANTS = {"default": TINY, "biased": BIASED}
CASES = [(v, cls) for v in VARIANTS for cls in CLASSES]
FIELDS = ("loss", "last_hidden_state", "logits", "start_logits", "end_logits")


def save_hf(cls: str, directory: Path, settings: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(0)
    settings = dict(settings)
    if cls.endswith("QuestionAnswering"):
        settings["num_labels"] = 2
    model = getattr(transformers, cls)(transformers.ModernBertConfig(**settings)).eval()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model.save_pretrained(directory)
    return model


def batch(cls: str, left: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Inputs with padding in the second row (on the left if ``left``), labels of the head's kind; the mask."""
    g = torch.Generator().manual_seed(1)
    shape = (B, C, L) if cls.endswith("MultipleChoice") else (B, L)
    ids = torch.randint(3, 99, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    if left:
        mask[1, ..., :5] = 0
    else:
        mask[1, ..., 9:] = 0
    ids = ids.masked_fill(mask == 0, PAD)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if cls.endswith("MaskedLM"):
        inputs["labels"] = torch.randint(0, 99, shape, generator=g).masked_fill(mask == 0, -100)
        inputs["labels"][0, ::2] = -100  # some real tokens unlabelled too (sparse prediction skips them)
    elif cls.endswith("SequenceClassification"):
        inputs["labels"] = torch.tensor([0, 2])
    elif cls.endswith("TokenClassification"):
        inputs["labels"] = torch.randint(0, 3, shape, generator=g).masked_fill(mask == 0, -100)
    elif cls.endswith("QuestionAnswering"):
        inputs["start_positions"] = torch.tensor([1, 3])
        inputs["end_positions"] = torch.tensor([4, 40])  # out of range: clamped and ignored, as transformers
    elif cls.endswith("MultipleChoice"):
        inputs["labels"] = torch.tensor([1, 2])
    return inputs, mask


def max_diff(theirs: Any, ours: Any, mask: torch.Tensor) -> float:
    """The largest difference over the compared fields (per-token fields on real tokens only)."""
    worst, compared = 0.0, 0
    for name in FIELDS:
        a, b = getattr(theirs, name, None), getattr(ours, name, None)
        if a is None:
            continue
        assert b is not None, f"bertblocks returned no {name}"
        assert a.shape == b.shape, f"{name}: {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.dim() >= 2 and a.shape[: mask.dim()] == mask.shape:
            a, b = a[mask.bool()], b[mask.bool()]
        worst = max(worst, (a - b).abs().max().item())
        compared += 1
    assert compared >= 1
    return worst


def run_both(reference: torch.nn.Module, ours: torch.nn.Module, cls: str, inputs: dict[str, torch.Tensor]):
    if cls.endswith("Model"):
        inputs = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        return reference(**inputs), ours(**inputs)


# --------------------------------------------------------------------------------------------------- parity
@pytest.mark.parametrize(("variant", "cls"), CASES, ids=[f"{v}-{c}" for v, c in CASES])
def test_loads_transformers_checkpoint_and_saves_one_it_loads(tmp_path, variant, cls):
    reference = save_hf(cls, tmp_path / "hf", VARIANTS[variant])
    ours, info = bertblocks.from_pretrained(tmp_path / "hf", head="auto", output_loading_info=True)
    ours.eval()
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    inputs, mask = batch(cls)
    expected, got = run_both(reference, ours, cls, inputs)
    assert max_diff(expected, got, mask) <= TOL
    if "loss" in inputs or "labels" in inputs:
        assert got.loss is not None

    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == "modernbert"
    assert written["architectures"] == [cls]
    assert "bertblocks" not in written  # the family's own fields say everything
    again, hf_info = getattr(transformers, cls).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not hf_info["missing_keys"]
    assert not hf_info["unexpected_keys"]
    assert not hf_info["mismatched_keys"]
    assert again.config.layer_types == reference.config.layer_types
    assert again.config.rope_parameters == reference.config.rope_parameters
    for name in ("local_attention", "norm_bias", "classifier_pooling", "classifier_activation", "decoder_bias"):
        assert getattr(again.config, name) == getattr(reference.config, name), name
    _, reloaded = run_both(reference, again.eval(), cls, inputs)
    assert max_diff(expected, reloaded, mask) <= TOL


def test_the_window_and_the_local_base_matter_and_are_matched(tmp_path):
    """Guards against a parity that holds only because the local layers behave like global ones."""
    reference = save_hf("ModernBertModel", tmp_path / "hf", TINY)
    ours = bertblocks.from_pretrained(tmp_path / "hf").eval()
    inputs, mask = batch("ModernBertModel")
    wide = bertblocks.from_pretrained(tmp_path / "hf", overrides=["encoder.overrides=[]"]).eval()
    with torch.no_grad():
        want = reference(**inputs).last_hidden_state
        assert (ours(**inputs).last_hidden_state - want)[mask.bool()].abs().max() <= TOL
        assert (wide(**inputs).last_hidden_state - want)[mask.bool()].abs().max() > 1e-2


def test_multiple_choice_cls_is_the_first_real_token_under_left_padding(tmp_path):
    reference = save_hf("ModernBertForMultipleChoice", tmp_path / "hf", TINY)
    ours = bertblocks.from_pretrained(tmp_path / "hf", head="auto").eval()
    assert ours.config.head.options()["pooling"] == "first_real"
    inputs, mask = batch("ModernBertForMultipleChoice", left=True)
    expected, got = run_both(reference, ours, "ModernBertForMultipleChoice", inputs)
    assert max_diff(expected, got, mask) <= TOL


def test_sparse_prediction_scores_only_labelled_positions(tmp_path):
    reference = save_hf("ModernBertForMaskedLM", tmp_path / "hf", {**TINY, "sparse_prediction": True})
    ours = bertblocks.from_pretrained(tmp_path / "hf", head="auto").eval()
    inputs, _ = batch("ModernBertForMaskedLM")
    expected, got = run_both(reference, ours, "ModernBertForMaskedLM", inputs)
    labelled = int((inputs["labels"] != -100).sum())
    assert got.logits.shape == (labelled, 99)
    assert (expected.logits - got.logits).abs().max() <= TOL
    assert (expected.loss - got.loss).abs() <= TOL


def test_hidden_states_equal_transformers(tmp_path):
    reference = save_hf("ModernBertModel", tmp_path / "hf", TINY)
    ours = bertblocks.from_pretrained(tmp_path / "hf").eval()
    inputs, mask = batch("ModernBertModel")
    with torch.no_grad():
        theirs = reference(**inputs, output_hidden_states=True).hidden_states
        mine = ours(**inputs, output_hidden_states=True).hidden_states
    assert len(mine) == len(theirs)
    for a, b in zip(theirs, mine, strict=True):
        assert (a - b)[mask.bool()].abs().max() <= TOL


# ----------------------------------------------------------------------------------------------- config.json
def test_old_config_form_and_explicit_layer_types_read_the_same_model():
    old = {"model_type": "modernbert", **TINY}
    new = transformers.ModernBertConfig(**TINY).to_dict()
    a, b = bertblocks.load_config(config_from_hf(old)), bertblocks.load_config(config_from_hf(new))
    assert a.model_dump(exclude={"hf"}) == b.model_dump(exclude={"hf"})  # hf: the fields kept aside differ
    (override,) = a.encoder.overrides
    assert override.layers == [1, 2]
    assert override.position == {"base": 50.0}
    assert a.position.options()["base"] == 1000.0


def test_irregular_layer_types_round_trip():
    hf = transformers.ModernBertConfig(**{**TINY, "layer_types": ["sliding_attention", "full_attention"] * 2}).to_dict()
    cfg = bertblocks.load_config(config_from_hf(hf))
    assert cfg.encoder.overrides[0].layers == [0, 2]
    back = config_to_hf(cfg)
    assert back["layer_types"] == hf["layer_types"]
    assert "bertblocks" not in back


def test_layers_of_one_kind_that_differ_travel_in_the_bertblocks_block():
    cfg = bertblocks.load_config(config_from_hf({"model_type": "modernbert", **TINY}))
    changed = cfg.model_dump()
    changed["encoder"]["overrides"].append({"layers": [2], "position": {"base": 70.0}})
    cfg = bertblocks.load_config(changed)
    back = config_to_hf(cfg)
    assert "bertblocks" in back  # config.json has one local base; the other one must not be lost
    again = bertblocks.load_config(config_from_hf(json.loads(json.dumps(back))))
    assert again.model_dump(exclude={"hf"}) == cfg.model_dump(exclude={"hf"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}}, "rope_type 'linear'"),
        ({"layer_types": ["full_attention"]}, "layer_types must list"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling is not supported"),
        ({"bertblocks": {"encoder": {"layer": {"name": "post_ln"}}}}, "encoder.layer.name"),
    ],
)
def test_what_the_family_cannot_represent_is_an_error_naming_the_field(change, message):
    with pytest.raises(ConfigError, match=message):
        config_from_hf({"model_type": "modernbert", **TINY, **change})


# ---------------------------------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", ["modernbert-base", "modernbert-large"])
def test_presets_count_the_parameters_transformers_builds(name):
    cfg = bertblocks.load_config(name)
    assert cfg.family == "modernbert"
    hf = config_to_hf(cfg)
    assert "bertblocks" not in hf
    with torch.device("meta"):
        ours = bertblocks.BertModel.from_config(cfg)
        theirs = transformers.ModernBertModel(transformers.ModernBertConfig(**hf))
    assert ours.num_parameters == sum(p.numel() for p in theirs.parameters())
    assert theirs.config.layer_types.count("full_attention") == -(-cfg.encoder.num_layers // 3)


# -------------------------------------------------------------------------------------------------- tokenizer
def test_bpe_tokenizer_ids_equal_transformers(tmp_path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    corpus = ["the quick brown fox jumps over the lazy dog", "models load checkpoints and save them"] * 10
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    plain = tmp_path / "plain"
    plain.mkdir()
    tok.save(str(plain / "tokenizer.json"))  # no post-processor: the family's template frames the texts
    (plain / "config.json").write_text(json.dumps({"model_type": "modernbert"}))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    ours = BertTokenizer.from_pretrained(plain)
    a = tok.encode("the lazy dog", add_special_tokens=False).ids
    b = tok.encode("save them", add_special_tokens=False).ids
    assert ours("the lazy dog", "save them", return_tensors=None)["input_ids"] == [cls, *a, sep, *b, sep]

    framed = tmp_path / "framed"
    framed.mkdir()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.save(str(framed / "tokenizer.json"))
    (framed / "config.json").write_text(json.dumps({"model_type": "modernbert"}))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_input_names": ["input_ids", "attention_mask"],
        **{f"{k}_token": f"[{k.upper()}]" for k in ("cls", "sep", "pad", "unk", "mask")},
    }
    (framed / "tokenizer_config.json").write_text(json.dumps(settings))
    theirs = transformers.AutoTokenizer.from_pretrained(framed)
    ours = BertTokenizer.from_pretrained(framed)
    texts, pairs = ["the quick fox", "models load them again"], ["a lazy dog", "checkpoints"]
    for args in ((texts,), (texts, pairs)):
        expected = theirs(*args, padding=True, return_tensors="pt")
        got = ours(*args)
        assert sorted(got) == sorted(expected.keys()) == ["attention_mask", "input_ids"]
        for key in got:
            assert got[key].tolist() == expected[key].tolist(), key
    assert ours.pad_token_id == theirs.pad_token_id == tok.token_to_id("[PAD]")


# ------------------------------------------------------------------------------------- padded local windows
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_padding_positions_whose_window_is_all_padding_match_the_same_kernel(tmp_path, implementation):
    """transformers gives such a query zeros under sdpa and the mean of the values under eager; a QA loss
    (a softmax over every position) sees the difference, so each kernel must match its own."""
    from bertblocks.plugins.backends import EagerBackend, SlidingWindowBackend

    save_hf("ModernBertModel", tmp_path / "hf", TINY)
    reference = transformers.ModernBertModel.from_pretrained(tmp_path / "hf", attn_implementation=implementation)
    ours = bertblocks.from_pretrained(tmp_path / "hf").eval()
    if implementation == "eager":
        for layer in ours.encoder.layer:
            local = isinstance(layer.attention.backend, SlidingWindowBackend)
            layer.attention.backend = SlidingWindowBackend(4, "eager") if local else EagerBackend()
    inputs, _ = batch("ModernBertModel")
    with torch.no_grad():
        want = reference.eval()(**inputs).last_hidden_state
        got = ours(**inputs).last_hidden_state
    assert (got - want).abs().max() <= TOL  # every position, padding included
    other = transformers.ModernBertModel.from_pretrained(
        tmp_path / "hf", attn_implementation="eager" if implementation == "sdpa" else "sdpa"
    )
    with torch.no_grad():
        assert (other.eval()(**inputs).last_hidden_state - want).abs().max() > 1e-2  # the rows exist in the batch


# --------------------------------------------------------------------------------------- packing and compile
def _uneven_batch() -> dict[str, torch.Tensor]:
    """Rows of 14, 9 and 3 real tokens: over a third padding, so `auto` packs too."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 99, (3, L), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 3:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, PAD), "attention_mask": mask}


@pytest.mark.parametrize("packing", ["auto", "always"])
def test_packed_path_equals_transformers(tmp_path, packing):
    reference = save_hf("ModernBertModel", tmp_path / "hf", TINY)
    model = bertblocks.from_pretrained(tmp_path / "hf", [f"encoder.packing={packing}"]).eval()
    inputs = _uneven_batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = reference(**inputs).last_hidden_state
        got = model(**inputs).last_hidden_state
    assert (got[real] - want[real]).abs().max() <= TOL
    assert got[~real].abs().max() == 0  # the run really was packed (padding holds zeros)


@pytest.mark.compile
def test_compiled_model_equals_transformers(tmp_path):
    reference = save_hf("ModernBertModel", tmp_path / "hf", TINY)
    model = bertblocks.from_pretrained(tmp_path / "hf").eval()
    inputs = _uneven_batch()
    real = inputs["attention_mask"].bool()
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # no graph break anywhere
        with torch.no_grad():
            got = compiled(**inputs).last_hidden_state
    finally:
        torch._dynamo.reset()
    with torch.no_grad():
        want = reference(**inputs).last_hidden_state
    assert (got[real] - want[real]).abs().max() <= TOL
