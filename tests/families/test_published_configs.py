"""Published ``config.json`` files, verbatim (tests/fixtures/published_configs/, sources in its SOURCES.md): each is
translated or refused as the table below says; a translated one builds, on the meta device, the checkpoint
transformers builds from the same file (key names, shapes, parameter count), or for a remote-code format the
published weight names and the parameter count its model card states; and the zoo's preset of that checkpoint has
the published dimensions.

The family tests build their configs from recalled fields; these files are what the hub actually serves, so a
field the families never saw, or a preset that drifted from the real checkpoint, fails here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from transformers.core_model_loading import revert_weight_conversion

import bertblocks
from bertblocks.errors import BertBlocksError
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.hf.families import add_prefix, get_family, model_to_checkpoint, strip_prefix
from tests.families.test_jina_v2 import _published_weights as jina_v2_published_weights

FIXTURES = Path(__file__).parent.parent / "fixtures" / "published_configs"


@dataclass(frozen=True)
class Translated:
    """A file bertblocks reads: the family it must land in, the zoo's preset of the same checkpoint (if any), and
    for a remote-code format the parameter count its model card states (millions, as the card rounds it)."""

    family: str
    preset: str | None = None
    card_params_m: int | None = None


#: every fixture that is translated (file → what it must become)
TRANSLATED: dict[str, Translated] = {
    "facebook__esm2_t33_650M_UR50D.json": Translated("esm", preset="esm2-t33-650m"),
    "google-bert__bert-base-chinese.json": Translated("bert"),
    # remote code (model_type bert + auto_map to jinaai/jina-bert-implementation); the card: "137 million parameters"
    "jinaai__jina-embeddings-v2-base-en.json": Translated(
        "jina_bert", preset="jina-embeddings-v2-base-en", card_params_m=137
    ),
    "sentence-transformers__all-MiniLM-L6-v2.json": Translated("bert", preset="all-minilm-l6-v2"),
    # the backbone (no architectures); its extra embedding_size / embedding_dropout_prob are kept, unused, as
    # transformers keeps them
    "google__rembert.json": Translated("rembert", preset="rembert"),
}
#: every fixture that is refused (file → the field the error must name, and why). None of the files found so far
#: is refused; a file added here must raise a BertBlocksError naming that field.
REFUSED: dict[str, tuple[str, str]] = {}

#: the published checkpoints whose format transformers has no class for (compared with their published names)
REMOTE_FAMILIES = {"jina_bert"}
#: the config.json fields that fix a checkpoint's shapes (a preset must agree with the published file on each)
DIMENSIONS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "pad_token_id",
)


def _published(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def _config(name: str) -> bertblocks.BertConfig:
    return bertblocks.load_config(config_from_hf(_published(name)))


def test_the_table_names_every_fixture_once():
    files = {p.name for p in FIXTURES.glob("*.json")}
    assert files == set(TRANSLATED) | set(REFUSED)
    assert not set(TRANSLATED) & set(REFUSED)
    sources = (FIXTURES / "SOURCES.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in sources for name in files)  # each file says where its text came from


@pytest.mark.parametrize("name", sorted(TRANSLATED))
def test_published_config_is_translated_into_its_family(name):
    cfg = _config(name)
    assert cfg.family == TRANSLATED[name].family
    # what the file says of the shapes survives the translation (written back as the same fields)
    published, back = _published(name), config_to_hf(cfg)
    stated = [k for k in DIMENSIONS if k in published]
    assert {k: back.get(k) for k in stated} == {k: published[k] for k in stated}


def test_refused_published_configs_name_the_field():
    for name, (field, _why) in REFUSED.items():
        with pytest.raises(BertBlocksError, match=field):
            _config(name)


def _checkpoint_shapes(cfg: bertblocks.BertConfig) -> tuple[dict[str, tuple[int, ...]], int]:
    """The key names and shapes bertblocks would save for ``cfg``'s backbone, and its parameter count (meta)."""
    with torch.device("meta"):
        ours = bertblocks.create_model(cfg)
    prefix = get_family(cfg.family).key_map.prefix
    mapped = strip_prefix(model_to_checkpoint(add_prefix(ours.state_dict(), "bert"), cfg), prefix)
    return {k: tuple(v.shape) for k, v in mapped.items()}, ours.num_parameters()


