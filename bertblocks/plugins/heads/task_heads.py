"""Task heads other BERT-family models have, composed from the same pieces as BERT's (module names are
bertblocks' canonical ones; each family's key map renames them to its own checkpoint keys).

* ``masked_lm_gelu`` / ``causal_lm_gelu`` — BERT's LM head with a gelu transform whatever ``hidden_act`` is
  (RoBERTa's ``lm_head``, ELECTRA's generator), optionally narrowing to ``embedding_size`` (ELECTRA).
* ``sentence_order_pretraining`` — that LM head plus ALBERT's sentence-order classifier on the pooled output.
* ``dense_classification`` — first token → dropout → dense → activation → dropout → out_proj (RoBERTa's
  ``classifier.dense``/``out_proj`` with tanh, ELECTRA's with gelu, DistilBERT's ``pre_classifier`` with relu).
* ``dense_multiple_choice`` — the same, one score per choice (DistilBERT, ELECTRA's ``sequence_summary``).
* ``replaced_token_detection`` — ELECTRA's discriminator: one logit per token, BCE over real tokens.
* ``last_position_multiple_choice`` — RoFormer's: each choice's last position (padding or not) → ``classifier``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.core.outputs import ModelOutput, MultipleChoiceModelOutput, SequenceClassifierOutput
from bertblocks.plugins.feedforward import ACTIVATIONS

from .bert import CHOICE_LOSS, MaskedLMOptions, language_model, lm_prediction
from .composition import Branch, ComposedHead, HeadArguments
from .losses import CrossEntropy, Loss, MaskedBinaryLoss, ProblemTypeLoss, SumOfLosses
from .transforms import Steps, dense_act, dropout_dense_act


def _activation(name: str) -> nn.Module:
    return ACTIVATIONS[name][0]()


# ------------------------------------------------------------------------------------------------ options
class GeluLMOptions(BaseModel):
    """Options of the gelu LM heads."""

    model_config = ConfigDict(extra="forbid")

    embedding_size: PositiveInt | None = Field(
        None, description="transform to this width before the decoder (ELECTRA's generator); hidden_size if null"
    )
    activation: Literal["gelu", "hidden_act"] = Field(
        "gelu", description="the transform's activation: gelu (RoBERTa, ELECTRA) or the config's hidden_act (ALBERT)"
    )


class GeluMaskedLMOptions(GeluLMOptions, MaskedLMOptions):
    """Options of ``masked_lm_gelu``: the gelu LM head's, plus opt-in ``sparse_prediction``."""


class DenseClassificationOptions(BaseModel):
    """Options of the dense classification heads."""

    model_config = ConfigDict(extra="forbid")

    activation: Literal["tanh", "gelu", "relu", "hidden_act"] = Field(
        "tanh",
        description="between dense and out_proj: tanh (RoBERTa), gelu (ELECTRA), relu (DistilBERT), or the "
        "config's hidden_act (RoFormer)",
    )


