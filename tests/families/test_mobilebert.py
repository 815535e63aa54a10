"""MobileBERT beyond the shared rows of reference.py: every weight random (NoNorm's weights and biases, the unused
query/key bottleneck under ``use_bottleneck_attention``, the MLM head's ``dense``), so that a misplaced bias or a
swapped norm changes the numbers; the new components on their own (``no_norm`` in any family, the attention's
``value_input_size``); and the errors of configs the bottleneck layer and its heads cannot build."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

import bertblocks
from bertblocks import load_config
from bertblocks.plugins.norms import NoNorm
from bertblocks.testing import ConformanceSuite
from tests.conftest import TINY
from tests.tolerances import assert_close

from .reference import FAMILIES, MOBILEBERT, batch, call_inputs

CLASSES = ("MobileBertForPreTraining", "MobileBertForMaskedLM", "MobileBertForSequenceClassification")
#: the published choices (the reference row's), and the others: LayerNorm everywhere (torch's epsilon where
#: transformers builds it without layer_norm_eps), one bottleneck for queries, keys and values (the query/key one
#: still built, unused), no trigram, one feed-forward block, the pooler without dense (google/mobilebert-uncased's);
#: no bottleneck at all; a table as wide as the hidden size without trigram (the projection held, not applied)
VARIANTS = {
    "no_norm": {},
    "layer_norm-bottleneck_attention": {
        "normalization_type": "layer_norm",
        "use_bottleneck_attention": True,
        "trigram_input": False,
        "num_feedforward_networks": 1,
        "classifier_activation": False,
    },
    "plain": {"use_bottleneck": False, "trigram_input": False},
    "plain-equal-width": {"use_bottleneck": False, "trigram_input": False, "embedding_size": 32},
}


def _random_hf(cls: str, settings: dict, folder) -> torch.nn.Module:
    """transformers' ``cls`` with every parameter drawn at random (norms and biases included), saved to ``folder``."""
    torch.manual_seed(0)
    model = getattr(transformers, cls)(transformers.MobileBertConfig(**settings)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("cls", CLASSES)
def test_every_random_weight_round_trips_through_transformers(tmp_path, cls, variant):
    settings = {**MOBILEBERT, **VARIANTS[variant]}
    reference = _random_hf(cls, settings, tmp_path / "hf")
    inputs, mask = batch(FAMILIES["mobilebert"], cls)
    inputs = call_inputs(cls, inputs)
    ours = bertblocks.from_pretrained(tmp_path / "hf", head="auto").eval()
    with torch.no_grad():
        expected, got = reference(**inputs), ours(**inputs)
    real = mask.bool()  # per-token fields on real tokens (a packed pass leaves padded positions zero)
    for field in ("logits", "prediction_logits", "seq_relationship_logits", "loss"):
        want = getattr(expected, field, None)
        if want is None:
            continue
        have = getattr(got, field)
        if want.dim() == 3:
            have, want = have[real], want[real]
        assert_close(have, want)
    ours.save_pretrained(tmp_path / "ours")
    back = getattr(transformers, cls).from_pretrained(tmp_path / "ours").eval()
    state, ref_state = back.state_dict(), reference.state_dict()
    assert state.keys() == ref_state.keys()
    for key in ref_state:  # the same kernel on the same data: bertblocks wrote transformers' tensors back
        assert torch.equal(state[key], ref_state[key]), key


def test_no_norm_is_a_norm_any_family_selects():
    config = load_config({**TINY, "encoder": {**TINY["encoder"], "norm": {"name": "no_norm"}}})
    model = bertblocks.create_model(config).eval()
    norm = model.encoder.layer[0].output.LayerNorm
    assert isinstance(norm, NoNorm)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(2, 3, 32)
    assert_close(norm(x), x * norm.weight + norm.bias)  # no statistics: elementwise only


def test_value_input_size_reads_the_value_from_its_own_input():
    from bertblocks.plugins.attention import SelfAttentionProjections

    proj = SelfAttentionProjections(8, 8, None, value_input_size=12)
    assert proj.value.in_features == 12
    assert proj.query.in_features == 8
    qk, v = torch.randn(1, 2, 8), torch.randn(1, 2, 12)
    q, k, val = proj.project(torch.cat([qk, v], dim=-1))
    assert_close(q, proj.query(qk))
    assert_close(k, proj.key(qk))
    assert_close(val, proj.value(v))


def _mobile(**changes):
    config = load_config("tiny-mobilebert").model_dump(mode="json", exclude_defaults=True)
    for path, value in changes.items():
        node = config
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"encoder.attention.value_input_size": None}, "value_input_size must be hidden_size 32"),
        ({"encoder.layer.use_bottleneck_attention": True}, "value_input_size must be null"),
        ({"encoder.layer.key_query_shared_bottleneck": False}, "needs key_query_shared_bottleneck"),
        ({"is_decoder": True}, "encoder layer"),
        ({"head": {"name": "bottleneck_masked_lm", "embedding_size": 8}}, "embedding.embedding_size 16"),
    ],
)
def test_configs_the_bottleneck_cannot_build_are_refused_naming_the_field(changes, message):
    with pytest.raises(bertblocks.BertBlocksError, match=message):
        load_config(_mobile(**changes))


