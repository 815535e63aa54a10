"""Task heads that put a prediction transform (``norm(act(dense(h)))``) before every output layer, as ModernBERT's
heads do (``ModernBertPredictionHead``), for masked LM and every classifier alike.

* ``transform_masked_lm`` — transform → decoder (tied to the token embeddings; its bias optional); with
  ``sparse_prediction`` and labels, only the positions that have a label are scored (ModernBERT's option).
* ``transform_classification`` — pool (first token, first real token or masked mean) → transform → dropout →
  classifier; losses as ``sequence_classification`` (``problem_type``).
* ``transform_token_classification`` / ``transform_question_answering`` — transform per token, then BERT's
  token classifier / span head (their losses).
* ``transform_multiple_choice`` — each choice pooled → transform → dropout → one score.

Module names: ``transform`` (``dense``, ``act``, ``norm``), ``decoder``, ``dropout``, ``classifier`` (``qa_outputs``
for QA, as BERT's span head); a family's key map renames them (ModernBERT: ``head``, ``drop``, ``classifier``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import Head
from bertblocks.core.outputs import (
    MaskedLMOutput,
    ModelOutput,
    ModelOutputWithPooling,
    MultipleChoiceModelOutput,
    SequenceClassifierOutput,
)
from bertblocks.plugins.feedforward import ACTIVATIONS
from bertblocks.plugins.heads.bert import (
    MultipleChoiceHead,
    QuestionAnsweringHead,
    SequenceClassificationHead,
    TokenClassificationHead,
    check_class_labels,
)

Pooling = Literal["first", "first_real", "mean"]
#: every head of this module (a family's key map restricts its renames to them)
TRANSFORM_HEADS = (
    "transform_masked_lm",
    "transform_classification",
    "transform_token_classification",
    "transform_question_answering",
    "transform_multiple_choice",
)


# ------------------------------------------------------------------------------------------------ options
class TransformOptions(BaseModel):
    """The prediction transform's options; the defaults are ModernBERT's."""

    model_config = ConfigDict(extra="forbid")

    activation: str = Field("gelu", description="the transform's activation (ModernBERT's classifier_activation)")
    dense_bias: bool = Field(False, description="a bias on the transform's dense layer (classifier_bias)")
    norm_bias: bool = Field(False, description="a bias in the transform's LayerNorm (norm_bias)")

    @field_validator("activation")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in ACTIVATIONS:
            raise ValueError(f"unknown activation {value!r}; choose one of {', '.join(ACTIVATIONS)}")
        return value


class TransformLMOptions(TransformOptions):
    """Options of ``transform_masked_lm``."""

    decoder_bias: bool = Field(True, description="a bias on the vocabulary decoder (decoder_bias)")
    sparse_prediction: bool = Field(
        False, description="with labels, score only the positions whose label is not sparse_ignore_index"
    )
    sparse_ignore_index: int = Field(-100, description="the label that marks a position unscored (sparse)")


class TransformPoolingOptions(TransformOptions):
    """Options of the pooled transform heads."""

    pooling: Pooling = Field(
        "first",
        description="first: position 0; first_real: the first position the attention mask keeps (left padding); "
        "mean: the masked mean (ModernBERT's classifier_pooling cls / mean)",
    )


# ------------------------------------------------------------------------------------------------ modules
class PredictionTransform(nn.Module):
    """``norm(act(dense(h)))`` (ModernBERT's ``ModernBertPredictionHead``)."""

    def __init__(self, hidden_size: int, layer_norm_eps: float, options: TransformOptions) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size, bias=options.dense_bias)
        self.act = ACTIVATIONS[options.activation][0]()
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps, bias=options.norm_bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(hidden_states)))


def pool(hidden_states: torch.Tensor, mask: torch.Tensor | None, pooling: Pooling) -> torch.Tensor:
    """``[b, q, H]`` → ``[b, H]``: position 0, the first position ``mask`` keeps, or the mean over kept positions
    (all positions without a mask)."""
    if pooling == "first" or (pooling == "first_real" and mask is None):
        return hidden_states[:, 0]
    if mask is not None and mask.dim() != 2:
        raise ValueError(f"{pooling} pooling needs a 2-D attention_mask [batch, seq]; got shape {tuple(mask.shape)}")
    if pooling == "first_real":
        assert mask is not None
        first = mask.argmax(dim=-1)  # [b]: the first 1 (left or right padding alike)
        return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), first]
    if mask is None:
        return hidden_states.mean(dim=1)
    weights = mask.unsqueeze(-1).to(hidden_states.dtype)  # [b, q, 1]
    return (hidden_states * weights).sum(dim=1) / mask.sum(dim=1, keepdim=True).to(hidden_states.dtype)


