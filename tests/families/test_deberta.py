"""What only DeBERTa v1 (``deberta``) does. microsoft/deberta-base's settings under the backbone and every task
class, the packed and padded paths, hidden states and attentions, refusals naming the field, the tokenizer convention
and the presets are one row of the shared family tables (``reference.py``); here: the variants of v1's disentangled
attention both ways with transformers' own classes, every weight non-zero (transformers initialises ``q_bias``,
``v_bias`` and every bias to zero, so a bias read from the wrong place would pass a fresh checkpoint), sequences past
the relative span, the unused absolute table of the published checkpoints, the ``legacy: false`` masked LM, pruning,
gradients, every position (padded ones included), and the attention option ``qv_bias`` v1 is built with."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.errors import BertBlocksError, InputError
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.hf.families import add_prefix, get_family, model_to_checkpoint, strip_prefix
from tests.conftest import TINY
from tests.families.reference import FAMILIES, TOL, Family, assert_same, batch, call_inputs, round_trip, save_hf
from tests.tolerances import assert_grads_close

#: the table's row (tests/families/reference.py): microsoft/deberta-base's settings at test size
DEBERTA = FAMILIES["deberta"]
V1 = DEBERTA.settings

#: each variant changes what a wrong reading of it would show in the numbers
VARIANTS = {
    "c2p-only": {"pos_att_type": ["c2p"]},  # pos_proj alone (no bias), denominator √(2d)
    "p2c-only": {"pos_att_type": "p2c"},  # pos_q_proj alone (with a bias), from the string form
    # a span shorter than the 9-token batch: the table's ends are clamped
    "clamped-span": {"max_relative_positions": 3},
    # DebertaConfig's defaults: no relative table, BERT's absolute table, no term
    "config-defaults": {"relative_attention": False, "position_biased_input": True, "pos_att_type": None},
    # no relative table, yet the configured terms widen the denominator to √(3d), as transformers does
    "absolute-scaled": {"relative_attention": False, "position_biased_input": True},
    # relative attention with no term (null, DebertaConfig's default; [] reads the same): the table exists (and is
    # stored), nothing reads it
    "no-terms": {"pos_att_type": None},
    "gelu-pooler": {"pooler_hidden_act": "gelu"},
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cls", ["DebertaModel", "DebertaForSequenceClassification"])
def test_variants_match_transformers_both_ways(tmp_path, variant, cls):
    round_trip(tmp_path, DEBERTA, cls, **VARIANTS[variant])


def test_absolute_positions_and_token_types_are_read(tmp_path):
    """position_biased_input (v1's default) with two token types, the second segment from position 3."""
    family = Family(
        "DebertaConfig", {**V1, "position_biased_input": True, "type_vocab_size": 2}, pad=0, second_segment=3
    )
    round_trip(tmp_path, family, "DebertaForSequenceClassification")


def _randomised(family: Family, cls: str, directory: Path) -> torch.nn.Module:
    """transformers' ``cls`` with every tensor drawn at random (its q_bias, v_bias and biases start at zero), saved
    to ``directory``."""
    reference = save_hf(family, cls, directory)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=g))
    reference.save_pretrained(directory)
    return reference


@pytest.mark.parametrize("cls", DEBERTA.classes)
def test_every_weight_random_still_gives_transformers_numbers_both_ways(tmp_path, cls):
    reference = _randomised(DEBERTA, cls, tmp_path / "hf")
    state = load_file(tmp_path / "hf" / "model.safetensors")
    q_bias = next(v for k, v in state.items() if k.endswith("layer.0.attention.self.q_bias"))
    assert q_bias.abs().min() > 0
    inputs, mask = batch(DEBERTA, cls)
    inputs = call_inputs(cls, inputs)
    ours, info = bertblocks.from_pretrained(tmp_path / "hf", head="auto", output_loading_info=True)
    assert (info.missing_keys, info.unexpected_keys) == ([], [])
    with torch.no_grad():
        expected = reference(**inputs)
        assert_same(expected, ours.eval()(**inputs), mask)
    ours.save_pretrained(tmp_path / "ours")
    assert load_file(tmp_path / "ours" / "model.safetensors").keys() == state.keys()
    again = getattr(transformers, cls).from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert_same(expected, again(**inputs), mask)


