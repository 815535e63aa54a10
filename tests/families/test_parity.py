"""Every family and every head transformers has for it, as one table (``tests/families/reference.py``): a tiny
random checkpoint saved by transformers' own class loads with ``from_pretrained(dir, head="auto")`` and gives the
same numbers on a padded batch (real tokens), losses included; saved by bertblocks, the same transformers class
loads it with no missing or unexpected keys, reads the family's config back and gives the same numbers again.

Then the behaviours several families share, each a table of the families it concerns: padded and packed paths
under right and left padding (rotary families), hidden states and attention probabilities, checkpoints under
transformers' in-memory names, config.json the family cannot represent, the tokenizer convention and the presets.
What only one family does is tested in its own file (``test_nomic_bert.py``, ``test_jina_v3.py``,
``test_modernbert.py``, ``test_deberta_v2.py``)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from tokenizers import Tokenizer

import bertblocks
from bertblocks import BertTokenizer
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import config_from_hf

from .reference import CASES, FAMILIES, TOL, assert_same, batch, call_inputs, round_trip, save_hf
from .test_family_paths import deberta_unigram
from .test_tokenizers import PAIRS, TEXTS, save, unigram, wordpiece


@pytest.mark.parametrize(("family_name", "cls"), CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_loads_transformers_checkpoint_and_saves_one_it_loads(tmp_path, family_name, cls):
    round_trip(tmp_path, FAMILIES[family_name], cls)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("packing", ["never", "always"])
@pytest.mark.parametrize("family_name", ["nomic_bert", "jina_embeddings_v3", "modernbert", "deberta-v2"])
def test_padded_and_packed_paths_agree_with_transformers(tmp_path, family_name, packing, side):
    """transformers counts positions 0, 1, … over left padding too; packed, bertblocks restarts them at each
    sequence's first real token: RoPE scores (and DeBERTa's relative table, read at query - key) depend on
    position differences only, so the numbers agree. DeBERTa's packed layers run their attention kernel on the
    re-padded heads (a score bias: see docs/explanation/packing.md), everything else on the real tokens."""
    family = FAMILIES[family_name]
    cls = family.classes[0]  # the backbone
    reference = save_hf(family, cls, tmp_path)
    inputs, mask = batch(family, cls, left=side == "left")
    inputs = call_inputs(cls, inputs)
    ours = bertblocks.from_pretrained(tmp_path, [f"encoder.packing={packing}"]).eval()
    with torch.no_grad():
        assert_same(reference(**inputs), ours(**inputs), mask)


@pytest.mark.parametrize(
    ("family_name", "cls", "attentions"),
    [
        ("nomic_bert", "NomicBertForSequenceClassification", True),
        ("jina_embeddings_v3", "JinaEmbeddingsV3ForMaskedLM", True),
        # ModernBERT's local layers need their sliding-window backend: the default backends, hidden states only
        ("modernbert", "ModernBertModel", False),
        ("deberta-v2", "DebertaV2ForSequenceClassification", True),
    ],
)
def test_hidden_states_and_attention_probabilities_equal_transformers(tmp_path, family_name, cls, attentions):
    family = FAMILIES[family_name]
    save_hf(family, cls, tmp_path)
    implementation = {"attn_implementation": "eager"} if attentions else {}
    reference = getattr(transformers, cls).from_pretrained(tmp_path, **implementation).eval()
    inputs, mask = batch(family, cls)
    inputs = call_inputs(cls, inputs)
    overrides = ["encoder.attention.backend=eager"] if attentions else []
    ours = bertblocks.from_pretrained(tmp_path, overrides, head="auto").eval()
    with torch.no_grad():
        theirs = reference(**inputs, output_hidden_states=True, output_attentions=attentions)
        got = ours(**inputs, output_hidden_states=True, output_attentions=attentions)
    layers = family.settings["num_hidden_layers"]
    assert len(got.hidden_states) == len(theirs.hidden_states) == layers + 1
    for a, b in zip(theirs.hidden_states, got.hidden_states, strict=True):
        assert (a - b)[mask.bool()].abs().max() <= TOL
    if attentions:
        assert len(got.attentions) == len(theirs.attentions) == layers
        for a, b in zip(theirs.attentions, got.attentions, strict=True):  # [b, h, q, k]; rows of real queries
            assert (a - b).transpose(1, 2)[mask.bool()].abs().max() <= TOL


@pytest.mark.parametrize(
    ("family_name", "cls", "in_memory_key"),
    [
        ("nomic_bert", "NomicBertForMaskedLM", "nomic_bert.layers.0.self_attn.q_proj.weight"),
        ("jina_embeddings_v3", "JinaEmbeddingsV3ForSequenceClassification", "roberta.layers.0.self_attn.q_proj.bias"),
    ],
)
def test_checkpoint_under_transformers_in_memory_names_loads(tmp_path, family_name, cls, in_memory_key):
    from safetensors.torch import load_file

    family = FAMILIES[family_name]
    reference = save_hf(family, cls, tmp_path / "original")
    reference.save_pretrained(tmp_path, save_original_format=False)  # q_proj/k_proj/v_proj, … as in memory
    assert in_memory_key in load_file(tmp_path / "model.safetensors")
    inputs, mask = batch(family, cls)
    ours, info = bertblocks.from_pretrained(tmp_path, head="auto", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    with torch.no_grad():
        assert_same(reference(**inputs), ours.eval()(**inputs), mask)


@pytest.mark.parametrize(
    ("family_name", "change", "message"),
    [
        (
            "jina_embeddings_v3",
            {"rope_parameters": {"rope_theta": 10.0, "rope_type": "dynamic", "factor": 2.0}},
            "rope_type is 'dynamic'",
        ),
        (
            "jina_embeddings_v3",
            {"bertblocks": {"embedding": {"position_offset": "padding"}}},
            "embedding.position_offset",
        ),
        (
            "jina_embeddings_v3",
            {"bertblocks": {"encoder": {"feedforward": {"name": "glu"}}}},
            "encoder.feedforward.name",
        ),
        (
            "nomic_bert",
            {"rope_parameters": {"rope_theta": 10.0, "rope_type": "linear", "factor": 2.0}},
            "rope_type is 'linear'",
        ),
        ("nomic_bert", {"head_dim": 16}, "head_dim 16"),
        ("nomic_bert", {"bertblocks": {"encoder": {"attention": {"fused_qkv": False}}}}, "encoder.attention.fused_qkv"),
        ("nomic_bert", {"bertblocks": {"position": {"name": "absolute"}}}, "position.name"),
        (
            "modernbert",
            {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}},
            "rope_type 'linear'",
        ),
        ("modernbert", {"layer_types": ["full_attention"]}, "layer_types must list"),
        ("modernbert", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling is not supported"),
        ("modernbert", {"bertblocks": {"encoder": {"layer": {"name": "post_ln"}}}}, "encoder.layer.name"),
        ("deberta-v2", {"conv_kernel_size": 4}, "conv_kernel_size=4"),
        ("deberta-v2", {"embedding_size": 16}, "embedding_size=16"),
        ("deberta-v2", {"attention_head_size": 4}, "attention_head_size=4"),
        ("deberta-v2", {"norm_rel_ebd": "batch_norm"}, "norm_rel_ebd='batch_norm'"),
        ("deberta-v2", {"relative_attention": False}, "norm_rel_ebd='layer_norm'.*without relative_attention"),
        ("deberta-v2", {"pos_att_type": ["p2p"]}, "pos_att_type=.*'p2p'"),
        ("deberta-v2", {"pooler_hidden_size": 16}, "pooler_hidden_size=16"),
        ("deberta-v2", {"pooler_dropout": 0.1}, "pooler_dropout=0.1"),
        ("deberta-v2", {"bertblocks": {"position": {"name": "absolute"}}}, "position.name"),
    ],
)
@pytest.mark.parametrize("form", ["written by transformers", "sparse"])
def test_config_json_the_family_cannot_represent_is_an_error_naming_the_field(family_name, change, message, form):
    """Both as transformers writes config.json (every field; ModernBERT's layer_types and per-kind rope) and as
    a sparse one gives only the settings (ModernBERT's older global/local fields)."""
    family = FAMILIES[family_name]
    base = (
        family.hf_config()
        if form == "written by transformers"
        else {"model_type": family.model_type, **family.settings}
    )
    with pytest.raises(ConfigError, match=message):
        bertblocks.load_config(config_from_hf({**base, **change}))


@pytest.mark.parametrize(
    ("family_name", "train", "tokenizer_class"),
    [
        ("nomic_bert", wordpiece, "BertTokenizer"),
        ("jina_embeddings_v3", unigram, "XLMRobertaTokenizer"),
        ("deberta-v2", deberta_unigram, "DebertaV2Tokenizer"),
    ],
)
def test_tokenizer_follows_the_family_convention_as_transformers(tmp_path, family_name, train, tokenizer_class):
    tok: Tokenizer = train()  # no post-processor: the family's template frames the texts
    directory = save(tmp_path, tok, tokenizer_class)
    (directory / "config.json").write_text(json.dumps({"model_type": FAMILIES[family_name].model_type}))
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    for args in ((TEXTS,), (TEXTS, PAIRS)):
        expected = theirs(*args, padding=True, return_tensors="pt")
        got = ours(*args)
        assert sorted(got) == sorted(expected.keys())  # token types only where the family's tokenizer gives them
        for key in got:
            assert got[key].tolist() == expected[key].tolist(), key
    assert ours.pad_token_id == theirs.pad_token_id


@pytest.mark.parametrize(
    ("preset", "family_name"),
    [
        ("nomic-bert-2048", "nomic_bert"),
        ("nomic-embed-text-v1.5", "nomic_bert"),
        ("jina-embeddings-v3", "jina_embeddings_v3"),
        ("modernbert-base", "modernbert"),
        ("modernbert-large", "modernbert"),
        ("deberta-v3-xsmall", "deberta-v2"),
        ("deberta-v3-small", "deberta-v2"),
        ("deberta-v3-base", "deberta-v2"),
        ("deberta-v3-large", "deberta-v2"),
        ("mdeberta-v3-base", "deberta-v2"),
    ],
)
def test_family_preset_exists(preset, family_name):
    # tests/families/test_presets.py builds every family preset against transformers' own model
    assert preset in bertblocks.list_presets()
    assert bertblocks.load_config(preset).family == FAMILIES[family_name].model_type