# -------------------------------------------------------------------------------------------------- heads
class TransformMaskedLMHead(Head):
    """Masked LM: ``decoder(transform(h))``; cross-entropy in float32 ignoring -100 (transformers'
    ``ForMaskedLMLoss``). With ``sparse_prediction`` and labels, logits are ``[n, vocab]`` for the ``n`` labelled
    positions only, as ModernBERT returns them."""

    def __init__(
        self, *, hidden_size: int, vocab_size: int, layer_norm_eps: float, tie: bool, options: TransformLMOptions
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tie = tie
        self.sparse = options.sparse_prediction
        self.sparse_ignore_index = options.sparse_ignore_index
        self.transform = PredictionTransform(hidden_size, layer_norm_eps, options)
        self.decoder = nn.Linear(hidden_size, vocab_size, bias=options.decoder_bias)

    def tie_weights(self, input_embeddings: nn.Embedding) -> None:
        if self.tie:
            self.decoder.weight = input_embeddings.weight

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> MaskedLMOutput:
        assert output.last_hidden_state is not None
        hidden = output.last_hidden_state  # [b, q, H]
        target = labels.get("labels")
        if target is not None:
            check_class_labels(
                "labels", target, (tuple(hidden.shape[:-1]),), self.vocab_size, "token ids [batch, seq] or -100"
            )
            if self.sparse:
                target = target.reshape(-1)
                keep = target != self.sparse_ignore_index
                hidden, target = hidden.reshape(target.shape[0], -1)[keep], target[keep]  # [n, H], [n]
        logits = self.decoder(self.transform(hidden))
        loss = None
        if target is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, self.vocab_size), target.reshape(-1))
        return MaskedLMOutput(loss=loss, logits=logits)