def test_value_input_size_needs_a_layer_that_hands_a_value_input():
    config = {**TINY, "encoder": {**TINY["encoder"], "attention": {"num_heads": 4, "value_input_size": 64}}}
    with pytest.raises(bertblocks.BertBlocksError, match="value_input_size needs a layer"):
        load_config(config)


def test_tiny_preset_masked_lm_ties_the_decoder_to_the_narrow_table():
    model = bertblocks.create_model(_mobile(head={"name": "bottleneck_masked_lm", "embedding_size": 16})).eval()
    predictions = model.cls.predictions
    assert predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight  # [vocab, 16]
    assert tuple(predictions.dense.weight.shape) == (32 - 16, 1024)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[2, 5, 7, 3]])).logits
    assert logits.shape == (1, 4, 1024)


#: the bottleneck layer as MobileBERT publishes it (the conformance suite's defaults use one bottleneck for all three)
PUBLISHED_LAYER = {
    "intra_bottleneck_size": 16,
    "key_query_shared_bottleneck": True,
    "use_bottleneck_attention": False,
    "num_feedforward_networks": 3,
}
SUITE = ConformanceSuite(
    options={("layer", "bottleneck"): PUBLISHED_LAYER},
    configs={("layer", "bottleneck"): {"encoder": {"attention": {"value_input_size": 32}, "norm": "no_norm"}}},
    compile_backend="aot_eager",
)


@pytest.mark.parametrize("case", SUITE.params(kinds=["layer"], names=["bottleneck"], exclude=["compile"]))
def test_published_bottleneck_layer_conforms(case):
    case.run()


def test_trigram_reads_the_padding_tokens_embedding_as_transformers():
    """The last real token's right neighbour is the padding token: a padded batch gives it other numbers than the
    text alone (as transformers'), so the trigram embedding is off in the conformance suite's defaults and checked
    here."""
    config = _mobile()
    model = bertblocks.create_model(config).eval()
    embeddings = model.embeddings
    with torch.no_grad():
        embeddings.word_embeddings.weight[0].normal_()  # a trained [PAD] row is not zero
        alone = embeddings(torch.tensor([[2, 5, 7]]), None, None, None)
        padded = embeddings(torch.tensor([[2, 5, 7, 0]]), None, None, None)
    assert_close(padded[0, :2], alone[0, :2])  # the first tokens do not see the padding
    assert (padded[0, 2] - alone[0, 2]).abs().max() > 1e-3  # the last real one does


#: google/mobilebert-uncased's config.json fields, as PaddleNLP's MobileBERT records them (its
#: MOBILEBERT_PRETRAINED_INIT_CONFIGURATION, with the published transformers_version); no byte-exact copy of the hub
#: file was found for tests/fixtures/published_configs
PUBLISHED = {
    "attention_probs_dropout_prob": 0.1,
    "classifier_activation": False,
    "embedding_size": 128,
    "hidden_act": "relu",
    "hidden_dropout_prob": 0.0,
    "hidden_size": 512,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "intra_bottleneck_size": 128,
    "key_query_shared_bottleneck": True,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "mobilebert",
    "normalization_type": "no_norm",
    "num_attention_heads": 4,
    "num_feedforward_networks": 4,
    "num_hidden_layers": 24,
    "pad_token_id": 0,
    "transformers_version": "4.6.0.dev0",
    "trigram_input": True,
    "true_hidden_size": 128,
    "type_vocab_size": 2,
    "use_bottleneck": True,
    "use_bottleneck_attention": False,
    "vocab_size": 30522,
}


def test_published_fields_translate_to_the_preset():
    from bertblocks.hf.config_json import config_from_hf

    published = load_config(config_from_hf(PUBLISHED))
    preset = load_config("mobilebert-uncased")
    assert published.model_dump(exclude={"hf", "id2label", "label2id"}) == preset.model_dump(
        exclude={"hf", "id2label", "label2id"}
    )
    assert published.pooler is not None
    assert published.pooler.name == "first_token_plain"
