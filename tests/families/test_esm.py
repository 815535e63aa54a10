"""ESM-1b / ESM-2 (``esm``), what only this family does: token dropout in evaluation and training; padded positions;
the stored inverse frequencies (transformers 5's one key and the older per-layer copies); ``inputs_embeds``; the
contact head's weights; EsmTokenizer's split of its vocab.txt; what is refused. Parity of every head (and of
ESM-1b and of no token dropout: the ``esm-1b`` and ``esm-no-token-dropout`` rows), the padded and packed paths,
hidden states, in-memory names, the refusals of config.json, the tokenizer convention, the presets and the
per-family paths on protein sequences: the tables of ``test_parity.py`` and ``test_family_paths.py``."""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.config.errors import ConfigError
from bertblocks.errors import BertBlocksError
from tests.families.reference import ESM_VOCAB, FAMILIES, TOL, batch, save_hf

ESM = FAMILIES["esm"]
MASK = ESM.mask_token  # batch() puts it in every row (twice in the padded one), so that token dropout rescales


@pytest.mark.parametrize("training", [False, True])
def test_token_dropout_and_padding_every_position(tmp_path, training):
    """Every position (padding too: ESM zeroes padded embeddings) and every hidden state, in evaluation and in
    training (token dropout rescales in both; dropout probabilities 0 so that the runs are comparable)."""
    reference = save_hf(ESM, "EsmForMaskedLM", tmp_path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = bertblocks.from_pretrained(tmp_path, head="auto")
    inputs, _ = batch(ESM, "EsmForMaskedLM")
    reference.train(training)
    ours.train(training)
    expected = reference(**inputs, output_hidden_states=True)
    got = ours(**inputs, output_hidden_states=True)
    assert (expected.logits - got.logits).abs().max().item() <= TOL
    assert (expected.loss - got.loss).abs().item() <= TOL
    assert len(expected.hidden_states) == len(got.hidden_states)
    for a, b in zip(expected.hidden_states, got.hidden_states, strict=True):
        assert (a - b).abs().max().item() <= TOL
    expected.loss.backward()
    got.loss.backward()
    a = reference.esm.embeddings.word_embeddings.weight.grad
    b = ours.bert.embeddings.word_embeddings.weight.grad
    assert (a - b).abs().max().item() <= TOL


def test_token_dropout_changes_the_numbers(tmp_path):
    """The rescaling is there: the same weights without token_dropout give other numbers (so the tests above
    would see it missing)."""
    save_hf(ESM, "EsmModel", tmp_path)
    inputs, mask = batch(ESM, "EsmModel")
    with torch.no_grad():
        on = bertblocks.from_pretrained(tmp_path).eval()(**inputs).last_hidden_state
        off = bertblocks.from_pretrained(tmp_path, ["embedding.token_dropout=false"]).eval()(**inputs)
    assert (on - off.last_hidden_state)[mask.bool()].abs().max().item() > 1e-3


def test_inputs_embeds_skip_the_embeddings(tmp_path):
    reference = save_hf(ESM, "EsmModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    inputs, mask = batch(ESM, "EsmModel")
    embeds = torch.randn(*inputs["input_ids"].shape, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = reference(inputs_embeds=embeds, attention_mask=inputs["attention_mask"]).last_hidden_state
        got = ours(inputs_embeds=embeds, attention_mask=inputs["attention_mask"]).last_hidden_state
    assert (expected - got)[mask.bool()].abs().max().item() <= TOL


def test_stored_inverse_frequencies_are_read_in_both_layouts(tmp_path):
    """Per-layer copies (older checkpoints) load from layer 0, as transformers' load hook does; values that differ
    from the formula are the ones used, by both."""
    save_hf(ESM, "EsmModel", tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    (shared,) = [k for k in state if k.endswith("inv_freq")]
    assert shared == "encoder.layer.*.attention.self.rotary_embeddings.inv_freq"  # transformers 5's own key
    value = state.pop(shared) * 0.9
    for i in range(2):
        state[f"encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq"] = value.clone()
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    reference = transformers.EsmModel.from_pretrained(tmp_path).eval()
    ours, info = bertblocks.from_pretrained(tmp_path, output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    assert torch.equal(ours.encoder.rotary_embeddings.inv_freq, value)
    inputs, mask = batch(ESM, "EsmModel")
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state[mask.bool()]
        got = ours.eval()(**inputs).last_hidden_state[mask.bool()]
    assert (expected - got).abs().max().item() <= TOL


def test_the_contact_head_weights_round_trip_frozen(tmp_path):
    save_hf(ESM, "EsmForMaskedLM", tmp_path / "hf")
    state = load_file(tmp_path / "hf" / "model.safetensors")
    ours = bertblocks.from_pretrained(tmp_path / "hf", head="auto")
    regression = ours.bert.embeddings.contact_head.regression
    assert torch.equal(regression.weight, state["esm.contact_head.regression.weight"])
    assert not regression.weight.requires_grad  # never run: no unused trainable parameter (DDP)
    ours.save_pretrained(tmp_path / "ours")
    again = load_file(tmp_path / "ours" / "model.safetensors")
    assert torch.equal(again["esm.contact_head.regression.weight"], state["esm.contact_head.regression.weight"])


def test_a_three_dimensional_mask_is_refused_naming_the_shape(tmp_path):
    save_hf(ESM, "EsmModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    ids = torch.randint(5, 99, (2, 6))
    with pytest.raises(ValueError, match="2-D attention_mask"):
        ours(input_ids=ids, attention_mask=torch.ones(2, 6, 6, dtype=torch.long))


def test_token_dropout_without_a_mask_token_is_refused():
    with pytest.raises(BertBlocksError, match="mask_token_id"):
        bertblocks.create_model("tiny-esm", ["embedding.mask_token_id=null"])


def test_a_contact_head_of_another_depth_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="contact_head_features 8 must be num_layers × num_heads = 3 × 4"):
        bertblocks.create_model("tiny-esm", ["encoder.num_layers=3"])
    bertblocks.create_model("tiny-esm", ["encoder.num_layers=3", "embedding.contact_head_features=12"])


def test_vocab_txt_splits_as_esm_tokenizer_splits(tmp_path):
    """ESM ships vocab.txt only: one token per residue (BERT's lower-cased WordPiece would make every sequence one
    unknown word), what is not in the vocabulary split at whitespace into unknown words, special tokens kept."""
    import json

    from bertblocks import BertTokenizer

    (tmp_path / "vocab.txt").write_text("".join(f"{token}\n" for token in ESM_VOCAB))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "EsmTokenizer"}))
    texts = ["MKTAYIAKQR", "LAG<mask>V", "M K T", "mkt ABx yZ", "A.-<null_1>"]
    theirs = transformers.EsmTokenizer.from_pretrained(tmp_path)
    ours = BertTokenizer.from_pretrained(tmp_path)  # no config.json: the family from the tokenizer class
    for args in ((texts,), (texts, texts[::-1])):
        expected = theirs(*args, padding=True, return_tensors="pt")
        got = ours(*args)
        assert sorted(got) == sorted(expected.keys())  # no token types
        for key in got:
            assert got[key].tolist() == expected[key].tolist(), key
    assert (ours.pad_token_id, ours.mask_token_id) == (theirs.pad_token_id, theirs.mask_token_id)


def test_a_vocab_txt_without_esm_s_special_tokens_is_refused_naming_them(tmp_path):
    import json

    from bertblocks import BertTokenizer
    from bertblocks.hf.tokenizer import TokenizerFileError

    (tmp_path / "vocab.txt").write_text("".join(f"{token}\n" for token in ESM_VOCAB if token != "<mask>"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "esm"}))
    with pytest.raises(TokenizerFileError, match=r"special tokens \['<mask>'\] are not in .*vocab\.txt"):
        BertTokenizer.from_pretrained(tmp_path)
