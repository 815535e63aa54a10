"""One remote-code check for every family (``Family.remote_code``): an ``auto_map`` is read only when each entry names a
declared class *in its declared repository*; the same class name in another repository or in the folder's own code
is refused, for every family of the registry."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import transformers

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import RemoteClassesIgnoredWarning, config_from_hf
from bertblocks.hf.families import get_family
from bertblocks.registry import Registry
from tests.tolerances import assert_close

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


# ---------------------------------------------- remote classes over a native family's fields (bge-reranker-v2-m3)
#: what bge-reranker-v2-m3's config.json names: XLM-R's math computed by a flash-attention implementation
FLASH_MAP = {
    "AutoConfig": "jinaai/xlm-roberta-flash-implementation--configuration_xlm_roberta.XLMRobertaFlashConfig",
    "AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_xlm_roberta.XLMRobertaModel",
    "AutoModelForSequenceClassification": (
        "jinaai/xlm-roberta-flash-implementation--modeling_xlm_roberta.XLMRobertaForSequenceClassification"
    ),
}


@pytest.fixture
def reranker(tmp_path):
    """A tiny cross-encoder saved by transformers' own XLMRobertaForSequenceClassification, its config.json given
    the reranker's ``auto_map`` and the bookkeeping transformers writes (dtype, token ids, ``output_past``)."""
    torch.manual_seed(0)
    config = transformers.XLMRobertaConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, type_vocab_size=1, num_labels=1, layer_norm_eps=1e-5,
    )  # fmt: skip
    theirs = transformers.XLMRobertaForSequenceClassification(config).eval()
    theirs.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    published = json.loads(path.read_text())
    published.update(auto_map=FLASH_MAP, output_past=True, torch_dtype="float32", bos_token_id=0, eos_token_id=2)
    path.write_text(json.dumps(published))
    return tmp_path, theirs


def test_remote_classes_over_fields_the_family_reads_load_with_a_one_line_warning(reranker):
    folder, theirs = reranker
    with pytest.warns(RemoteClassesIgnoredWarning) as caught:
        model = bertblocks.from_pretrained(folder, head="auto").eval()
    # the same line each time the load reads config.json: Python shows it once
    (message,) = {str(w.message) for w in caught if w.category is RemoteClassesIgnoredWarning}
    assert "\n" not in message
    assert "modeling_xlm_roberta.XLMRobertaForSequenceClassification" in message
    assert model.config.family == "xlm-roberta"
    ids = torch.randint(3, 99, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        actual = model(input_ids=ids, attention_mask=mask).logits
    assert_close(actual, expected)


def test_remote_classes_over_a_field_the_family_does_not_read_are_refused_naming_it(reranker):
    folder, _ = reranker
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rotary_emb_base": 10000.0, "lora_rank": 4}))
    with pytest.raises(ConfigError, match=r"fields the family does not read \(lora_rank, rotary_emb_base\)") as e:
        bertblocks.from_pretrained(folder, head="auto")
    assert "names remote-code classes (jinaai/xlm-roberta-flash-implementation--" in str(e.value)


def test_a_remote_format_family_still_refuses_other_code_whatever_its_fields():
    """A family whose format is remote code reads only its declared classes: other code makes other sense of the
    same fields (the class names are the point, not the fields)."""
    with pytest.raises(ConfigError, match=r"the new format is that of its own remote code"):
        config_from_hf({**NEW, "auto_map": {**NEW_MAP, "AutoModel": "modeling.NewModel"}})
