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
* ``feedforward_question_answering`` — BigBird's: a feed-forward block (BERT's layer FFN with its own residual and
  LayerNorm) before ``qa_outputs``, and the question's tokens (the first ``question_lengths``, the first token aside)
  removed from the span's competition (their logits lowered by 10⁶).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.core.outputs import (
    ModelOutput,
    ModelOutputWithPooling,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
)
from bertblocks.errors import InputError
from bertblocks.plugins.feedforward import ACTIVATIONS

from .bert import CHOICE_LOSS, MaskedLMOptions, language_model, lm_prediction
from .composition import Branch, ComposedHead, HeadArguments
from .losses import CrossEntropy, Loss, LossContext, MaskedBinaryLoss, ProblemTypeLoss, SpanLoss, SumOfLosses
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


class FeedForwardSpanClassifier(nn.Module):
    """transformers' ``BigBirdForQuestionAnsweringHead`` (module names as its checkpoint keys): ``h [b, q, H]`` →
    ``qa_outputs(LayerNorm(dropout(output.dense(act(intermediate.dense(dropout(h))))) + h)) [b, q, 2]``; the
    residual is the head's input before its first dropout, as transformers'."""

    def __init__(self, a: HeadArguments) -> None:
        super().__init__()
        self.dropout = nn.Dropout(a.hidden_dropout_prob)
        self.intermediate = Steps(("dense", nn.Linear(a.hidden_size, a.intermediate_size)), ("act", a.activation()))
        self.output = nn.ModuleDict(
            {
                "dense": nn.Linear(a.intermediate_size, a.hidden_size),
                "LayerNorm": nn.LayerNorm(a.hidden_size, eps=a.layer_norm_eps),
                "dropout": nn.Dropout(a.hidden_dropout_prob),
            }
        )
        self.qa_outputs = nn.Linear(a.hidden_size, 2)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.output
        inner = self.intermediate(self.dropout(hidden_states))  # [b, q, I]
        hidden = out["LayerNorm"](out["dropout"](out["dense"](inner)) + hidden_states)  # [b, q, H]
        return self.qa_outputs(hidden)  # [b, q, 2]


#: what a question token's start and end logits lose: transformers' BigBird subtracts 10⁶ (not -inf: a row whose
#: every position is masked still has a finite softmax)
QUESTION_PENALTY = 1e6


class QuestionMaskedSpanHead(ComposedHead):
    """Extractive QA whose start/end logits leave out the question: with ``question_lengths [b, 1]`` (or ``[b]``),
    positions ``1 … question_lengths - 1`` of each row lose :data:`QUESTION_PENALTY` (the first token stays, as
    transformers' ``BigBirdForQuestionAnswering`` keeps it), before the loss reads them. The family makes
    ``question_lengths`` from ``input_ids`` when a call gives none (BigBird: up to the first ``sep_token_id``)."""

    extra_inputs = ("question_lengths",)

    def forward(  # type: ignore[override]
        self,
        output: ModelOutputWithPooling,
        labels: Mapping[str, torch.Tensor],
        batch_shape: tuple[int, ...],
        *,
        attention_mask: torch.Tensor | None,
        question_lengths: torch.Tensor | None = None,
    ) -> ModelOutput:
        if labels and len(labels) != len(self.label_names):
            raise InputError(
                f"the {self.name} loss needs both {' and '.join(self.label_names)}; only {', '.join(labels)} was given"
            )
        logits = self.qa_classifier(output.last_hidden_state)  # [b, q, 2]
        if question_lengths is not None:
            b, length = logits.shape[:2]
            if question_lengths.dtype.is_floating_point or question_lengths.numel() != b:
                raise InputError(
                    f"question_lengths must be an integer tensor of shape ({b}, 1) or ({b},): one question length "
                    f"per example; got shape {tuple(question_lengths.shape)} and dtype {question_lengths.dtype}"
                )
            positions = torch.arange(length, device=logits.device)  # [q]
            question = positions < question_lengths.reshape(b, 1).to(logits.device)  # [b, q]
            question = question & (positions > 0)  # the first token ([CLS]) stays in the competition
            logits = logits - question.unsqueeze(-1).to(logits.dtype) * QUESTION_PENALTY
        start, end = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        values = {"start_logits": start, "end_logits": end}
        loss = self.loss(values, labels, LossContext(attention_mask=attention_mask)) if labels else None
        return self.output_type(loss=loss, **values)


def _feedforward_span(name: str, a: HeadArguments) -> ComposedHead:
    """BigBird's QA: :class:`FeedForwardSpanClassifier` on every position, the question masked
    (:class:`QuestionMaskedSpanHead`); :class:`~.losses.SpanLoss`. transformers builds its backbone without a
    pooler (``add_pooling_layer=False``) although BigBird's other heads keep one."""
    head = QuestionMaskedSpanHead(
        name,
        modules={"qa_classifier": FeedForwardSpanClassifier(a)},
        branches=(Branch(("start_logits", "end_logits"), "none", ("qa_classifier",), split=True),),
        loss=SpanLoss(),
        output=QuestionAnsweringModelOutput,
        reads_padded_positions=True,  # the start/end softmax spans padding too, as transformers'
    )
    head.omits_pooler = True
    return head


# ------------------------------------------------------------ the registered compositions (see .catalog)
masked_lm_gelu = partial(_gelu_lm, causal=False)
causal_lm_gelu = partial(_gelu_lm, causal=True)
sentence_order_pretraining = _sentence_order
dense_classification = partial(_dense_classifier, loss=ProblemTypeLoss(), output=SequenceClassifierOutput)
dense_multiple_choice = partial(_dense_classifier, loss=CHOICE_LOSS, output=MultipleChoiceModelOutput, choices=True)
replaced_token_detection = _discriminator
last_position_multiple_choice = _last_position_choices
feedforward_question_answering = _feedforward_span