NATIVE = sorted(n for n, t in TRANSLATED.items() if t.family not in REMOTE_FAMILIES)
REMOTE = sorted(n for n, t in TRANSLATED.items() if t.family in REMOTE_FAMILIES)


@pytest.mark.parametrize("name", NATIVE)
def test_published_config_builds_what_transformers_builds(name):
    published = _published(name)
    backbone = _config(name).model_copy(update={"head": None})
    mine, count = _checkpoint_shapes(backbone)
    # a task checkpoint's backbone has no pooler where its task class builds none (ESM's EsmForMaskedLM):
    # transformers' base class is asked for the same backbone
    kwargs = {} if backbone.pooler is not None else {"add_pooling_layer": False}
    with torch.device("meta"):
        theirs = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**published), **kwargs)
    expected = {k: tuple(v.shape) for k, v in revert_weight_conversion(theirs, theirs.state_dict()).items()}
    assert mine == expected
    assert count == sum(p.numel() for p in theirs.parameters())


#: files whose architectures name a task class (a file without architectures, google/rembert's, is a backbone)
WITH_TASK_CLASS = [n for n in NATIVE if (_published(n).get("architectures") or ["BertModel"])[0] != "BertModel"]


@pytest.mark.parametrize("name", WITH_TASK_CLASS)
def test_published_task_model_has_the_task_class_parameter_count(name):
    """The head the file's ``architectures`` names: bertblocks' task model holds as many parameters as that
    transformers class (ESM's EsmForMaskedLM: no pooler, its own LM head; BERT's: the tied decoder counted once)."""
    published = _published(name)
    cfg = _config(name)
    assert cfg.head is not None
    with torch.device("meta"):
        ours = bertblocks.create_model(cfg)
        theirs = getattr(transformers, published["architectures"][0])(transformers.AutoConfig.for_model(**published))
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize("name", REMOTE)
def test_remote_published_config_builds_the_published_weight_names(name):
    published = _published(name)
    backbone = _config(name).model_copy(update={"head": None})
    mine, count = _checkpoint_shapes(backbone)
    with torch.device("meta"):  # the published checkpoints' key names, as the family's tests list them
        expected = {k: tuple(v.shape) for k, v in jina_v2_published_weights(published).items()}
    assert mine == expected
    assert round(count / 1e6) == TRANSLATED[name].card_params_m


WITH_PRESET = sorted(n for n, t in TRANSLATED.items() if t.preset is not None)


@pytest.mark.parametrize("name", WITH_PRESET)
def test_preset_has_the_published_dimensions(name):
    published = _published(name)
    preset = config_to_hf(bertblocks.load_config(TRANSLATED[name].preset))
    assert preset["model_type"] == published["model_type"]
    assert {k: preset.get(k) for k in DIMENSIONS if k in published} == {
        k: published[k] for k in DIMENSIONS if k in published
    }
    # and the preset builds the same tensors as the published file's backbone (pooler aside: a preset keeps the
    # base class's pooler, a task checkpoint may not)
    ours, _ = _checkpoint_shapes(bertblocks.load_config(TRANSLATED[name].preset).model_copy(update={"head": None}))
    theirs, _ = _checkpoint_shapes(_config(name).model_copy(update={"head": None}))
    assert {k: v for k, v in ours.items() if "pooler" not in k} == {
        k: v for k, v in theirs.items() if "pooler" not in k
    }


def test_fixtures_are_the_bytes_sources_md_records():
    """A fixture is never edited: its SHA-256 is the one SOURCES.md recorded when it was checked."""
    rows = {
        cells[1].strip("` "): cells[3].strip()
        for line in (FIXTURES / "SOURCES.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `") and len(cells := line.split("|")) > 4
    }
    for path in FIXTURES.glob("*.json"):
        assert hashlib.sha256(path.read_bytes()).hexdigest()[:16] == rows[path.name], path.name
