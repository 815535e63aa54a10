"""Task heads other BERT-family models have, built from the same parts as BERT's (module names are bertblocks'
canonical ones; each family's key map renames them to its own checkpoint keys).

* ``masked_lm_gelu`` / ``causal_lm_gelu`` — BERT's LM head with a gelu transform whatever ``hidden_act`` is
  (RoBERTa's ``lm_head``, ELECTRA's generator), optionally narrowing to ``embedding_size`` (ELECTRA).
* ``dense_classification`` — first token → dropout → dense → activation → dropout → out_proj (RoBERTa's
  ``classifier.dense``/``out_proj`` with tanh, ELECTRA's with gelu, DistilBERT's ``pre_classifier`` with relu).
* ``dense_multiple_choice`` — the same, one score per choice (DistilBERT, ELECTRA's ``sequence_summary``).
* ``replaced_token_detection`` — ELECTRA's discriminator: one logit per token, BCE over real tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.core.component import Component, NoOptions
from bertblocks.core.interfaces import Head
from bertblocks.core.outputs import (
    ModelOutput,
    ModelOutputWithPooling,
    MultipleChoiceModelOutput,
    SequenceClassifierOutput,
)
from bertblocks.plugins.feedforward import ACTIVATIONS
from bertblocks.plugins.heads.bert import (
    BertLMPredictionHead,
    CausalLMHead,
    MaskedLMHead,
    MultipleChoiceHead,
    SequenceClassificationHead,
    check_class_labels,
)

Activation = Literal["tanh", "gelu", "relu"]


def _activation(name: str) -> nn.Module:
    return ACTIVATIONS[name][0]()


# -------------------------------------------------------------------------------------------- LM heads
class GeluLMOptions(BaseModel):
    """Options of the gelu LM heads."""

    model_config = ConfigDict(extra="forbid")

    embedding_size: PositiveInt | None = Field(
        None, description="transform to this width before the decoder (ELECTRA's generator); hidden_size if null"
    )
    activation: Literal["gelu", "hidden_act"] = Field(
        "gelu", description="the transform's activation: gelu (RoBERTa, ELECTRA) or the config's hidden_act (ALBERT)"
    )


def _narrow(predictions: BertLMPredictionHead, hidden_size: int, width: int, vocab_size: int, eps: float) -> None:
    """Make the transform map hidden → ``width`` and the decoder read ``width`` (ELECTRA's generator)."""
    predictions.transform.dense = nn.Linear(hidden_size, width)
    predictions.transform.LayerNorm = nn.LayerNorm(width, eps=eps)
    predictions.decoder = nn.Linear(width, vocab_size)
    if predictions.tie:
        predictions.decoder.bias = predictions.bias


def _gelu_lm(cls: type[MaskedLMHead] | type[CausalLMHead] | type[SentenceOrderPreTrainingHead]) -> Any:
    def factory(
        *,
        hidden_size: int,
        vocab_size: int,
        layer_norm_eps: float,
        tie_word_embeddings: bool,
        activation: Any,
        classifier_dropout: float,
        options: GeluLMOptions,
        **_: Any,
    ) -> Head:
        extra = {"classifier_dropout": classifier_dropout} if cls is SentenceOrderPreTrainingHead else {}
        head = cls(
            **extra,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            # RoBERTa's lm_head and ELECTRA's generator call gelu, not hidden_act; ALBERT's calls hidden_act
            activation=activation() if options.activation == "hidden_act" else _activation("gelu"),
            layer_norm_eps=layer_norm_eps,
            tie=tie_word_embeddings,
        )
        if options.embedding_size is not None and options.embedding_size != hidden_size:
            _narrow(head.cls.predictions, hidden_size, options.embedding_size, vocab_size, layer_norm_eps)
        return head

    return factory


# ------------------------------------------------------------------------------------ classification
class DenseClassificationOptions(BaseModel):
    """Options of the dense classification heads."""

    model_config = ConfigDict(extra="forbid")

    activation: Activation = Field(
        "tanh", description="between dense and out_proj: tanh (RoBERTa), gelu (ELECTRA), relu (DistilBERT)"
    )


class DenseClassifier(nn.Module):
    """``out_proj(dropout(act(dense(dropout(x)))))`` on the first token: RoBERTa's ``RobertaClassificationHead``."""

    def __init__(self, hidden_size: int, outputs: int, activation: str, dropout: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.act = _activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden_size, outputs)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        x = self.dropout(sequence[:, 0])  # [b, H]: the <s>/[CLS] token
        return self.out_proj(self.dropout(self.act(self.dense(x))))


class DenseClassificationHead(SequenceClassificationHead):
    """Sequence classification through :class:`DenseClassifier`; losses as ``sequence_classification``."""

    needs_pooler = False

    def __init__(self, *, hidden_size: int, num_labels: int, classifier_dropout: float, activation: str) -> None:
        super().__init__(hidden_size=hidden_size, num_labels=num_labels, classifier_dropout=classifier_dropout)
        del self.dropout
        self.classifier = DenseClassifier(hidden_size, num_labels, activation, classifier_dropout)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> ModelOutput:
        assert output.last_hidden_state is not None
        logits = self.classifier(output.last_hidden_state)  # [b, n]
        loss = self._loss(logits, labels["labels"]) if "labels" in labels else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


class DenseMultipleChoiceHead(MultipleChoiceHead):
    """Multiple choice through :class:`DenseClassifier` with one output (DistilBERT, ELECTRA)."""

    needs_pooler = False

    def __init__(self, *, hidden_size: int, classifier_dropout: float, activation: str) -> None:
        super().__init__(hidden_size=hidden_size, classifier_dropout=classifier_dropout)
        del self.dropout
        self.classifier = DenseClassifier(hidden_size, 1, activation, classifier_dropout)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> MultipleChoiceModelOutput:
        assert output.last_hidden_state is not None
        b, c = batch_shape
        logits = self.classifier(output.last_hidden_state).view(b, c)
        loss = None
        if "labels" in labels:
            check_class_labels("labels", labels["labels"], ((b,),), c, "the index of the right choice per example")
            loss = F.cross_entropy(logits, labels["labels"])
        return MultipleChoiceModelOutput(loss=loss, logits=logits)


# ------------------------------------------------------------------------------- ELECTRA discriminator
@dataclass
class ElectraForPreTrainingOutput(ModelOutput):
    """Replaced-token detection: ``logits [b, q]`` (transformers' ``ElectraForPreTrainingOutput``)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class DiscriminatorPredictions(nn.Module):
    """ELECTRA's ``discriminator_predictions``: ``dense_prediction(act(dense(h)))`` → one logit per token."""

    def __init__(self, hidden_size: int, activation: nn.Module) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = activation
        self.dense_prediction = nn.Linear(hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.activation(self.dense(hidden_states))).squeeze(-1)  # [b, q]


class ReplacedTokenDetectionHead(Head):
    """ELECTRA's pre-training discriminator (``ElectraForPreTraining``): was each token replaced?

    The loss is transformers': BCE with logits over the tokens the attention mask keeps (all tokens without a
    mask), labels 1 = replaced.
    """

    #: prepare_inputs only reads the mask (for the loss); it reshapes nothing (the conformance suite asks)
    reshapes_inputs = False

    def __init__(self, *, hidden_size: int, activation: nn.Module) -> None:
        super().__init__()
        self.discriminator_predictions = DiscriminatorPredictions(hidden_size, activation)
        self._mask: torch.Tensor | None = None

    def prepare_inputs(self, inputs: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        self._mask = inputs.get("attention_mask")  # the loss counts real tokens only
        return inputs

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> ModelOutput:
        assert output.last_hidden_state is not None
        logits = self.discriminator_predictions(output.last_hidden_state)  # [b, q]
        loss = None
        if "labels" in labels:
            target = labels["labels"]
            check_class_labels("labels", target, (tuple(logits.shape),), 2, "1 = replaced token, 0 = original")
            if self._mask is not None:
                active = self._mask.view(-1, logits.shape[1]) == 1
                loss = F.binary_cross_entropy_with_logits(logits[active], target[active].float())
            else:
                loss = F.binary_cross_entropy_with_logits(logits, target.float())
        self._mask = None
        return ElectraForPreTrainingOutput(loss=loss, logits=logits)


# -------------------------------------------------------------------------------------- ALBERT's SOP
@dataclass
class SentenceOrderPreTrainingOutput(ModelOutput):
    """Masked LM + sentence order (transformers' ``AlbertForPreTrainingOutput``)."""

    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    sop_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class SentenceOrderClassifier(nn.Module):
    """ALBERT's ``sop_classifier``: dropout, then two logits from the pooled output."""

    def __init__(self, hidden_size: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(pooled))


class SentenceOrderPreTrainingHead(MaskedLMHead):
    """ALBERT's pre-training (``AlbertForPreTraining``): masked LM plus sentence-order prediction on the pooled
    output; the loss is their sum and needs both ``labels`` and ``sentence_order_label``, as transformers'."""

    needs_pooler = True
    label_names = ("labels", "sentence_order_label")

    def __init__(self, *, classifier_dropout: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sop_classifier = SentenceOrderClassifier(kwargs["hidden_size"], classifier_dropout)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> ModelOutput:
        assert output.last_hidden_state is not None
        assert output.pooler_output is not None
        logits = self.cls(output.last_hidden_state)  # [b, q, vocab]
        sop = self.sop_classifier(output.pooler_output)  # [b, 2]
        loss = None
        if len(labels) == 2:
            target, order = labels["labels"], labels["sentence_order_label"]
            check_class_labels("labels", target, (tuple(logits.shape[:-1]),), self.vocab_size, "token ids or -100")
            b = sop.shape[0]
            check_class_labels("sentence_order_label", order, ((b,), (b, 1)), 2, "0 = in order, 1 = swapped")
            loss = F.cross_entropy(logits.view(-1, self.vocab_size), target.view(-1)) + F.cross_entropy(
                sop.view(-1, 2), order.view(-1)
            )
        elif labels:
            raise ValueError(
                f"the sentence-order pre-training loss needs labels and sentence_order_label; got {list(labels)}"
            )
        return SentenceOrderPreTrainingOutput(loss=loss, prediction_logits=logits, sop_logits=sop)


# ------------------------------------------------------------------------------------------- factories
def _dense_classification(
    *, hidden_size: int, num_labels: int, classifier_dropout: float, options: DenseClassificationOptions, **_: Any
) -> DenseClassificationHead:
    return DenseClassificationHead(
        hidden_size=hidden_size,
        num_labels=num_labels,
        classifier_dropout=classifier_dropout,
        activation=options.activation,
    )


def _dense_multiple_choice(
    *, hidden_size: int, classifier_dropout: float, options: DenseClassificationOptions, **_: Any
) -> DenseMultipleChoiceHead:
    return DenseMultipleChoiceHead(
        hidden_size=hidden_size, classifier_dropout=classifier_dropout, activation=options.activation
    )


def _replaced_token_detection(
    *, hidden_size: int, activation: Any, options: BaseModel, **_: Any
) -> ReplacedTokenDetectionHead:
    return ReplacedTokenDetectionHead(hidden_size=hidden_size, activation=activation())


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "head",
            "masked_lm_gelu",
            _gelu_lm(MaskedLMHead),
            GeluLMOptions,
            "masked LM with a gelu transform (RoBERTa lm_head, ELECTRA generator)",
        ),
        Component(
            "head",
            "causal_lm_gelu",
            _gelu_lm(CausalLMHead),
            GeluLMOptions,
            "causal LM with a gelu transform (RobertaForCausalLM, ElectraForCausalLM)",
        ),
        Component(
            "head",
            "sentence_order_pretraining",
            _gelu_lm(SentenceOrderPreTrainingHead),
            GeluLMOptions,
            "masked LM + sentence-order prediction (AlbertForPreTraining)",
        ),
        Component(
            "head",
            "dense_classification",
            _dense_classification,
            DenseClassificationOptions,
            "first token → dense → act → out_proj (RoBERTa, ELECTRA, DistilBERT classifiers)",
        ),
        Component(
            "head",
            "dense_multiple_choice",
            _dense_multiple_choice,
            DenseClassificationOptions,
            "one score per choice through dense → act → out_proj (DistilBERT, ELECTRA)",
        ),
        Component(
            "head",
            "replaced_token_detection",
            _replaced_token_detection,
            NoOptions,
            "ELECTRA discriminator: one logit per token (ElectraForPreTraining)",
        ),
    ]
