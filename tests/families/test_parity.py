"""Every family and every head transformers has for it, as one table (``tests/families/reference.py``): a tiny
random checkpoint saved by transformers' own class loads with ``from_pretrained(dir, head="auto")`` and gives the
same numbers on a padded batch (real tokens), losses included; saved by bertblocks, the same transformers class
loads it with no missing or unexpected keys, reads the family's config back and gives the same numbers again.

Then the behaviours several families share, each a table of the families it concerns: padded and packed paths
under right and left padding (rotary families), hidden states and attention probabilities, checkpoints under
transformers' in-memory names, config.json the family cannot represent, the tokenizer convention and the presets.
Each of them reads the rows that join it from the table (:class:`tests.families.reference.Family`'s attributes):
a new family is one row of ``reference.py`` and lists nothing here. What only one family does is tested in its
own file (``test_nomic_bert.py``, ``test_jina_v3.py``, ``test_modernbert.py``, ``test_deberta_v2.py``,
``test_gte.py``, ``test_roformer.py``, ``test_esm.py``, ``test_eurobert.py``)."""

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
from tests.conftest import to_device

from .reference import (
    CASES,
    FAMILIES,
    TOL,
    assert_same,
    batch,
    call_inputs,
    round_trip,
    rows,
    save_tokenizer,
    saved_hf,
    tokenizer_of,
)
from .test_tokenizers import PAIRS, TEXTS


def test_every_row_of_the_table_joins_the_round_trips():
    """CASES is computed when reference.py is imported: a row added below it would silently run no round trip."""
    assert [(name, cls) for name, family in FAMILIES.items() for cls in family.classes] == CASES


@pytest.mark.parametrize(("family_name", "cls"), CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_loads_transformers_checkpoint_and_saves_one_it_loads(tmp_path, family_name, cls, device):
    round_trip(tmp_path, FAMILIES[family_name], cls, device=device)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("packing", ["never", "always"])
@pytest.mark.parametrize("family_name", rows(lambda family: family.both_paddings))
def test_padded_and_packed_paths_agree_with_transformers(family_name, packing, side, device):
    """transformers counts positions 0, 1, … over left padding too; packed, bertblocks restarts them at each
    sequence's first real token: RoPE scores (and DeBERTa's relative table, read at query - key) depend on
    position differences only, so the numbers agree. DeBERTa's packed layers run their attention kernel on the
    re-padded heads (a score bias: see docs/explanation/packing.md), everything else on the real tokens."""
    family = FAMILIES[family_name]
    cls = family.classes[0]  # the backbone
    directory, reference = saved_hf(family, cls)
    reference = reference.to(device)
    inputs, mask = batch(family, cls, left=side == "left")
    inputs = to_device(call_inputs(cls, inputs), device)
    ours = bertblocks.from_pretrained(directory, [f"encoder.packing={packing}"]).to(device).eval()
    with torch.no_grad():
        assert_same(reference(**inputs), ours(**inputs), mask)


@pytest.mark.parametrize("family_name", rows(lambda family: family.hidden_states))
def test_hidden_states_and_attention_probabilities_equal_transformers(family_name, device):
    """Attention probabilities under the eager backend, unless the row says otherwise (ModernBERT's local layers
    need their sliding-window backend: the default backends, hidden states only)."""
    family = FAMILIES[family_name]
    cls, attentions = family.hidden_states, family.attentions
    assert cls is not None
    directory, _ = saved_hf(family, cls)
    implementation = {"attn_implementation": "eager"} if attentions else {}
    reference = getattr(transformers, cls).from_pretrained(directory, **implementation).to(device).eval()
    inputs, mask = batch(family, cls)
    inputs = to_device(call_inputs(cls, inputs), device)
    mask = mask.to(device)
    overrides = ["encoder.attention.backend=eager"] if attentions else []
    ours = bertblocks.from_pretrained(directory, overrides, head="auto").to(device).eval()
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


@pytest.mark.parametrize("family_name", rows(lambda family: family.in_memory_key))
def test_checkpoint_under_transformers_in_memory_names_loads(tmp_path, family_name):
    from safetensors.torch import load_file

    family = FAMILIES[family_name]
    assert family.in_memory_key is not None
    cls, in_memory_key = family.in_memory_key
    _, reference = saved_hf(family, cls)
    reference.save_pretrained(tmp_path, save_original_format=False)  # q_proj/k_proj/v_proj, … as in memory
    assert in_memory_key in load_file(tmp_path / "model.safetensors")
    inputs, mask = batch(family, cls)
    ours, info = bertblocks.from_pretrained(tmp_path, head="auto", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    with torch.no_grad():
        assert_same(reference(**inputs), ours.eval()(**inputs), mask)


#: every refusal of every row: (family, change to config.json, the error's pattern)
REFUSALS = [(name, change, message) for name in FAMILIES for change, message in FAMILIES[name].refusals]


@pytest.mark.parametrize(("family_name", "change", "message"), REFUSALS, ids=[f"{n}-{m}" for n, _, m in REFUSALS])
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


@pytest.mark.parametrize("family_name", rows(lambda family: family.tokenizer_convention))
def test_tokenizer_follows_the_family_convention_as_transformers(tmp_path, family_name):
    tokenizing = tokenizer_of(family_name)
    tok: Tokenizer = tokenizing.train()  # no post-processor: the family's template frames the texts
    directory = save_tokenizer(tmp_path, tokenizing, tok)
    (directory / "config.json").write_text(json.dumps({"model_type": FAMILIES[family_name].model_type}))
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    texts = list(tokenizing.texts or TEXTS)
    pairs = texts[::-1] if tokenizing.texts else PAIRS
    for args in ((texts,), (texts, pairs)):
        expected = theirs(*args, padding=True, return_tensors="pt")
        got = ours(*args)
        assert sorted(got) == sorted(expected.keys())  # token types only where the family's tokenizer gives them
        for key in got:
            assert got[key].tolist() == expected[key].tolist(), key
    assert ours.pad_token_id == theirs.pad_token_id


#: every preset of every row: (preset, family)
PRESETS = [(preset, name) for name in FAMILIES for preset in FAMILIES[name].presets]


@pytest.mark.parametrize(("preset", "family_name"), PRESETS, ids=[p for p, _ in PRESETS])
def test_family_preset_exists(preset, family_name):
    # tests/families/test_presets.py builds every family preset against transformers' own model
    assert preset in bertblocks.list_presets()
    assert bertblocks.load_config(preset).family == FAMILIES[family_name].model_type
