"""Task heads that put a prediction transform (``norm(act(dense(h)))``) before every output layer, as ModernBERT's
heads do (``ModernBertPredictionHead``), for masked LM and every classifier alike; composed from the same pieces
as BERT's heads.

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

from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bertblocks.core.outputs import (
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from bertblocks.plugins.feedforward import ACTIVATIONS

from ...errors import InputError
from .bert import CHOICE_LOSS, TOKEN_LOSS, dropout_classifier, span_head
from .composition import Branch, ComposedHead, HeadArguments
from .losses import CrossEntropy, ProblemTypeLoss
from .pooling import Pooling
from .projections import TiedLinear
from .transforms import MODERNBERT_TRANSFORM, Steps, dense_act_norm

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
            raise InputError(f"unknown activation {value!r}; choose one of {', '.join(ACTIVATIONS)}")
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

    pooling: Literal["first", "first_real", "mean"] = Field(
        "first",
        description="first: position 0; first_real: the first position the attention mask keeps (left padding); "
        "mean: the masked mean (ModernBERT's classifier_pooling cls / mean)",
    )


# ----------------------------------------------------------------------------------------- compositions
def _transform(a: HeadArguments) -> Steps:
    options: TransformOptions = a.options
    return dense_act_norm(
        a.hidden_size,
        ACTIVATIONS[options.activation][0](),
        a.layer_norm_eps,
        MODERNBERT_TRANSFORM,
        dense_bias=options.dense_bias,
        norm_bias=options.norm_bias,
    )


def _masked_lm(name: str, a: HeadArguments) -> ComposedHead:
    """``decoder(transform(h))``; cross-entropy in float32 ignoring -100 (transformers' ``ForMaskedLMLoss``)."""
    options: TransformLMOptions = a.options
    decoder = TiedLinear(a.hidden_size, a.vocab_size, tie=a.tie_word_embeddings, bias=options.decoder_bias)
    sparse = options.sparse_ignore_index if options.sparse_prediction else None
    return ComposedHead(
        name,
        modules={"transform": _transform(a), "decoder": decoder},
        branches=(Branch(("logits",), "none", ("transform", "decoder"), sparse_ignore_index=sparse),),
        loss=CrossEntropy(upcast=True),
        output=MaskedLMOutput,
    )


def _classifier(name: str, a: HeadArguments, *, pooling: Pooling | None = None, **kwargs: Any) -> ComposedHead:
    """BERT's classifier with the transform before it; ``pooling`` (default) from the options."""
    chosen: Pooling = pooling or a.options.pooling
    return dropout_classifier(name, a, pooling=chosen, transform=_transform(a), **kwargs)


def _span(name: str, a: HeadArguments) -> ComposedHead:
    return span_head(name, a, transform=_transform(a))


# ------------------------------------------------------------ the registered compositions (see .catalog)
transform_masked_lm = _masked_lm
transform_classification = partial(_classifier, loss=ProblemTypeLoss(), output=SequenceClassifierOutput)
transform_token_classification = partial(_classifier, pooling="none", loss=TOKEN_LOSS, output=TokenClassifierOutput)
transform_question_answering = _span
transform_multiple_choice = partial(_classifier, loss=CHOICE_LOSS, output=MultipleChoiceModelOutput, choices=True)
