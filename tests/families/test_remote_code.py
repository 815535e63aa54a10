"""One remote-code check for every family (``Family.remote_code``): an ``auto_map`` is read only when each entry names a
declared class *in its declared repository*; the same class name in another repository or in the folder's own code
is refused, for every family of the registry."""

from __future__ import annotations

from typing import Any

import pytest

from bertblocks.config import ConfigError
from bertblocks.hf.config_json import config_from_hf
from bertblocks.hf.families import get_family
from bertblocks.registry import Registry

from .test_zoo_fixes import ORIGINAL

#: the published `new` config.json's auto_map entries (Alibaba's repository)
NEW = {"model_type": "new", "rope_theta": 10000.0}
NEW_MAP = {
    "AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
    "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel",
}


def _reading_families() -> list[str]:
    return sorted(c.name for c in Registry().components("family") if get_family(c.name).remote_code)


@pytest.mark.parametrize("model_type", _reading_families())
def test_every_family_reads_its_declared_classes_only_from_its_declared_repository(model_type):
    family = get_family(model_type)
    for code in family.remote_code:
        cls = sorted(code.classes)[0]
        here = f"{code.repository}--{cls}" if code.repository else cls
        local = any(other.repository is None and cls in other.classes for other in family.remote_code)
        elsewhere = [f"someone/elsewhere--{cls}"] + ([cls] if not local else [])
        sample: dict[str, Any] = {"n_embd": 32, "n_layer": 2}  # NomicBERT's original format says so by its fields
        assert family.reads_remote({**sample, "auto_map": {"AutoModel": here}})
        for value in elsewhere:
            assert not family.reads_remote({**sample, "auto_map": {"AutoModel": value}}), value
        assert not family.reads_remote({**sample, "auto_map": {"AutoModel": here, "AutoModelForX": "modeling.Evil"}})


def test_new_reads_its_published_auto_map():
    assert config_from_hf({**NEW, "auto_map": NEW_MAP})["family"] == "new"


@pytest.mark.parametrize(
    "value",
    [
        "modeling.NewModel",  # the folder's own modeling.py: code bertblocks has never seen
        "someone/other-impl--modeling.NewModel",  # the class name in another repository
    ],
)
def test_new_refuses_its_class_name_in_other_code(value):
    with pytest.raises(ConfigError, match=r"auto_map: names remote-code classes"):
        config_from_hf({**NEW, "auto_map": {**NEW_MAP, "AutoModel": value}})


@pytest.mark.parametrize(
    ("model_type", "value"),
    [
        ("eurobert", "someone/elsewhere--modeling_eurobert.EuroBertModel"),
        ("eurobert", "modeling_other.EuroBertAnything"),
        ("neobert", "modeling_evil.Evil"),
        ("neobert", "someone/elsewhere--model.NeoBERT"),
    ],
)
def test_families_reading_folder_code_refuse_other_code(model_type, value):
    with pytest.raises(ConfigError, match=r"auto_map: names remote-code classes"):
        config_from_hf({"model_type": model_type, "auto_map": {"AutoModel": value}})


def test_nomic_original_format_refuses_nomic_classes_from_another_repository():
    original = {**ORIGINAL, "model_type": "nomic_bert"}
    ours = "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"
    assert config_from_hf({**original, "auto_map": {"AutoModel": ours}})["hidden_size"] == 32
    with pytest.raises(ConfigError, match=r"auto_map: names remote-code classes"):
        config_from_hf({**original, "auto_map": {"AutoModel": ours.replace("nomic-ai", "someone")}})
