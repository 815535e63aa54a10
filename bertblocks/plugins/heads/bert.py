"""Task heads: BERT's masked-LM, next-sentence, pre-training, causal-LM, classification, QA and multiple-choice
heads, with transformers' module names (so checkpoint keys are HF's) and transformers' losses.

Every head receives the same keyword arguments from the task model (documented in
``docs/how-to/task-heads.md``) and takes those it needs:

    hidden_size, vocab_size, num_labels, layer_norm_eps, activation (a factory of the ``hidden_act`` module),
    classifier_dropout (already resolved: ``classifier_dropout`` or else ``hidden_dropout_prob``),
    tie_word_embeddings, is_decoder, options

Label checks run before the loss so that a wrong shape, dtype or class index is reported by name instead of
surfacing as an opaque error deep inside ``cross_entropy`` (or a device-side assert on GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import nn

from bertblocks.core.component import Component, NoOptions
from bertblocks.core.interfaces import Head
from bertblocks.core.outputs import (
    BertForPreTrainingOutput,
    CausalLMOutputWithCrossAttentions,
    MaskedLMOutput,
    ModelOutputWithPooling,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

IGNORE_INDEX = -100  # transformers' (and PyTorch's) default ignore index for cross-entropy


# ------------------------------------------------------------------------------------------------ options
# No built-in head takes options of its own: sizes, labels, dropout and tying are config fields, as in HF
# (``num_labels``, ``problem_type``, ``classifier_dropout``, ``tie_word_embeddings``), so every head declares
# the one ``NoOptions``. The old per-head names stay importable.
MaskedLMOptions = CausalLMOptions = NextSentenceOptions = PreTrainingOptions = NoOptions
SequenceClassificationOptions = TokenClassificationOptions = QuestionAnsweringOptions = NoOptions
MultipleChoiceOptions = NoOptions


# ------------------------------------------------------------------------------------------ label checks
def _is_integer(tensor: torch.Tensor) -> bool:
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def check_class_labels(
    name: str,
    labels: torch.Tensor,
    shapes: tuple[tuple[int, ...], ...],
    num_classes: int,
    what: str,
) -> None:
    """Raise a clear ``ValueError`` unless ``labels`` are integer class indices in ``[0, num_classes)`` (or the
    ignore index -100) of one of the allowed ``shapes``."""
    if not _is_integer(labels):
        raise ValueError(f"{name} must be an integer tensor of class indices ({what}); got dtype {labels.dtype}")
    if tuple(labels.shape) not in shapes:
        allowed = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name} must have shape {allowed} ({what}); got {tuple(labels.shape)}")
    if labels.numel() and not torch.compiler.is_compiling():  # a data-dependent check would break the graph
        bad = ((labels < 0) | (labels >= num_classes)) & (labels != IGNORE_INDEX)
        if bool(bad.any()):
            raise ValueError(
                f"{name} hold {labels[bad][0].item()}, outside [0, {num_classes}) and not the ignore index "
                f"{IGNORE_INDEX} ({what})"
            )


def check_float_labels(name: str, labels: torch.Tensor, shapes: tuple[tuple[int, ...], ...], what: str) -> None:
    """Raise a clear ``ValueError`` unless ``labels`` are floating point and of one of the allowed ``shapes``."""
    if not labels.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor ({what}); got dtype {labels.dtype}")
    if tuple(labels.shape) not in shapes:
        allowed = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name} must have shape {allowed} ({what}); got {tuple(labels.shape)}")


# ---------------------------------------------------------------------------------- HF's head modules
class BertPredictionHeadTransform(nn.Module):
    """HF's ``BertPredictionHeadTransform``: ``LayerNorm(act(dense(h)))``."""

    def __init__(self, hidden_size: int, activation: nn.Module, layer_norm_eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.transform_act_fn = activation
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)  # CamelCase: HF checkpoint key

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class BertLMPredictionHead(nn.Module):
    """HF's ``BertLMPredictionHead``: transform, then a decoder onto the vocabulary with its own bias.

    Tied (``tie_word_embeddings``, the default): the decoder weight *is* the token embedding table and the
    decoder bias *is* ``bias`` (one parameter under two names, as HF), so checkpoints store neither decoder key.
    Untied: the decoder owns its weight and bias, as in transformers 5 (``bias`` is then kept, unused, only so
    that checkpoints keep HF's keys).
    """

    def __init__(
        self, hidden_size: int, vocab_size: int, activation: nn.Module, layer_norm_eps: float, tie: bool
    ) -> None:
        super().__init__()
        self.tie = tie
        self.transform = BertPredictionHeadTransform(hidden_size, activation, layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, vocab_size)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        if tie:
            self.decoder.bias = self.bias

    def tie_to(self, input_embeddings: nn.Embedding) -> None:
        if self.tie:
            self.decoder.weight = input_embeddings.weight
            self.decoder.bias = self.bias

    def reset_parameters_like_hf(self, std: float) -> None:
        # the bias is this module's own parameter: a checkpoint without an MLM head (a sentence encoder such as
        # MiniLM) loads on the meta device and leaves it for initialisation, zero as in transformers
        with torch.no_grad():
            self.bias.zero_()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))  # [b, q, vocab]


