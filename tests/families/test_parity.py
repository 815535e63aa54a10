"""Every family and every head transformers has for it: a tiny random checkpoint saved by transformers' own
class loads with ``from_pretrained(dir, head="auto")`` and gives the same numbers on a padded batch (real tokens),
losses included; saved by bertblocks, the same transformers class loads it with no missing or unexpected keys
and gives the same numbers again."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import bertblocks

TOL = 1e-5
B, L, C = 2, 9, 3  # batch, sequence, choices
COMMON = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "initializer_range": 0.2,  # sharp attention: a wrong query/key/mask shows in the numbers
    "num_labels": 3,
}
DISTILBERT = {
    "vocab_size": 99,
    "dim": 32,
    "n_layers": 2,
    "n_heads": 4,
    "hidden_dim": 37,
    "max_position_embeddings": 64,
    "initializer_range": 0.2,
    "num_labels": 3,
}


@dataclass(frozen=True)
class Family:
    config: str
    settings: dict[str, Any]
    pad: int
    token_types: bool = True
    classes: tuple[str, ...] = field(default_factory=tuple)


FAMILIES = {
    "roberta": Family(
        "RobertaConfig",
        {**COMMON, "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
        pad=1,
        classes=(
            "RobertaModel",
            "RobertaForMaskedLM",
            "RobertaForCausalLM",
            "RobertaForSequenceClassification",
            "RobertaForTokenClassification",
            "RobertaForQuestionAnswering",
            "RobertaForMultipleChoice",
        ),
    ),
    "xlm-roberta": Family(
        "XLMRobertaConfig",
        {**COMMON, "type_vocab_size": 1, "pad_token_id": 1},
        pad=1,
        classes=(
            "XLMRobertaModel",
            "XLMRobertaForMaskedLM",
            "XLMRobertaForCausalLM",
            "XLMRobertaForSequenceClassification",
            "XLMRobertaForTokenClassification",
            "XLMRobertaForQuestionAnswering",
            "XLMRobertaForMultipleChoice",
        ),
    ),
    "camembert": Family(
        "CamembertConfig",
        {**COMMON, "type_vocab_size": 1, "pad_token_id": 1},
        pad=1,
        classes=(
            "CamembertModel",
            "CamembertForMaskedLM",
            "CamembertForCausalLM",
            "CamembertForSequenceClassification",
            "CamembertForTokenClassification",
            "CamembertForQuestionAnswering",
            "CamembertForMultipleChoice",
        ),
    ),
    "electra": Family(
        "ElectraConfig",
        {**COMMON, "embedding_size": 16},
        pad=0,
        classes=(
            "ElectraModel",
            "ElectraForPreTraining",
            "ElectraForMaskedLM",
            "ElectraForCausalLM",
            "ElectraForSequenceClassification",
            "ElectraForTokenClassification",
            "ElectraForQuestionAnswering",
            "ElectraForMultipleChoice",
        ),
    ),
    "distilbert": Family(
        "DistilBertConfig",
        DISTILBERT,
        pad=0,
        token_types=False,
        classes=(
            "DistilBertModel",
            "DistilBertForMaskedLM",
            "DistilBertForSequenceClassification",
            "DistilBertForTokenClassification",
            "DistilBertForQuestionAnswering",
            "DistilBertForMultipleChoice",
        ),
    ),
    "albert": Family(
        "AlbertConfig",
        {**COMMON, "embedding_size": 16, "hidden_act": "gelu_new"},
        pad=0,
        classes=(
            "AlbertModel",
            "AlbertForPreTraining",
            "AlbertForMaskedLM",
            "AlbertForSequenceClassification",
            "AlbertForTokenClassification",
            "AlbertForQuestionAnswering",
            "AlbertForMultipleChoice",
        ),
    ),
    "distilbert-sinusoidal": Family(
        "DistilBertConfig",
        {**DISTILBERT, "sinusoidal_pos_embds": True},  # the fixed table is stored in the checkpoint
        pad=0,
        token_types=False,
        classes=("DistilBertModel", "DistilBertForMaskedLM"),
    ),
    "mpnet": Family(
        "MPNetConfig",
        {**COMMON, "pad_token_id": 1},
        pad=1,
        token_types=False,
        classes=(
            "MPNetModel",
            "MPNetForMaskedLM",
            "MPNetForSequenceClassification",
            "MPNetForTokenClassification",
            "MPNetForQuestionAnswering",
            "MPNetForMultipleChoice",
        ),
    ),
    "mpnet-table-40": Family(  # the table has 40 rows, of which transformers' MPNet reads the 32 buckets
        "MPNetConfig",
        {**COMMON, "pad_token_id": 1, "relative_attention_num_buckets": 40},
        pad=1,
        token_types=False,
        classes=("MPNetModel",),
    ),
    # parity of every class: tests/families/test_nomic_bert.py and test_jina_v3.py; here for the other paths
    "nomic_bert": Family(
        "NomicBertConfig",
        {**COMMON, "layer_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 50.0, "rope_type": "default"}},
        pad=0,
    ),
    "jina_embeddings_v3": Family(
        "JinaEmbeddingsV3Config",
        {**COMMON, "pad_token_id": 1, "rope_parameters": {"rope_theta": 30.0, "rope_type": "default"}},
        pad=1,
        token_types=False,
    ),
    "modernbert": Family(  # parity of every class: tests/families/test_modernbert.py; here for the other paths
        "ModernBertConfig",
        {
            **COMMON,
            "num_hidden_layers": 4,  # layers 0 and 3 global, 1 and 2 local
            "local_attention": 4,
            "global_attn_every_n_layers": 3,
            "pad_token_id": 0,  # the WordPiece vocabulary's specials: [PAD] [UNK] [CLS] [SEP] [MASK]
            "cls_token_id": 2,
            "sep_token_id": 3,
            "bos_token_id": 2,
            "eos_token_id": 3,
        },
        pad=0,
        token_types=False,
    ),
    "ernie": Family(
        "ErnieConfig",
        {**COMMON, "use_task_id": True, "task_type_vocab_size": 3},
        pad=0,
        classes=(
            "ErnieModel",
            "ErnieForMaskedLM",
            "ErnieForCausalLM",
            "ErnieForPreTraining",
            "ErnieForNextSentencePrediction",
            "ErnieForSequenceClassification",
            "ErnieForTokenClassification",
            "ErnieForQuestionAnswering",
            "ErnieForMultipleChoice",
        ),
    ),
}
CASES = [(name, cls) for name, fam in FAMILIES.items() for cls in fam.classes]


def save_hf(family: Family, cls: str, directory: Path, **extra: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    settings = {**family.settings, **extra}
    if cls.endswith("ForCausalLM"):
        settings["is_decoder"] = True
    if cls.endswith(("QuestionAnswering", "AlbertForPreTraining")):
        settings["num_labels"] = 2  # start and end; in order or swapped (transformers' SOP loss assumes 2)
    config = getattr(transformers, family.config)(**settings)
    model = getattr(transformers, cls)(config).eval()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model.save_pretrained(directory)
    return model


def batch(family: Family, cls: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Inputs with right padding in the second row (and labels of the head's kind); the real-token mask."""
    g = torch.Generator().manual_seed(1)
    shape = (B, C, L) if cls.endswith("MultipleChoice") else (B, L)
    ids = torch.randint(3, 99, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    mask[1, ..., 5:] = 0
    ids = ids.masked_fill(mask == 0, family.pad)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if family.token_types:
        inputs["token_type_ids"] = torch.zeros(shape, dtype=torch.long)
    if cls.endswith(("MaskedLM", "CausalLM")):
        inputs["labels"] = torch.randint(0, 99, shape, generator=g).masked_fill(mask == 0, -100)
    elif cls.endswith("AlbertForPreTraining"):
        inputs["labels"] = torch.randint(0, 99, shape, generator=g).masked_fill(mask == 0, -100)
        inputs["sentence_order_label"] = torch.tensor([0, 1])
    elif cls.endswith("ElectraForPreTraining"):
        inputs["labels"] = torch.randint(0, 2, shape, generator=g)
    elif cls.endswith("ForPreTraining"):
        inputs["labels"] = torch.randint(0, 99, shape, generator=g).masked_fill(mask == 0, -100)
        inputs["next_sentence_label"] = torch.tensor([0, 1])
    elif cls.endswith("NextSentencePrediction"):
        inputs["labels"] = torch.tensor([0, 1])
    elif cls.endswith("SequenceClassification"):
        inputs["labels"] = torch.tensor([0, 2])
    elif cls.endswith("TokenClassification"):
        inputs["labels"] = torch.randint(0, 3, shape, generator=g).masked_fill(mask == 0, -100)
    elif cls.endswith("QuestionAnswering"):
        inputs["start_positions"] = torch.tensor([1, 3])
        inputs["end_positions"] = torch.tensor([4, 20])  # out of range: clamped and ignored, as transformers
    elif cls.endswith("MultipleChoice"):
        inputs["labels"] = torch.tensor([1, 2])
    return inputs, mask


FIELDS = (
    "loss",
    "last_hidden_state",
    "pooler_output",
    "logits",
    "prediction_logits",
    "seq_relationship_logits",
    "start_logits",
    "end_logits",
    "sop_logits",
)


def assert_same(theirs: Any, ours: Any, mask: torch.Tensor) -> None:
    compared = 0
    for name in FIELDS:
        a, b = getattr(theirs, name, None), getattr(ours, name, None)
        if a is None:
            continue
        assert b is not None, f"bertblocks returned no {name}"
        assert a.shape == b.shape, f"{name}: {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.dim() >= 2 and a.shape[: mask.dim()] == mask.shape:  # per token: real tokens only
            a, b = a[mask.bool()], b[mask.bool()]
        elif a.dim() >= 2 and mask.dim() == 3 and a.shape[:2] == mask.shape[:2]:  # per-choice pooled states
            pass
        diff = (a - b).abs().max().item()
        assert diff <= TOL, f"{name} differs by {diff}"
        compared += 1
    assert compared >= 2 or (compared == 1 and getattr(theirs, "loss", None) is None)


@pytest.mark.parametrize(("family_name", "cls"), CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_loads_transformers_checkpoint_and_saves_one_it_loads(tmp_path, family_name, cls):
    family = FAMILIES[family_name]
    reference = save_hf(family, cls, tmp_path / "hf")
    inputs, mask = batch(family, cls)
    ours, info = bertblocks.from_pretrained(tmp_path / "hf", head="auto", output_loading_info=True)
    ours.eval()
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    if cls.endswith("Model"):
        inputs = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        expected = reference(**inputs)
        got = ours(**inputs)
    assert_same(expected, got, mask)

    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["architectures"] == [cls]
    assert "bertblocks" not in written  # the family's own fields say everything
    again, hf_info = getattr(transformers, cls).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert hf_info["missing_keys"] == set() or not hf_info["missing_keys"]
    assert not hf_info["unexpected_keys"]
    assert not hf_info["mismatched_keys"]
    with torch.no_grad():
        assert_same(expected, again.eval()(**inputs), mask)
