"""EuroBERT (``eurobert``), what only this family does: each ``classifier_pooling`` (and the remote code's
``clf_pooling``, ``auto_map``), a legacy ``rope_theta``, regression and multi-label losses, gradients, what a
config cannot state on save, the config.json it writes, and the framing of a tokenizer.json without one. Parity
of every head (and of grouped-query with biases, multi-query with tied embeddings: the ``eurobert-*`` rows), the
padded and packed paths, hidden states, the refusals of config.json, the presets and the per-family paths: the
tables of ``test_parity.py`` and ``test_family_paths.py``."""

from __future__ import annotations

import json
import re

import pytest
import torch

import bertblocks
from bertblocks.config import deep_merge
from bertblocks.errors import BertBlocksError
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.registry import validate_config
from tests.families.reference import FAMILIES, batch, round_trip, save_hf
from tests.tolerances import assert_grads_close

EUROBERT = FAMILIES["eurobert"]


@pytest.mark.parametrize("pooling", ["bos", "mean", "late"])
def test_every_classifier_pooling_matches_transformers(tmp_path, pooling):
    round_trip(tmp_path, EUROBERT, "EuroBertForSequenceClassification", classifier_pooling=pooling)


def test_a_legacy_top_level_rope_theta_matches_transformers_both_ways(tmp_path):
    """Older EuroBERT files give rope_theta at the top level, no rope_parameters (grouped-query and biased
    variants: the table's eurobert-* rows)."""
    for cls in ("EuroBertModel", "EuroBertForMaskedLM"):
        round_trip(tmp_path / cls, EUROBERT, cls, rope_parameters=None, rope_theta=30.0)


def test_regression_and_multi_label_losses(tmp_path):
    """problem_type inferred as transformers infers it: one label → MSE; float labels → BCE."""
    for num_labels, labels in ((1, torch.tensor([0.5, -1.0])), (3, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))):
        folder = tmp_path / str(num_labels)
        reference = save_hf(EUROBERT, "EuroBertForSequenceClassification", folder, num_labels=num_labels)
        inputs, _ = batch(EUROBERT, "EuroBertForSequenceClassification")
        inputs["labels"] = labels
        ours = bertblocks.from_pretrained(folder, head="auto").eval()
        with torch.no_grad():
            expected, got = reference(**inputs), ours(**inputs)
        assert (expected.loss - got.loss).abs().item() <= 1e-5
        assert ours.config.problem_type == reference.config.problem_type


def test_gradients_match_transformers(tmp_path):
    reference = save_hf(EUROBERT, "EuroBertForMaskedLM", tmp_path, num_key_value_heads=2, attention_bias=True)
    ours = bertblocks.from_pretrained(tmp_path, head="auto")
    inputs, _ = batch(EUROBERT, "EuroBertForMaskedLM")
    reference.train()
    ours.train()
    reference(**inputs).loss.backward()
    ours(**inputs).loss.backward()
    theirs = {k: p.grad for k, p in reference.named_parameters()}
    mine = dict(ours.named_parameters())
    pairs = {
        "model.embed_tokens.weight": "bert.embeddings.word_embeddings.weight",
        "model.layers.0.self_attn.k_proj.weight": "bert.encoder.layer.0.attention.self.key.weight",
        "model.layers.1.mlp.gate_proj.weight": "bert.encoder.layer.1.intermediate.gate.weight",
        "model.norm.weight": "bert.encoder.final_norm.weight",
        "lm_head.weight": "decoder.weight",
    }
    for hf_name, name in pairs.items():
        assert name in mine, sorted(mine)
        assert_grads_close(mine[name].grad, theirs[hf_name], what=name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"encoder": {"attention": {"output_bias": True}}}, "qkv_bias and output_bias"),
        ({"head": {"name": "linear_masked_lm", "decoder_bias": True}}, "decoder_bias"),
        ({"head": {"name": "dense_pooled_classification", "activation": "tanh"}}, "head.activation='tanh'"),
    ],
)
def test_a_config_eurobert_cannot_state_is_refused_on_save(change, message):
    data = config_from_hf({"model_type": "eurobert", **EUROBERT.settings})
    config = validate_config(deep_merge(data, change))
    with pytest.raises(BertBlocksError, match=re.escape(message)):
        config_to_hf(config)


def test_written_config_json_is_eurobert_s_own(tmp_path):
    save_hf(EUROBERT, "EuroBertForSequenceClassification", tmp_path / "hf", num_key_value_heads=2)
    bertblocks.from_pretrained(tmp_path / "hf", head="auto").save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["num_key_value_heads"] == 2
    assert written["hidden_act"] == "silu"
    assert written["classifier_pooling"] == "late"
    assert written["mask_token_id"] == EUROBERT.settings["mask_token_id"]


#: the remote-code classes the published EuroBERT config.json files name (the code transformers' classes were
#: ported from)
AUTO_MAP = {
    "AutoConfig": "configuration_eurobert.EuroBertConfig",
    "AutoModel": "modeling_eurobert.EuroBertModel",
    "AutoModelForPreTraining": "modeling_eurobert.EuroBertPreTrainedModel",
    "AutoModelForMaskedLM": "modeling_eurobert.EuroBertForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_eurobert.EuroBertForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_eurobert.EuroBertForQuestionAnswering",
}


def test_a_published_config_json_with_its_own_auto_map_and_clf_pooling_loads(tmp_path):
    """The published files name EuroBERT's own remote classes, and fine-tuned ones the remote code's clf_pooling:
    both are read as transformers' native fields (nothing named is imported), and the numbers are transformers'."""
    reference = save_hf(EUROBERT, "EuroBertForSequenceClassification", tmp_path, classifier_pooling="mean")
    config = json.loads((tmp_path / "config.json").read_text())
    config["auto_map"] = AUTO_MAP
    config["clf_pooling"] = config.pop("classifier_pooling")
    (tmp_path / "config.json").write_text(json.dumps(config))
    ours = bertblocks.from_pretrained(tmp_path, head="auto").eval()
    assert ours.config.head.options()["pooling"] == "mean"
    inputs, _ = batch(EUROBERT, "EuroBertForSequenceClassification")
    with torch.no_grad():
        assert (reference(**inputs).logits - ours(**inputs).logits).abs().max().item() <= 1e-5
    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["classifier_pooling"] == "mean"  # the native name
    assert "clf_pooling" not in written


def test_a_tokenizer_json_without_post_processor_is_framed_eurobert_s_way(tmp_path):
    """Llama-3's specials with EuroBERT's mask: <|begin_of_text|> A <|end_of_text|>, no token types; the byte-level
    vocabulary has no unknown token, so <|end_of_text|> stands in for one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from bertblocks import BertTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "eurobert"}))
    ours = BertTokenizer.from_pretrained(tmp_path)
    encoded = ours("the fox", "a dog", return_tensors=None)
    assert "token_type_ids" not in encoded
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    a, b = (tok.encode(text, add_special_tokens=False).ids for text in ("the fox", "a dog"))
    assert encoded["input_ids"] == [bos, *a, eos, *b, eos]
    assert ours.mask_token_id == tok.token_to_id("<|mask|>")
    assert ours.pad_token_id == eos