class BertOnlyMLMHead(nn.Module):
    """HF's ``cls`` module of the masked-LM and causal-LM models."""

    def __init__(self, predictions: BertLMPredictionHead) -> None:
        super().__init__()
        self.predictions = predictions

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.predictions(sequence_output)


class BertOnlyNSPHead(nn.Module):
    """HF's ``cls`` module of the next-sentence model."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.seq_relationship = nn.Linear(hidden_size, 2)

    def forward(self, pooled_output: torch.Tensor) -> torch.Tensor:
        return self.seq_relationship(pooled_output)


class BertPreTrainingHeads(nn.Module):
    """HF's ``cls`` module of the pre-training model: masked-LM predictions and next-sentence scores."""

    def __init__(self, predictions: BertLMPredictionHead, hidden_size: int) -> None:
        super().__init__()
        self.predictions = predictions
        self.seq_relationship = nn.Linear(hidden_size, 2)

    def forward(self, sequence_output: torch.Tensor, pooled_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


# ----------------------------------------------------------------------------------------------- heads
def _pooled(output: ModelOutputWithPooling, head: str) -> torch.Tensor:
    if output.pooler_output is None:
        raise ValueError(f"the {head} head reads the pooled output, but the backbone returned none")
    return output.pooler_output


def _sequence(output: ModelOutputWithPooling) -> torch.Tensor:
    assert output.last_hidden_state is not None
    return output.last_hidden_state


def _lm_labels(labels: torch.Tensor, logits: torch.Tensor, vocab_size: int, name: str = "labels") -> None:
    check_class_labels(name, labels, (tuple(logits.shape[:-1]),), vocab_size, "token ids [batch, seq] or -100")


class _LanguageModelHead(Head):
    """The modules shared by the masked-LM and causal-LM heads: HF's ``cls.predictions``."""

    def __init__(
        self, *, hidden_size: int, vocab_size: int, activation: nn.Module, layer_norm_eps: float, tie: bool
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.cls = BertOnlyMLMHead(BertLMPredictionHead(hidden_size, vocab_size, activation, layer_norm_eps, tie))

    def tie_weights(self, input_embeddings: nn.Embedding) -> None:
        self.cls.predictions.tie_to(input_embeddings)


class MaskedLMHead(_LanguageModelHead):
    """Masked LM (``BertForMaskedLM``): vocabulary logits per position; cross-entropy ignoring -100."""

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> MaskedLMOutput:
        logits = self.cls(_sequence(output))  # [b, q, vocab]
        loss = None
        if "labels" in labels:
            target = labels["labels"]
            _lm_labels(target, logits, self.vocab_size)
            loss = F.cross_entropy(logits.view(-1, self.vocab_size), target.view(-1))
        return MaskedLMOutput(loss=loss, logits=logits)


class CausalLMHead(_LanguageModelHead):
    """Causal LM (``BertLMHeadModel``): the masked-LM modules; the loss predicts token ``i + 1`` at ``i``.

    The loss is transformers 5's ``ForCausalLMLoss``: logits upcast to float32, labels shifted left by one
    and padded with -100, mean cross-entropy over the rest.
    """

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> CausalLMOutputWithCrossAttentions:
        logits = self.cls(_sequence(output))  # [b, q, vocab]
        loss = None
        if "labels" in labels:
            target = labels["labels"]
            _lm_labels(target, logits, self.vocab_size)
            shifted = F.pad(target, (0, 1), value=IGNORE_INDEX)[..., 1:]  # [b, q]: token i+1 at position i
            loss = F.cross_entropy(logits.float().reshape(-1, self.vocab_size), shifted.reshape(-1))
        return CausalLMOutputWithCrossAttentions(loss=loss, logits=logits)


class NextSentenceHead(Head):
    """Next-sentence prediction (``BertForNextSentencePrediction``): two logits from the pooled output."""

    needs_pooler = True

    def __init__(self, *, hidden_size: int) -> None:
        super().__init__()
        self.cls = BertOnlyNSPHead(hidden_size)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> NextSentencePredictorOutput:
        logits = self.cls(_pooled(output, "next_sentence"))  # [b, 2]
        loss = None
        if "labels" in labels:
            target = labels["labels"]
            b = logits.shape[0]
            check_class_labels("labels", target, ((b,), (b, 1)), 2, "0 = B continues A, 1 = B is random")
            loss = F.cross_entropy(logits.view(-1, 2), target.view(-1))
        return NextSentencePredictorOutput(loss=loss, logits=logits)


class PreTrainingHead(Head):
    """Pre-training (``BertForPreTraining``): masked LM plus next-sentence; the loss is their sum and needs both
    ``labels`` and ``next_sentence_label`` (one alone is an error, not a silently missing loss)."""

    needs_pooler = True
    label_names = ("labels", "next_sentence_label")

    def __init__(
        self, *, hidden_size: int, vocab_size: int, activation: nn.Module, layer_norm_eps: float, tie: bool
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        predictions = BertLMPredictionHead(hidden_size, vocab_size, activation, layer_norm_eps, tie)
        self.cls = BertPreTrainingHeads(predictions, hidden_size)

    def tie_weights(self, input_embeddings: nn.Embedding) -> None:
        self.cls.predictions.tie_to(input_embeddings)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> BertForPreTrainingOutput:
        prediction_logits, relationship_logits = self.cls(_sequence(output), _pooled(output, "pretraining"))
        loss = None
        if labels:
            if len(labels) != 2:
                (given,) = labels
                raise ValueError(
                    f"the pretraining loss needs both labels and next_sentence_label; only {given} was given"
                )
            target, nsp_target = labels["labels"], labels["next_sentence_label"]
            _lm_labels(target, prediction_logits, self.vocab_size)
            b = relationship_logits.shape[0]
            check_class_labels("next_sentence_label", nsp_target, ((b,), (b, 1)), 2, "0 = continues, 1 = random")
            mlm = F.cross_entropy(prediction_logits.view(-1, self.vocab_size), target.view(-1))
            nsp = F.cross_entropy(relationship_logits.view(-1, 2), nsp_target.view(-1))
            loss = mlm + nsp
        return BertForPreTrainingOutput(
            loss=loss, prediction_logits=prediction_logits, seq_relationship_logits=relationship_logits
        )


ProblemType = str | None


class SequenceClassificationHead(Head):
    """Sequence classification or regression (``BertForSequenceClassification``) on the pooled output.

    The loss follows ``problem_type``; when it is unset it is inferred on the first call with labels, exactly
    as HF does, and written back into the model's config (so a saved config records it): one label →
    ``regression`` (MSE), integer labels → ``single_label_classification`` (cross-entropy), anything else →
    ``multi_label_classification`` (BCE with logits).
    """

    needs_pooler = True
    config_fields = ("problem_type",)

    def __init__(self, *, hidden_size: int, num_labels: int, classifier_dropout: float) -> None:
        super().__init__()
        self.num_labels = num_labels
        self.problem_type: ProblemType = None  # mirrored from the config by the task model
        self.dropout = nn.Dropout(classifier_dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> SequenceClassifierOutput:
        logits = self.classifier(self.dropout(_pooled(output, "sequence_classification")))  # [b, n]
        loss = None
        if "labels" in labels:
            loss = self._loss(logits, labels["labels"])
        return SequenceClassifierOutput(loss=loss, logits=logits)

    def _loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        n, b = self.num_labels, logits.shape[0]
        if self.problem_type is None:
            if n == 1:
                self.problem_type = "regression"
            elif target.dtype in (torch.long, torch.int):
                self.problem_type = "single_label_classification"
            else:
                self.problem_type = "multi_label_classification"
        if self.problem_type == "regression":
            if n == 1:
                check_float_labels("labels", target, ((b,), (b, 1)), "regression targets, one per example")
                return F.mse_loss(logits.squeeze(), target.squeeze())
            check_float_labels("labels", target, ((b, n),), f"regression targets, {n} per example")
            return F.mse_loss(logits, target)
        if self.problem_type == "single_label_classification":
            check_class_labels("labels", target, ((b,), (b, 1)), n, "one class index per example")
            return F.cross_entropy(logits.view(-1, n), target.view(-1))
        check_float_labels("labels", target, ((b, n),), "multi-label targets: 0/1 per class as floats")
        return F.binary_cross_entropy_with_logits(logits, target)


class TokenClassificationHead(Head):
    """Token classification (``BertForTokenClassification``): ``num_labels`` logits per position."""

    def __init__(self, *, hidden_size: int, num_labels: int, classifier_dropout: float) -> None:
        super().__init__()
        self.num_labels = num_labels
        self.dropout = nn.Dropout(classifier_dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> TokenClassifierOutput:
        logits = self.classifier(self.dropout(_sequence(output)))  # [b, q, n]
        loss = None
        if "labels" in labels:
            target = labels["labels"]
            shape = (tuple(logits.shape[:-1]),)
            check_class_labels("labels", target, shape, self.num_labels, "one class per token [batch, seq] or -100")
            loss = F.cross_entropy(logits.view(-1, self.num_labels), target.view(-1))
        return TokenClassifierOutput(loss=loss, logits=logits)


class QuestionAnsweringHead(Head):
    """Extractive QA (``BertForQuestionAnswering``): start and end logits per position.

    As HF: positions outside the input are clamped to ``seq_len``, which is also the ignore index, so such
    examples add nothing to the loss; the loss is the mean of the start and end cross-entropies.
    """

    label_names = ("start_positions", "end_positions")
    reads_padded_positions = True  # the start/end softmax spans padding too

    def __init__(self, *, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        if num_labels != 2:
            raise ValueError(
                f"the question_answering head needs num_labels = 2 (start and end logits); the config has "
                f"num_labels = {num_labels}"
            )
        self.qa_outputs = nn.Linear(hidden_size, num_labels)

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> QuestionAnsweringModelOutput:
        logits = self.qa_outputs(_sequence(output))  # [b, q, 2]
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        loss = None
        if labels:
            if len(labels) != 2:
                (given,) = labels
                raise ValueError(f"the QA loss needs both start_positions and end_positions; only {given} was given")
            b, length = start_logits.shape
            positions = []
            for name in self.label_names:
                target = labels[name]
                if not _is_integer(target):
                    raise ValueError(f"{name} must be an integer tensor of token positions; got dtype {target.dtype}")
                if tuple(target.shape) not in ((b,), (b, 1)):
                    raise ValueError(
                        f"{name} must have shape ({b},) or ({b}, 1): one position per example; "
                        f"got {tuple(target.shape)}"
                    )
                positions.append(target.reshape(b).clamp(0, length))  # out of range → `length`, ignored below
            start_loss = F.cross_entropy(start_logits, positions[0], ignore_index=length)
            end_loss = F.cross_entropy(end_logits, positions[1], ignore_index=length)
            loss = (start_loss + end_loss) / 2
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)


class MultipleChoiceHead(Head):
    """Multiple choice (``BertForMultipleChoice``): inputs ``[b, c, q]`` are flattened to ``[b·c, q]``, each
    choice scored by one logit from its pooled output, and the scores reshaped to ``[b, c]``."""

    needs_pooler = True
    _flattened: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "token_type_ids", "position_ids")

    def __init__(self, *, hidden_size: int, classifier_dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(classifier_dropout)
        self.classifier = nn.Linear(hidden_size, 1)

    def prepare_inputs(self, inputs: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        ids, embeds = inputs.get("input_ids"), inputs.get("inputs_embeds")
        if ids is not None and ids.dim() != 3:
            raise ValueError(
                f"multiple choice input_ids must be 3-D [batch, num_choices, seq]; got shape {tuple(ids.shape)}"
            )
        if embeds is not None and embeds.dim() != 4:
            raise ValueError(
                "multiple choice inputs_embeds must be 4-D [batch, num_choices, seq, hidden]; "
                f"got shape {tuple(embeds.shape)}"
            )
        lead = tuple(ids.shape) if ids is not None else tuple(embeds.shape[:3]) if embeds is not None else None
        out = dict(inputs)
        for name in self._flattened:
            tensor = inputs.get(name)
            if tensor is None:
                continue
            if lead is not None and tuple(tensor.shape) != lead:
                raise ValueError(
                    f"multiple choice {name} must have the input's shape {lead} [batch, num_choices, seq]; "
                    f"got {tuple(tensor.shape)}"
                )
            out[name] = tensor.reshape(-1, tensor.shape[-1])  # [b·c, q]
        if embeds is not None:
            out["inputs_embeds"] = embeds.reshape(-1, *embeds.shape[-2:])  # [b·c, q, H]
        return out

    def forward(
        self, output: ModelOutputWithPooling, labels: Mapping[str, torch.Tensor], batch_shape: tuple[int, ...]
    ) -> MultipleChoiceModelOutput:
        scores = self.classifier(self.dropout(_pooled(output, "multiple_choice")))  # [b·c, 1]
        b, c = batch_shape
        logits = scores.view(b, c)
        loss = None
        if "labels" in labels:
            check_class_labels("labels", labels["labels"], ((b,),), c, "the index of the right choice per example")
            loss = F.cross_entropy(logits, labels["labels"])
        return MultipleChoiceModelOutput(loss=loss, logits=logits)


# ------------------------------------------------------------------------------------------- factories
# Every head factory receives the same keywords (see the module docstring) and takes what it needs.
def _language_model(cls: type[_LanguageModelHead] | type[PreTrainingHead]) -> Callable[..., Head]:
    """The factory of a head built on HF's ``cls.predictions`` (masked LM, causal LM, pre-training)."""

    def factory(
        *,
        hidden_size: int,
        vocab_size: int,
        activation: Callable[[], nn.Module],
        layer_norm_eps: float,
        tie_word_embeddings: bool,
        options: BaseModel,
        **_: Any,
    ) -> Head:
        return cls(
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            activation=activation(),
            layer_norm_eps=layer_norm_eps,
            tie=tie_word_embeddings,
        )

    return factory


def _next_sentence(*, hidden_size: int, options: BaseModel, **_: Any) -> NextSentenceHead:
    return NextSentenceHead(hidden_size=hidden_size)


def _sequence_classification(
    *, hidden_size: int, num_labels: int, classifier_dropout: float, options: BaseModel, **_: Any
) -> SequenceClassificationHead:
    return SequenceClassificationHead(
        hidden_size=hidden_size, num_labels=num_labels, classifier_dropout=classifier_dropout
    )


def _token_classification(
    *, hidden_size: int, num_labels: int, classifier_dropout: float, options: BaseModel, **_: Any
) -> TokenClassificationHead:
    return TokenClassificationHead(
        hidden_size=hidden_size, num_labels=num_labels, classifier_dropout=classifier_dropout
    )


def _question_answering(*, hidden_size: int, num_labels: int, options: BaseModel, **_: Any) -> QuestionAnsweringHead:
    return QuestionAnsweringHead(hidden_size=hidden_size, num_labels=num_labels)


def _multiple_choice(
    *, hidden_size: int, classifier_dropout: float, options: BaseModel, **_: Any
) -> MultipleChoiceHead:
    return MultipleChoiceHead(hidden_size=hidden_size, classifier_dropout=classifier_dropout)


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "head",
            "masked_lm",
            _language_model(MaskedLMHead),
            NoOptions,
            "masked-LM logits (BertForMaskedLM)",
            architecture="BertForMaskedLM",
        ),
        Component(
            "head",
            "next_sentence",
            _next_sentence,
            NoOptions,
            "BertForNextSentencePrediction",
            architecture="BertForNextSentencePrediction",
        ),
        Component(
            "head",
            "pretraining",
            _language_model(PreTrainingHead),
            NoOptions,
            "masked LM + NSP (BertForPreTraining)",
            architecture="BertForPreTraining",
        ),
        Component(
            "head",
            "causal_lm",
            _language_model(CausalLMHead),
            NoOptions,
            "next-token logits (BertLMHeadModel)",
            architecture="BertLMHeadModel",
        ),
        Component(
            "head",
            "sequence_classification",
            _sequence_classification,
            NoOptions,
            "classification / regression on the pooled output (BertForSequenceClassification)",
            architecture="BertForSequenceClassification",
        ),
        Component(
            "head",
            "token_classification",
            _token_classification,
            NoOptions,
            "per-token classes (BertForTokenClassification)",
            architecture="BertForTokenClassification",
        ),
        Component(
            "head",
            "question_answering",
            _question_answering,
            NoOptions,
            "start/end span logits (BertForQuestionAnswering)",
            architecture="BertForQuestionAnswering",
        ),
        Component(
            "head",
            "multiple_choice",
            _multiple_choice,
            NoOptions,
            "one score per choice (BertForMultipleChoice)",
            architecture="BertForMultipleChoice",
        ),
    ]
