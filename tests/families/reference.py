"""The transformers side of the family tests, in one place: a table of families (transformers' config class, tiny
settings, padding index, the head classes to compare), a checkpoint saved by transformers' own class, a padded
batch with labels of each head's kind, the comparison of two outputs at the float32 parity tolerance, and the
whole load → compare → save → reload-in-transformers round trip that every family and head goes through.

Imported by the test modules of this folder (``from tests.families.reference import ...``); it holds no tests.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch
import transformers

import bertblocks
from tests.conftest import TINY_HF

#: float32 parity with transformers on the same weights (the project's tolerance policy)
TOL = 1e-5
B, C = 2, 3  # batch, choices
#: the tiny BERT settings of tests/conftest.py (initializer_range 0.2: sharp attention), three labels
COMMON: dict[str, Any] = {**TINY_HF, "num_labels": 3}
DISTILBERT: dict[str, Any] = {
    "vocab_size": 99,
    "dim": 32,
    "n_layers": 2,
    "n_heads": 4,
    "hidden_dim": 37,
    "max_position_embeddings": 64,
    "initializer_range": 0.2,
    "num_labels": 3,
}
MODERNBERT: dict[str, Any] = {
    **COMMON,
    "num_hidden_layers": 4,  # layers 0 and 3 global, 1 and 2 local
    "local_attention": 4,  # ±2 tokens: shorter than the batch, so the window matters
    "global_attn_every_n_layers": 3,
    # bases far from the defaults, so that a base read wrongly (or the two swapped) changes the numbers
    "global_rope_theta": 1000.0,
    "local_rope_theta": 50.0,
    "pad_token_id": 0,  # the WordPiece vocabulary's specials: [PAD] [UNK] [CLS] [SEP] [MASK]
    "cls_token_id": 2,
    "sep_token_id": 3,
    "bos_token_id": 2,
    "eos_token_id": 3,
}
#: DeBERTa-v3's settings (the published v3 checkpoints': shared normalised log-bucketed table, both terms, no
#: absolute table, no token types), at test size
DEBERTA_V3: dict[str, Any] = {
    **COMMON,
    "relative_attention": True,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
    "type_vocab_size": 0,
    "max_relative_positions": -1,
    "layer_norm_eps": 1e-7,
    "pooler_hidden_act": "gelu",
}
#: the config fields of DeBERTa-v2 that transformers must read back unchanged from the config.json bertblocks writes
DEBERTA_FIELDS = (
    "relative_attention",
    "position_buckets",
    "max_relative_positions",
    "norm_rel_ebd",
    "share_att_key",
    "pos_att_type",
    "position_biased_input",
    "type_vocab_size",
    "pooler_hidden_act",
)
#: the config fields of ModernBERT that transformers must read back unchanged from the config.json bertblocks writes
MODERNBERT_FIELDS = (
    "layer_types",
    "rope_parameters",
    "local_attention",
    "norm_bias",
    "classifier_pooling",
    "classifier_activation",
    "decoder_bias",
)


@dataclasses.dataclass(frozen=True)
class Family:
    """One row of the table: a transformers family at test size.

    Attributes:
        config: transformers' config class of the family.
        settings: its tiny settings.
        pad: the padding index (what padded positions hold).
        token_types: whether the batch carries ``token_type_ids``.
        classes: the transformers classes (backbone and heads) compared in the round trip.
        length: the batch's sequence length.
        real: real tokens in the padded (second) row.
        second_segment: from this position the token types are 1, so that the token-type table is read.
        config_fields: config fields transformers must read back unchanged from bertblocks' config.json.
    """

    config: str
    settings: dict[str, Any]
    pad: int
    token_types: bool = True
    classes: tuple[str, ...] = ()
    length: int = 9
    real: int = 5
    second_segment: int | None = None
    config_fields: tuple[str, ...] = ()

    @property
    def model_type(self) -> str:
        return str(getattr(transformers, self.config).model_type)

    def hf_config(self, **extra: Any) -> dict[str, Any]:
        """The config.json transformers writes for these settings (and ``extra``)."""
        return getattr(transformers, self.config)(**{**self.settings, **extra}).to_dict()


def _classes(prefix: str, *heads: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{head}" for head in heads)


#: the task heads most families have, in transformers' class names (after the family's prefix)
_TASKS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice")
_ROBERTA_HEADS = ("Model", "ForMaskedLM", "ForCausalLM", *_TASKS)

FAMILIES: dict[str, Family] = {
    "roberta": Family(
        "RobertaConfig",
        {**COMMON, "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
        pad=1,
        classes=_classes("Roberta", *_ROBERTA_HEADS),
    ),
    "xlm-roberta": Family(
        "XLMRobertaConfig",
        {**COMMON, "type_vocab_size": 1, "pad_token_id": 1},
        pad=1,
        classes=_classes("XLMRoberta", *_ROBERTA_HEADS),
    ),
    "camembert": Family(
        "CamembertConfig",
        {**COMMON, "type_vocab_size": 1, "pad_token_id": 1},
        pad=1,
        classes=_classes("Camembert", *_ROBERTA_HEADS),
    ),
    "electra": Family(
        "ElectraConfig",
        {**COMMON, "embedding_size": 16},
        pad=0,
        classes=_classes("Electra", "Model", "ForPreTraining", "ForMaskedLM", "ForCausalLM", *_TASKS),
    ),
    "distilbert": Family(
        "DistilBertConfig",
        DISTILBERT,
        pad=0,
        token_types=False,
        classes=_classes("DistilBert", "Model", "ForMaskedLM", *_TASKS),
    ),
    "albert": Family(
        "AlbertConfig",
        {**COMMON, "embedding_size": 16, "hidden_act": "gelu_new"},
        pad=0,
        classes=_classes("Albert", "Model", "ForPreTraining", "ForMaskedLM", *_TASKS),
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
        classes=_classes("MPNet", "Model", "ForMaskedLM", *_TASKS),
    ),
    "mpnet-table-40": Family(  # the table has 40 rows, of which transformers' MPNet reads the 32 buckets
        "MPNetConfig",
        {**COMMON, "pad_token_id": 1, "relative_attention_num_buckets": 40},
        pad=1,
        token_types=False,
        classes=("MPNetModel",),
    ),
    "nomic_bert": Family(
        "NomicBertConfig",
        # a base far from the default 1000, so that a rope base read wrongly (or not at all) changes the numbers
        {**COMMON, "layer_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 50.0, "rope_type": "default"}},
        pad=0,
        classes=_classes("NomicBert", "Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"),
        second_segment=3,
        config_fields=("rope_parameters",),
    ),
    "jina_embeddings_v3": Family(
        "JinaEmbeddingsV3Config",
        # a base far from the default 20000, so that a rope base read wrongly (or not at all) changes the numbers
        {**COMMON, "pad_token_id": 1, "rope_parameters": {"rope_theta": 30.0, "rope_type": "default"}},
        pad=1,
        token_types=False,  # the XLM-R tokenizer returns none
        classes=_classes(
            "JinaEmbeddingsV3",
            "Model",
            "ForMaskedLM",
            "ForSequenceClassification",
            "ForTokenClassification",
            "ForQuestionAnswering",
        ),
        config_fields=("rope_parameters",),
    ),
    "modernbert": Family(
        "ModernBertConfig",
        MODERNBERT,
        pad=0,
        token_types=False,
        classes=_classes("ModernBert", "Model", "ForMaskedLM", *_TASKS),
        length=14,  # longer than the local window
        real=9,
        config_fields=MODERNBERT_FIELDS,
    ),
    "deberta-v2": Family(
        "DebertaV2Config",
        DEBERTA_V3,
        pad=0,
        classes=_classes("DebertaV2", "Model", "ForMaskedLM", *_TASKS),
        config_fields=DEBERTA_FIELDS,
    ),
    "ernie": Family(
        "ErnieConfig",
        {**COMMON, "use_task_id": True, "task_type_vocab_size": 3},
        pad=0,
        classes=_classes(
            "Ernie",
            "Model",
            "ForMaskedLM",
            "ForCausalLM",
            "ForPreTraining",
            "ForNextSentencePrediction",
            *_TASKS,
        ),
    ),
}
FAMILIES["modernbert-biased"] = dataclasses.replace(  # every bias and the other choices flipped from the defaults
    FAMILIES["modernbert"],
    settings={
        **MODERNBERT,
        "attention_bias": True,
        "mlp_bias": True,
        "norm_bias": True,
        "classifier_bias": True,
        "decoder_bias": False,
        "classifier_pooling": "mean",
        "classifier_activation": "silu",
        "hidden_activation": "gelu_pytorch_tanh",
    },
)
#: every family and head: the rows of the round-trip table
CASES = [(name, cls) for name, family in FAMILIES.items() for cls in family.classes]


def save_hf(family: Family, cls: str, directory: Path, **extra: Any) -> torch.nn.Module:
    """A tiny random ``cls`` of the family (seed 0, ``extra`` over its settings), saved to ``directory``."""
    torch.manual_seed(0)
    settings = {**family.settings, **extra}
    if cls.endswith("ForCausalLM"):
        settings["is_decoder"] = True
    if cls.endswith(("QuestionAnswering", "AlbertForPreTraining")):
        settings["num_labels"] = 2  # start and end; in order or swapped (transformers' SOP loss assumes 2)
    model = getattr(transformers, cls)(getattr(transformers, family.config)(**settings)).eval()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model.save_pretrained(directory)
    return model


def batch(family: Family, cls: str, left: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Inputs with padding in the second row (on the right, or on the left if ``left``), labels of the head's
    kind; and the real-token mask."""
    g = torch.Generator().manual_seed(1)
    shape = (B, C, family.length) if cls.endswith("MultipleChoice") else (B, family.length)
    ids = torch.randint(3, 99, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    if left:
        mask[1, ..., : family.length - family.real] = 0
    else:
        mask[1, ..., family.real :] = 0
    inputs = {"input_ids": ids.masked_fill(mask == 0, family.pad), "attention_mask": mask}
    if family.token_types:
        inputs["token_type_ids"] = torch.zeros(shape, dtype=torch.long)
        if family.second_segment is not None:
            inputs["token_type_ids"][..., family.second_segment :] = 1
    if cls.endswith(("MaskedLM", "CausalLM")):
        inputs["labels"] = torch.randint(0, 99, shape, generator=g).masked_fill(mask == 0, -100)
        inputs["labels"][0, ::2] = -100  # some real tokens unlabelled too (ModernBERT's sparse prediction skips them)
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
        inputs["end_positions"] = torch.tensor([4, 40])  # out of range: clamped and ignored, as transformers
    elif cls.endswith("MultipleChoice"):
        inputs["labels"] = torch.tensor([1, 2])
    return inputs, mask


def call_inputs(cls: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What ``cls`` is called with: a backbone takes no labels."""
    if cls.endswith("Model"):
        return {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    return inputs


#: the output fields compared, losses included
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
    """Every field transformers returns, bertblocks returns with the same shape and within :data:`TOL`
    (per-token fields on real tokens only)."""
    compared = 0
    for name in FIELDS:
        a, b = getattr(theirs, name, None), getattr(ours, name, None)
        if a is None:
            continue
        assert b is not None, f"bertblocks returned no {name}"
        assert a.shape == b.shape, f"{name}: {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.dim() >= 2 and a.shape[: mask.dim()] == mask.shape:  # per token: real tokens only
            a, b = a[mask.bool()], b[mask.bool()]
        diff = (a - b).abs().max().item()
        assert diff <= TOL, f"{name} differs by {diff}"
        compared += 1
    assert compared >= 2 or (compared == 1 and getattr(theirs, "loss", None) is None)


def round_trip(
    tmp_path: Path,
    family: Family,
    cls: str,
    inputs: dict[str, torch.Tensor] | None = None,
    mask: torch.Tensor | None = None,
    **extra: Any,
) -> None:
    """A checkpoint saved by transformers' ``cls`` (settings changed by ``extra``) loads with
    ``from_pretrained(dir, head="auto")`` with no missing or unexpected keys and gives transformers' numbers
    (on :func:`batch`, or ``inputs`` with their real-token ``mask``); saved by bertblocks, the same class loads
    it with no missing, unexpected or mismatched keys, reads the family's config back, and gives them again."""
    reference = save_hf(family, cls, tmp_path / "hf", **extra)
    if inputs is None or mask is None:
        inputs, mask = batch(family, cls)
    inputs = call_inputs(cls, inputs)
    ours, info = bertblocks.from_pretrained(tmp_path / "hf", head="auto", output_loading_info=True)
    ours.eval()
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    with torch.no_grad():
        expected = reference(**inputs)
        assert_same(expected, ours(**inputs), mask)

    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == family.model_type
    assert written["architectures"] == [cls]
    assert "bertblocks" not in written  # the family's own fields say everything
    again, hf_info = getattr(transformers, cls).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not hf_info["missing_keys"]
    assert not hf_info["unexpected_keys"]
    assert not hf_info["mismatched_keys"]
    for name in family.config_fields:
        assert getattr(again.config, name) == getattr(reference.config, name), name
    with torch.no_grad():
        assert_same(expected, again.eval()(**inputs), mask)