# ------------------------------------------------------------------------------------------------ outputs
@dataclass
class ElectraForPreTrainingOutput(ModelOutput):
    """Replaced-token detection: ``logits [b, q]`` (transformers' ``ElectraForPreTrainingOutput``)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class SentenceOrderPreTrainingOutput(ModelOutput):
    """Masked LM + sentence order (transformers' ``AlbertForPreTrainingOutput``)."""

    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    sop_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


SENTENCE_ORDER_LOSS = SumOfLosses(
    (
        CrossEntropy(field="prediction_logits"),
        CrossEntropy(
            field="sop_logits", label="sentence_order_label", labels_per="example", what="0 = in order, 1 = swapped"
        ),
    )
)


# ----------------------------------------------------------------------------------------- compositions
def _lm_activation(a: HeadArguments) -> nn.Module:
    # RoBERTa's lm_head and ELECTRA's generator call gelu, not hidden_act; ALBERT's calls hidden_act
    return a.activation() if a.options.activation == "hidden_act" else _activation("gelu")


def _gelu_lm(name: str, a: HeadArguments, *, causal: bool) -> ComposedHead:
    return language_model(name, a, causal=causal, activation=_lm_activation(a), width=a.options.embedding_size)


def _sentence_order(name: str, a: HeadArguments) -> ComposedHead:
    sop_classifier = Steps(("dropout", nn.Dropout(a.classifier_dropout)), ("classifier", nn.Linear(a.hidden_size, 2)))
    return ComposedHead(
        name,
        modules={
            "cls": Steps(("predictions", lm_prediction(a, _lm_activation(a), a.options.embedding_size))),
            "sop_classifier": sop_classifier,
        },
        branches=(
            Branch(("prediction_logits",), "none", ("cls",)),
            Branch(("sop_logits",), "pooler", ("sop_classifier",)),
        ),
        loss=SENTENCE_ORDER_LOSS,
        output=SentenceOrderPreTrainingOutput,
    )


def _dense_classifier(
    name: str, a: HeadArguments, *, loss: Loss, output: type[ModelOutput], choices: bool = False
) -> ComposedHead:
    """First token → ``classifier`` (RoBERTa's ``RobertaClassificationHead``: dropout, dense, activation,
    dropout, ``out_proj``): ``num_labels`` logits, or with ``choices`` one score per choice."""
    options: DenseClassificationOptions = a.options
    activation = a.activation() if options.activation == "hidden_act" else _activation(options.activation)
    steps = dropout_dense_act(a.hidden_size, activation, a.classifier_dropout)
    classifier = Steps(*steps, ("out_proj", nn.Linear(a.hidden_size, 1 if choices else a.num_labels)))
    return ComposedHead(
        name,
        modules={"classifier": classifier},
        branches=(Branch(("logits",), "first", ("classifier",)),),
        loss=loss,
        output=output,
        choices=choices,
    )


def _discriminator(name: str, a: HeadArguments) -> ComposedHead:
    predictions = Steps(*dense_act(a.hidden_size, a.activation()), ("dense_prediction", nn.Linear(a.hidden_size, 1)))
    return ComposedHead(
        name,
        modules={"discriminator_predictions": predictions},
        branches=(Branch(("logits",), "none", ("discriminator_predictions",), split=True),),  # [b, q, 1] → [b, q]
        loss=MaskedBinaryLoss(),
        output=ElectraForPreTrainingOutput,
    )


class LastPosition(nn.Module):
    """``RoFormerSequenceSummary`` as RoFormerConfig builds it (``summary_type`` absent: ``last``, no projection,
    activation or dropout): ``[b·c, q, H]`` → ``[b·c, H]``, the last position whether it is padding or not."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states[:, -1]


def _last_position_choices(name: str, a: HeadArguments) -> ComposedHead:
    """RoFormer's multiple choice: each choice's last position → ``classifier`` (one score); cross-entropy."""
    head = ComposedHead(
        name,
        modules={"sequence_summary": LastPosition(), "classifier": nn.Linear(a.hidden_size, 1)},
        branches=(Branch(("logits",), "none", ("sequence_summary", "classifier")),),
        loss=CHOICE_LOSS,
        output=MultipleChoiceModelOutput,
        choices=True,
        reads_padded_positions=True,  # the last position of a right-padded choice is padding
    )
    head.pools_padded_positions = True
    return head


# ------------------------------------------------------------ the registered compositions (see .catalog)
masked_lm_gelu = partial(_gelu_lm, causal=False)
causal_lm_gelu = partial(_gelu_lm, causal=True)
sentence_order_pretraining = _sentence_order
dense_classification = partial(_dense_classifier, loss=ProblemTypeLoss(), output=SequenceClassifierOutput)
dense_multiple_choice = partial(_dense_classifier, loss=CHOICE_LOSS, output=MultipleChoiceModelOutput, choices=True)
replaced_token_detection = _discriminator
last_position_multiple_choice = _last_position_choices
