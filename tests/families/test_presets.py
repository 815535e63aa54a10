"""The zoo's presets of other families: each builds the architecture transformers builds from the same
config.json (state-dict keys through the family's key map, shapes, parameter counts; on the meta device, so
even the large ones are cheap), and the CLI lists them by pattern."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.core_model_loading import revert_weight_conversion

import bertblocks
from bertblocks import cli
from bertblocks.hf.config_json import config_to_hf
from bertblocks.hf.families import add_prefix, get_family, model_to_checkpoint, strip_prefix

#: presets of the families transformers has classes for (NeoBERT: tests/families/test_neobert.py)
FAMILY_PRESETS = [
    name for name in bertblocks.list_presets() if bertblocks.load_config(name).family not in ("bert", "neobert")
]


def test_every_family_has_presets_base_and_large_where_they_exist():
    expected = {
        "roberta-base",
        "roberta-large",
        "xlm-roberta-base",
        "xlm-roberta-large",
        "camembert-base",
        "distilbert-base-uncased",
        "electra-small-discriminator",
        "electra-base-discriminator",
        "electra-large-discriminator",
        "electra-small-generator",
        "ernie-3.0-base-zh",
        "albert-base-v2",
        "albert-large-v2",
        "mpnet-base",
    }
    assert expected <= set(FAMILY_PRESETS)


#: presets of a remote-code format transformers has no class for (Jina-embeddings-v2): their keys and shapes are
#: checked against the published names in their family's tests
NATIVE_PRESETS = [n for n in FAMILY_PRESETS if config_to_hf(c := bertblocks.load_config(n))["model_type"] == c.family]


@pytest.mark.parametrize("name", NATIVE_PRESETS)
def test_family_preset_builds_what_transformers_builds(name):
    cfg = bertblocks.load_config(name)
    backbone_cfg = cfg.model_copy(update={"head": None})
    hf = config_to_hf(backbone_cfg)
    prefix = get_family(cfg.family).key_map.prefix
    with torch.device("meta"):
        ours = bertblocks.create_model(backbone_cfg)
        theirs = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**hf))
    mapped = strip_prefix(model_to_checkpoint(add_prefix(ours.state_dict(), "bert"), backbone_cfg), prefix)
    mine = {k: tuple(v.shape) for k, v in mapped.items()}
    # the keys transformers writes: its save_pretrained reverts a family's conversion mapping (NomicBERT's Wqkv, …)
    expected = {k: tuple(v.shape) for k, v in revert_weight_conversion(theirs, theirs.state_dict()).items()}
    assert mine == expected
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())  # ALBERT's shared layer counts once
    if cfg.head is not None:  # a preset with its head (ELECTRA's generators): the whole task model
        full_hf = config_to_hf(cfg)
        with torch.device("meta"):
            task = bertblocks.create_model(cfg)
            reference = getattr(transformers, full_hf["architectures"][0])(transformers.AutoConfig.for_model(**full_hf))
        assert task.num_parameters() == sum(p.numel() for p in reference.parameters())


def test_cli_lists_presets_by_pattern(capsys):
    assert cli.main(["presets", "roberta-*"]) == 0
    out = capsys.readouterr().out
    assert "roberta-base" in out
    assert "roberta-large" in out
    assert "xlm-roberta-base" not in out  # the pattern is anchored
    assert "bert-base-uncased" not in out