class TransformClassificationHead(SequenceClassificationHead):
    """Sequence classification: ``classifier(dropout(transform(pool(h))))``; the loss follows ``problem_type``."""

    needs_pooler = False
    #: prepare_inputs only reads the mask (for pooling); it reshapes nothing (the conformance suite asks)
    reshapes_inputs = False

    def __init__(
        self,
        *,
        hidden_size: int,
        num_labels: int,
        classifier_dropout: float,
        layer_norm_eps: float,
        options: TransformPoolingOptions,
    ) -> None:
        super().__init__(hidden_size=hidden_size, num_labels=num_labels, classifier_dropout=classifier_dropout)
        self.pooling = options.pooling
        self.transform = PredictionTransform(hidden_size, layer_norm_eps, options)
        self._mask: torch.Tensor | None = None

    def prepare_inputs(self, inputs: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        self._mask = inputs.get("attention_mask")  # pooling reads it
        return inputs

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> ModelOutput:
        assert output.last_hidden_state is not None
        pooled = pool(output.last_hidden_state, self._mask, self.pooling)  # [b, H]
        self._mask = None
        logits = self.classifier(self.dropout(self.transform(pooled)))  # [b, n]
        loss = self._loss(logits, labels["labels"]) if "labels" in labels else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


class TransformTokenClassificationHead(TokenClassificationHead):
    """Token classification: ``classifier(dropout(transform(h)))`` per position; BERT's loss."""

    def __init__(
        self,
        *,
        hidden_size: int,
        num_labels: int,
        classifier_dropout: float,
        layer_norm_eps: float,
        options: TransformOptions,
    ) -> None:
        super().__init__(hidden_size=hidden_size, num_labels=num_labels, classifier_dropout=classifier_dropout)
        self.transform = PredictionTransform(hidden_size, layer_norm_eps, options)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> ModelOutput:
        assert output.last_hidden_state is not None
        transformed = replace(output, last_hidden_state=self.transform(output.last_hidden_state))
        return super().forward(transformed, labels, batch_shape)


class TransformQuestionAnsweringHead(QuestionAnsweringHead):
    """Span prediction: ``qa_outputs(dropout(transform(h)))``; BERT's loss (clamped positions, ignored if out of
    range)."""

    def __init__(
        self,
        *,
        hidden_size: int,
        num_labels: int,
        classifier_dropout: float,
        layer_norm_eps: float,
        options: TransformOptions,
    ) -> None:
        super().__init__(hidden_size=hidden_size, num_labels=num_labels)
        self.transform = PredictionTransform(hidden_size, layer_norm_eps, options)
        self.dropout = nn.Dropout(classifier_dropout)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> ModelOutput:
        assert output.last_hidden_state is not None
        transformed = replace(output, last_hidden_state=self.dropout(self.transform(output.last_hidden_state)))
        return super().forward(transformed, labels, batch_shape)


class TransformMultipleChoiceHead(MultipleChoiceHead):
    """Multiple choice: each choice ``[b·c, q, H]`` pooled → transform → dropout → one score, reshaped ``[b, c]``."""

    needs_pooler = False

    def __init__(
        self, *, hidden_size: int, classifier_dropout: float, layer_norm_eps: float, options: TransformPoolingOptions
    ) -> None:
        super().__init__(hidden_size=hidden_size, classifier_dropout=classifier_dropout)
        self.pooling = options.pooling
        self.transform = PredictionTransform(hidden_size, layer_norm_eps, options)
        self._mask: torch.Tensor | None = None

    def prepare_inputs(self, inputs: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        out = super().prepare_inputs(inputs)
        self._mask = out.get("attention_mask")  # [b·c, q]: pooling reads it
        return out

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> MultipleChoiceModelOutput:
        assert output.last_hidden_state is not None
        pooled = pool(output.last_hidden_state, self._mask, self.pooling)  # [b·c, H]
        self._mask = None
        b, c = batch_shape
        logits = self.classifier(self.dropout(self.transform(pooled))).view(b, c)
        loss = None
        if "labels" in labels:
            check_class_labels("labels", labels["labels"], ((b,),), c, "the index of the right choice per example")
            loss = F.cross_entropy(logits, labels["labels"])
        return MultipleChoiceModelOutput(loss=loss, logits=logits)


# -------------------------------------------------------------------------------------------------- factories
def _masked_lm(
    *,
    hidden_size: int,
    vocab_size: int,
    layer_norm_eps: float,
    tie_word_embeddings: bool,
    options: TransformLMOptions,
    **_: Any,
) -> TransformMaskedLMHead:
    return TransformMaskedLMHead(
        hidden_size=hidden_size,
        vocab_size=vocab_size,
        layer_norm_eps=layer_norm_eps,
        tie=tie_word_embeddings,
        options=options,
    )


def _classifier(cls: type[Head]) -> Any:
    def factory(
        *,
        hidden_size: int,
        num_labels: int,
        classifier_dropout: float,
        layer_norm_eps: float,
        options: TransformOptions,
        **_: Any,
    ) -> Head:
        if cls is TransformMultipleChoiceHead:
            return cls(
                hidden_size=hidden_size,
                classifier_dropout=classifier_dropout,
                layer_norm_eps=layer_norm_eps,
                options=options,
            )
        return cls(
            hidden_size=hidden_size,
            num_labels=num_labels,
            classifier_dropout=classifier_dropout,
            layer_norm_eps=layer_norm_eps,
            options=options,
        )

    return factory


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "head",
            "transform_masked_lm",
            _masked_lm,
            TransformLMOptions,
            "masked LM through a dense → act → norm transform, decoder bias optional (ModernBertForMaskedLM)",
        ),
        Component(
            "head",
            "transform_classification",
            _classifier(TransformClassificationHead),
            TransformPoolingOptions,
            "pool (first / first real / mean) → transform → classifier (ModernBertForSequenceClassification)",
        ),
        Component(
            "head",
            "transform_token_classification",
            _classifier(TransformTokenClassificationHead),
            TransformOptions,
            "transform → per-token classifier (ModernBertForTokenClassification)",
        ),
        Component(
            "head",
            "transform_question_answering",
            _classifier(TransformQuestionAnsweringHead),
            TransformOptions,
            "transform → start/end span logits (ModernBertForQuestionAnswering)",
        ),
        Component(
            "head",
            "transform_multiple_choice",
            _classifier(TransformMultipleChoiceHead),
            TransformPoolingOptions,
            "each choice pooled → transform → one score (ModernBertForMultipleChoice)",
        ),
    ]
