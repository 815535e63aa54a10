"""Heads of the Llama-style encoders (EuroBERT, NeoBERT), composed from the same pieces as BERT's: no prediction
transform before the vocabulary, and a classifier that may pool before or after its dense layer.

* ``linear_masked_lm`` — one linear map onto the vocabulary (``decoder``, tied to the token embeddings when
  ``tie_word_embeddings``; its bias optional): EuroBERT's ``lm_head``, NeoBERT's ``decoder``.
* ``causal_lm_linear`` — the same map with the causal-LM loss (labels shifted left by one): BertGeneration's
  ``lm_head`` (``BertGenerationDecoder``).
* ``dense_pooled_classification`` — pool (first token or masked mean) → dropout → dense → activation → dropout
  → classifier; or, ``pooling: late``, the same on every token and the logits averaged over the real tokens
  (EuroBERT's ``classifier_pooling: late``). Losses as ``sequence_classification`` (``problem_type``).

Module names: ``decoder``; ``dropout``, ``dense``, ``act``, ``classifier`` (a family's key map renames them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from bertblocks.core.outputs import CausalLMOutputWithCrossAttentions, MaskedLMOutput, SequenceClassifierOutput
from bertblocks.plugins.feedforward import ACTIVATIONS

from ...errors import InputError
from .composition import Branch, ComposedHead, HeadArguments
from .losses import CrossEntropy, ProblemTypeLoss
from .projections import TiedLinear


class LinearLMOptions(BaseModel):
    """Options of ``linear_masked_lm`` and ``causal_lm_linear``."""

    model_config = ConfigDict(extra="forbid")

    decoder_bias: bool = Field(True, description="a bias on the vocabulary decoder (EuroBERT: its mlp_bias)")


class DensePooledOptions(BaseModel):
    """Options of ``dense_pooled_classification``; the defaults are EuroBERT's."""

    model_config = ConfigDict(extra="forbid")

    pooling: Literal["first", "mean", "late"] = Field(
        "late",
        description="first: position 0; mean: the masked mean, then dense; late: dense → act → classifier on every "
        "token, then the logits' masked mean (EuroBERT's classifier_pooling bos / mean / late)",
    )
    activation: str = Field("gelu", description="between dense and classifier (EuroBERT: gelu, NeoBERT: tanh)")

    @field_validator("activation")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in ACTIVATIONS:
            raise InputError(f"unknown activation {value!r}; choose one of {', '.join(ACTIVATIONS)}")
        return value


def linear_masked_lm(name: str, a: HeadArguments) -> ComposedHead:
    """``decoder(h)``; cross-entropy in float32 ignoring -100 (transformers' ``ForMaskedLMLoss``)."""
    options: LinearLMOptions = a.options
    decoder = TiedLinear(a.hidden_size, a.vocab_size, tie=a.tie_word_embeddings, bias=options.decoder_bias)
    return ComposedHead(
        name,
        modules={"decoder": decoder},
        branches=(Branch(("logits",), "none", ("decoder",)),),
        loss=CrossEntropy(upcast=True),
        output=MaskedLMOutput,
    )


def causal_lm_linear(name: str, a: HeadArguments) -> ComposedHead:
    """``decoder(h)``; cross-entropy in float32 of token ``i + 1`` at position ``i``, ignoring -100
    (transformers' ``ForCausalLMLoss``)."""
    options: LinearLMOptions = a.options
    decoder = TiedLinear(a.hidden_size, a.vocab_size, tie=a.tie_word_embeddings, bias=options.decoder_bias)
    return ComposedHead(
        name,
        modules={"decoder": decoder},
        branches=(Branch(("logits",), "none", ("decoder",)),),
        loss=CrossEntropy(shift=True, upcast=True),
        output=CausalLMOutputWithCrossAttentions,
    )


def dense_pooled_classification(name: str, a: HeadArguments) -> ComposedHead:
    """``classifier(dropout(act(dense(dropout(pool(h))))))``, or with ``late`` pooling the masked mean of the
    per-token logits; one dropout module, applied twice (``classifier_dropout``)."""
    options: DensePooledOptions = a.options
    late = options.pooling == "late"
    return ComposedHead(
        name,
        modules={
            "dropout": nn.Dropout(a.classifier_dropout),
            "dense": nn.Linear(a.hidden_size, a.hidden_size),
            "act": ACTIVATIONS[options.activation][0](),
            "classifier": nn.Linear(a.hidden_size, a.num_labels),
        },
        branches=(
            Branch(
                ("logits",),
                "mean" if late else options.pooling,
                ("dropout", "dense", "act", "dropout", "classifier"),
                late=late,
            ),
        ),
        loss=ProblemTypeLoss(),
        output=SequenceClassifierOutput,
    )