@pytest.mark.parametrize("name", ["q_bias", "v_bias"])
def test_each_of_the_query_and_value_biases_changes_the_numbers(tmp_path, name):
    """The bias-sensitivity the random-weight test relies on: zeroing one of them moves the outputs."""
    _randomised(DEBERTA, "DebertaModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    inputs, mask = batch(DEBERTA, "DebertaModel")
    inputs = call_inputs("DebertaModel", inputs)
    with torch.no_grad():
        before = ours(**inputs).last_hidden_state
        getattr(ours.encoder.layer[0].attention.self, name).zero_()
        after = ours(**inputs).last_hidden_state
    assert (before - after)[mask.bool()].abs().max().item() > 100 * TOL


def test_sequences_past_the_relative_span_without_an_absolute_table(tmp_path):
    """150 tokens, max_position_embeddings 64: transformers clamps every distance past the span (att_span = 64);
    without position_biased_input nothing else bounds the length, in transformers or in bertblocks."""
    reference = _randomised(DEBERTA, "DebertaModel", tmp_path / "relative")
    ids = torch.randint(3, 99, (2, 150), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 100:] = 0
    ours = bertblocks.from_pretrained(tmp_path / "relative").eval()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    assert (expected - got).abs().max().item() <= TOL
    save_hf(DEBERTA, "DebertaModel", tmp_path / "absolute", position_biased_input=True)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=64"):
        bertblocks.from_pretrained(tmp_path / "absolute")(input_ids=ids)


#: microsoft/deberta-base's config.json as published, written here from its known values (no verbatim copy was found
#: for tests/fixtures/published_configs/): pos_att_type as the string "c2p|p2c", max_relative_positions -1
DEBERTA_BASE_JSON = {
    "model_type": "deberta",
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "relative_attention": True,
    "pos_att_type": "c2p|p2c",
    "layer_norm_eps": 1e-7,
    "max_relative_positions": -1,
    "position_biased_input": False,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "type_vocab_size": 0,
    "vocab_size": 50265,
}


@pytest.mark.parametrize(("preset", "changes"), [("deberta-base", {}), ("deberta-large", {"hidden_size": 1024})])
def test_the_published_config_builds_what_transformers_builds_and_equals_the_preset(preset, changes):
    large = {"num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096} if changes else {}
    published = {**DEBERTA_BASE_JSON, **changes, **large}
    cfg = bertblocks.load_config(config_from_hf(published))
    assert cfg.model_dump() == bertblocks.load_config(preset).model_dump()
    back = config_to_hf(cfg)
    assert back["pos_att_type"] == ["c2p", "p2c"]  # transformers' own reading of the string
    assert {k: back[k] for k in published if k != "pos_att_type"} == {
        k: v for k, v in published.items() if k != "pos_att_type"
    }
    with torch.device("meta"):
        ours = bertblocks.create_model(cfg)
        theirs = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**published))
    mapped = strip_prefix(model_to_checkpoint(add_prefix(ours.state_dict(), "bert"), cfg), "deberta")
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())


