"""ALBERT's layer groups are the encoder's real cross-layer sharing: each group's weights exist once (parameter
counts equal transformers'), several groups load and save, and what the encoder cannot hold is refused."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

import bertblocks
from bertblocks.config import ConfigError
from tests.tolerances import assert_close

SETTINGS = {
    "vocab_size": 99,
    "embedding_size": 16,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "initializer_range": 0.2,
}


def _save(directory, cls="AlbertModel", **extra):
    torch.manual_seed(0)
    model = getattr(transformers, cls)(transformers.AlbertConfig(**SETTINGS, **extra)).eval()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize("groups", [1, 2])
def test_parameter_count_equals_transformers_no_copies(tmp_path, groups):
    reference = _save(tmp_path / "hf", "AlbertForMaskedLM", num_hidden_groups=groups)
    ours = bertblocks.from_pretrained(tmp_path / "hf", head="auto")
    assert ours.config.encoder.num_layer_groups == groups
    assert len(ours.bert.encoder.layer) == groups  # one module per group, used by num_layers // groups layers
    assert ours.num_parameters() == sum(p.numel() for p in reference.parameters())


def test_two_groups_load_compute_and_save_as_transformers(tmp_path):
    reference = _save(tmp_path / "hf", num_hidden_groups=2)
    ours = bertblocks.from_pretrained(tmp_path / "hf").eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 99, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    real = mask.bool()
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close(got[real], want[real])
    ours.save_pretrained(tmp_path / "ours")
    again, info = transformers.AlbertModel.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert again.config.num_hidden_groups == 2
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    with torch.no_grad():
        back = again.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close(back[real], want[real])


def test_several_layers_inside_a_group_are_refused_by_name(tmp_path):
    _save(tmp_path / "hf", inner_group_num=2)
    with pytest.raises(ConfigError, match="inner_group_num must be 1"):
        bertblocks.from_pretrained(tmp_path / "hf")
