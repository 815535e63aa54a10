"""ModernBERT, what only this family does (tiny random checkpoints saved by transformers' own classes, 4 layers
so that global and local layers both occur, a local window shorter than the batch): the window and the local rope
base matter; the multiple-choice head pools the first real token under left padding; sparse prediction scores only
labelled positions; the config.json forms (old and new, irregular layer types, layers that differ); the presets'
parameter counts; the BPE tokenizer convention; padded positions whose whole window is padding; the packed path.
The compiled path is ``test_family_paths.py``'s ``modernbert`` row (the same settings; its batch has rows shorter
and longer than the window). Parity of every head (two variants: defaults, and every bias and choice flipped), the
padded and packed paths under left padding, hidden states, the errors and the presets: the tables of
``test_parity.py``."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import bertblocks
from bertblocks import BertTokenizer
from bertblocks.hf.config_json import config_from_hf, config_to_hf

from .reference import FAMILIES, TOL, assert_same, batch, call_inputs, save_hf

MODERNBERT = FAMILIES["modernbert"]
TINY = MODERNBERT.settings
L, PAD = MODERNBERT.length, MODERNBERT.pad


def run_both(reference: torch.nn.Module, ours: torch.nn.Module, cls: str, inputs: dict[str, torch.Tensor]):
    inputs = call_inputs(cls, inputs)
    with torch.no_grad():
        return reference(**inputs), ours(**inputs)


# ------------------------------------------------------------------------------------------ what only it does
def test_the_window_and_the_local_base_matter_and_are_matched(tmp_path):
    """Guards against a parity that holds only because the local layers behave like global ones."""
    reference = save_hf(MODERNBERT, "ModernBertModel", tmp_path / "hf")
    ours = bertblocks.from_pretrained(tmp_path / "hf").eval()
    inputs, mask = batch(MODERNBERT, "ModernBertModel")
    wide = bertblocks.from_pretrained(tmp_path / "hf", overrides=["encoder.overrides=[]"]).eval()
    with torch.no_grad():
        want = reference(**inputs).last_hidden_state
        assert (ours(**inputs).last_hidden_state - want)[mask.bool()].abs().max() <= TOL
        assert (wide(**inputs).last_hidden_state - want)[mask.bool()].abs().max() > 1e-2


def test_multiple_choice_cls_is_the_first_real_token_under_left_padding(tmp_path):
    reference = save_hf(MODERNBERT, "ModernBertForMultipleChoice", tmp_path / "hf")
    ours = bertblocks.from_pretrained(tmp_path / "hf", head="auto").eval()
    assert ours.config.head.options()["pooling"] == "first_real"
    inputs, mask = batch(MODERNBERT, "ModernBertForMultipleChoice", left=True)
    expected, got = run_both(reference, ours, "ModernBertForMultipleChoice", inputs)
    assert_same(expected, got, mask)


def test_sparse_prediction_scores_only_labelled_positions(tmp_path):
    reference = save_hf(MODERNBERT, "ModernBertForMaskedLM", tmp_path / "hf", sparse_prediction=True)
    ours = bertblocks.from_pretrained(tmp_path / "hf", head="auto").eval()
    inputs, _ = batch(MODERNBERT, "ModernBertForMaskedLM")
    expected, got = run_both(reference, ours, "ModernBertForMaskedLM", inputs)
    labelled = int((inputs["labels"] != -100).sum())
    assert got.logits.shape == (labelled, 99)
    assert (expected.logits - got.logits).abs().max() <= TOL
    assert (expected.loss - got.loss).abs() <= TOL


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


# ---------------------------------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", ["modernbert-base", "modernbert-large"])
def test_presets_count_the_parameters_transformers_builds(name):
    cfg = bertblocks.load_config(name)
    assert cfg.family == "modernbert"
    hf = config_to_hf(cfg)
    assert "bertblocks" not in hf
    with torch.device("meta"):
        ours = bertblocks.create_model(cfg)
        theirs = transformers.ModernBertModel(transformers.ModernBertConfig(**hf))
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())
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

    save_hf(MODERNBERT, "ModernBertModel", tmp_path / "hf")
    reference = transformers.ModernBertModel.from_pretrained(tmp_path / "hf", attn_implementation=implementation)
    ours = bertblocks.from_pretrained(tmp_path / "hf").eval()
    if implementation == "eager":
        for layer in ours.encoder.layer:
            local = isinstance(layer.attention.backend, SlidingWindowBackend)
            layer.attention.backend = SlidingWindowBackend(4, "eager") if local else EagerBackend()
    inputs, _ = batch(MODERNBERT, "ModernBertModel")
    with torch.no_grad():
        want = reference.eval()(**inputs).last_hidden_state
        got = ours(**inputs).last_hidden_state
    assert (got - want).abs().max() <= TOL  # every position, padding included
    other = transformers.ModernBertModel.from_pretrained(
        tmp_path / "hf", attn_implementation="eager" if implementation == "sdpa" else "sdpa"
    )
    with torch.no_grad():
        assert (other.eval()(**inputs).last_hidden_state - want).abs().max() > 1e-2  # the rows exist in the batch


# ------------------------------------------------------------------------------------------------------ packing
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
    reference = save_hf(MODERNBERT, "ModernBertModel", tmp_path / "hf")
    model = bertblocks.from_pretrained(tmp_path / "hf", [f"encoder.packing={packing}"]).eval()
    inputs = _uneven_batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = reference(**inputs).last_hidden_state
        got = model(**inputs).last_hidden_state
    assert (got[real] - want[real]).abs().max() <= TOL
    assert got[~real].abs().max() == 0  # the run really was packed (padding holds zeros)