def test_the_unused_absolute_table_of_the_published_checkpoints_is_ignored(tmp_path):
    """microsoft/deberta-base stores deberta.embeddings.position_embeddings.weight although position_biased_input
    is false (transformers ignores it: _keys_to_ignore_on_load_unexpected); bertblocks drops it on load and says so.
    With position_biased_input the same key is the model's own absolute table."""
    reference = save_hf(DEBERTA, "DebertaForMaskedLM", tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    stale = "deberta.embeddings.position_embeddings.weight"
    assert stale not in state
    save_file({**state, stale: torch.randn(64, 32)}, tmp_path / "model.safetensors")
    ours, info = bertblocks.from_pretrained(tmp_path, head="auto", output_loading_info=True)
    assert (info.missing_keys, info.unexpected_keys) == ([], [])
    assert "bert.embeddings.position_embeddings.weight" in info.ignored_keys
    inputs, mask = batch(DEBERTA, "DebertaForMaskedLM")
    with torch.no_grad():
        assert_same(reference(**inputs), ours.eval()(**inputs), mask)


def test_the_non_legacy_masked_lm_layout_loads_into_the_same_head(tmp_path):
    """legacy: false stores the masked LM as lm_predictions.lm_head.*: it loads, gives transformers' numbers and is
    written back under the legacy names, which transformers reads (round_trip compares both)."""
    reference = save_hf(DEBERTA, "DebertaForMaskedLM", tmp_path / "check", legacy=False)
    assert any(k.startswith("lm_predictions.lm_head.") for k in reference.state_dict())
    round_trip(tmp_path / "trip", DEBERTA, "DebertaForMaskedLM", legacy=False)


def test_pruning_is_refused_as_the_layers_own_position_projections_cover_every_head(tmp_path):
    """transformers' DeBERTa cannot prune heads (no prune_heads, no head_mask in 5.x); bertblocks' v1 layers project
    the table with their own pos_proj / pos_q_proj over every head, so a pruned layer refuses to run, saying why."""
    save_hf(DEBERTA, "DebertaModel", tmp_path)
    model = bertblocks.from_pretrained(tmp_path).eval()
    model.prune_heads({0: [1]})
    with pytest.raises(InputError, match="own position projections"):
        model(input_ids=torch.randint(3, 99, (1, 7)))


def test_gradients_match_transformers(tmp_path):
    """Backward through the fused in_proj, q_bias and v_bias, the layer's own position projections and the shared
    table: the gradients of the loss equal transformers' (dropout off), relative to their magnitude."""
    settings = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    family = dataclasses.replace(DEBERTA, settings={**V1, **settings})
    reference = _randomised(family, "DebertaForSequenceClassification", tmp_path).train()
    ours = bertblocks.from_pretrained(tmp_path, head="auto").train()
    inputs, _ = batch(family, "DebertaForSequenceClassification")
    reference(**inputs).loss.backward()
    ours(**inputs).loss.backward()
    theirs, mine = dict(reference.named_parameters()), dict(ours.named_parameters())
    layer, self_ = "deberta.encoder.layer.{}.attention.self.", "bert.encoder.layer.{}.attention.self."
    pairs = {
        "deberta.encoder.rel_embeddings.weight": "bert.encoder.rel_embeddings.weight",
        layer.format(0) + "in_proj.weight": self_.format(0) + "Wqkv.weight",
        layer.format(1) + "q_bias": self_.format(1) + "q_bias",
        layer.format(0) + "v_bias": self_.format(0) + "v_bias",
        layer.format(1) + "pos_proj.weight": self_.format(1) + "disentangled.pos_key_proj.weight",
        layer.format(0) + "pos_q_proj.bias": self_.format(0) + "disentangled.pos_query_proj.bias",
        "deberta.embeddings.word_embeddings.weight": "bert.embeddings.word_embeddings.weight",
        "pooler.dense.weight": "bert.pooler.dense.weight",
    }
    for hf_name, name in pairs.items():
        a, b = theirs[hf_name].grad, mine[name].grad
        assert a is not None, hf_name
        assert b is not None, name
        assert a.abs().max().item() > 0, hf_name  # the parameter is on the loss's path
        assert_grads_close(b, a, what=name)


def test_attentions_and_hidden_states_match_at_every_position(tmp_path):
    """transformers masks padding on both sides: padded queries attend uniformly and padded embeddings are zero.
    On the padded path (packing off) every position matches, padded ones included, and so do the probabilities."""
    reference = _randomised(DEBERTA, "DebertaModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path, ["encoder.packing=never"], attn_implementation="eager").eval()
    inputs, mask = batch(DEBERTA, "DebertaModel")
    inputs = call_inputs("DebertaModel", inputs)
    assert (mask == 0).any()
    with torch.no_grad():
        theirs = reference(**inputs, output_attentions=True, output_hidden_states=True)
        mine = ours(**inputs, output_attentions=True, output_hidden_states=True)
    pairs = [*zip(theirs.attentions, mine.attentions, strict=True)]
    pairs += [*zip(theirs.hidden_states, mine.hidden_states, strict=True)]
    for a, b in pairs:
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= TOL


# ------------------------------------------------------------------------------ the attention option qv_bias
def test_qv_bias_with_the_projections_own_biases_is_refused_naming_both():
    config = copy.deepcopy(TINY)
    config["encoder"]["attention"].update(qv_bias=True)
    with pytest.raises(BertBlocksError, match=r"encoder.attention.qv_bias .*set qkv_bias: false"):
        bertblocks.create_model(config)


@pytest.mark.parametrize("fused", [False, True])
def test_pruning_keeps_the_query_and_value_biases_of_the_kept_heads(fused):
    config = copy.deepcopy(TINY)
    config["encoder"]["attention"].update(
        qkv_bias=False, qv_bias=True, fused_qkv=fused, qkv_layout="heads" if fused else "blocks"
    )
    model = bertblocks.create_model(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.attention.self.q_bias.copy_(torch.randn(32, generator=g))
            layer.attention.self.v_bias.copy_(torch.randn(32, generator=g))
    ids = torch.randint(3, 99, (1, 7))
    head_mask = torch.ones(2, 4)
    head_mask[0, 1:3] = 0
    with torch.no_grad():
        masked = model(input_ids=ids, head_mask=head_mask).last_hidden_state
        model.prune_heads({0: [1, 2]})
        pruned = model(input_ids=ids).last_hidden_state
    projections = model.encoder.layer[0].attention.self
    assert projections.q_bias.shape == projections.v_bias.shape == (2 * 8,)
    assert (masked - pruned).abs().max().item() <= TOL


@pytest.mark.parametrize("fused", [False, True])
def test_qv_bias_adds_to_the_query_and_value_only_also_unfused(fused):
    """The option is the attention's, not the family's: with three projections it is the same computation as the
    projections' own query and value biases and a zero key bias."""
    config = copy.deepcopy(TINY)
    config["encoder"]["attention"].update(qkv_bias=False, qv_bias=True, fused_qkv=fused)
    model = bertblocks.create_model(config).eval()
    plain = copy.deepcopy(TINY)
    plain["encoder"]["attention"].update(fused_qkv=fused)
    reference = bertblocks.create_model(plain).eval()
    state = model.state_dict()
    g = torch.Generator().manual_seed(0)
    ours = reference.state_dict()
    for key, value in state.items():
        if key.endswith(("q_bias", "v_bias")):
            continue
        ours[key] = value
    for i in range(2):
        projections = model.encoder.layer[i].attention.self
        with torch.no_grad():
            projections.q_bias.copy_(torch.randn(32, generator=g))
            projections.v_bias.copy_(torch.randn(32, generator=g))
        prefix = f"encoder.layer.{i}.attention.self."
        if fused:
            ours[prefix + "Wqkv.bias"] = torch.cat([projections.q_bias, torch.zeros(32), projections.v_bias]).detach()
        else:
            ours[prefix + "query.bias"] = projections.q_bias.detach().clone()
            ours[prefix + "key.bias"] = torch.zeros(32)
            ours[prefix + "value.bias"] = projections.v_bias.detach().clone()
    reference.load_state_dict(ours)
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():
        assert (model(input_ids=ids).last_hidden_state - reference(input_ids=ids).last_hidden_state).abs().max() <= TOL


def test_the_flop_count_runs_through_the_layers_own_position_projections():
    """The ablation's counted FLOPs (FlopCounterMode) hook module inputs: v1 passes (a slice of) the shared table to
    each layer's pos_proj. The count works, and the parameters are trainable again afterwards."""
    from bertblocks.ablation.flops import counted_flops

    model = bertblocks.create_model("tiny-deberta", head="masked_lm")
    assert counted_flops(model, 2, 16, 1024) > 0
    assert all(p.requires_grad for p in model.parameters())
    assert model.training


def test_the_family_is_registered_with_its_classes():
    family = get_family("deberta")
    assert family.architecture_for("sequence_classification") == "DebertaForSequenceClassification"
    assert family.architecture_for(None) == "DebertaModel"
    assert family.architecture_for("multiple_choice") == "DebertaModel"  # transformers has no DebertaForMultipleChoice
