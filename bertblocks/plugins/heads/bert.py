"""BERT's task heads as compositions: masked LM, causal LM, next sentence, pre-training, sequence and token
classification, QA and multiple choice, with transformers' module names (so checkpoint keys are HF's) and
transformers' losses.

Every head factory receives the same keyword arguments (:class:`~.composition.HeadArguments`, documented in
``docs/how-to/task-heads.md``). Sizes, labels, dropout and tying are config fields, as in HF (``num_labels``,
``problem_type``, ``classifier_dropout``, ``tie_word_embeddings``); the one head option is ``masked_lm``'s opt-in
``sparse_prediction`` (:class:`MaskedLMOptions`), which transformers' class does not have.
"""

from __future__ import annotations

from functools import partial

from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from bertblocks.core.outputs import (
    BertForPreTrainingOutput,
    CausalLMOutputWithCrossAttentions,
    MaskedLMOutput,
    ModelOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from ...errors import InputError
from .composition import Branch, ComposedHead, HeadArguments
from .losses import CrossEntropy, Loss, ProblemTypeLoss, SpanLoss, SumOfLosses
from .pooling import Pooling
from .projections import LMPrediction
from .transforms import BERT_TRANSFORM, Steps, dense_act_norm

# ------------------------------------------------------------------------------------------------ losses
MASKED_LM_LOSS = CrossEntropy()
#: transformers 5's ``ForCausalLMLoss``: logits upcast to float32, labels shifted left by one
CAUSAL_LM_LOSS = CrossEntropy(shift=True, upcast=True)
TOKEN_LOSS = CrossEntropy(what="one class per token [batch, seq] or -100")
CHOICE_LOSS = CrossEntropy(labels_per="choice", what="the index of the right choice per example")
NEXT_SENTENCE_LOSS = CrossEntropy(labels_per="example", what="0 = B continues A, 1 = B is random")
PRETRAINING_LOSS = SumOfLosses(
    (
        CrossEntropy(field="prediction_logits"),
        CrossEntropy(
            field="seq_relationship_logits",
            label="next_sentence_label",
            labels_per="example",
            what="0 = continues, 1 = random",
        ),
    )
)


# ------------------------------------------------------------------------------------------------ options
class MaskedLMOptions(BaseModel):
    """Options of the masked-LM heads (``masked_lm``; ``masked_lm_gelu`` adds its own to these)."""

    model_config = ConfigDict(extra="forbid")

    sparse_prediction: bool = Field(
        False,
        description="with labels, run the decoder only on positions whose label is not -100: the loss is the "
        "dense one, the logits are [n_labelled, vocab] (ModernBERT's option; off keeps transformers' output)",
    )


#: the label that marks a position unscored (transformers' ignore_index)
IGNORE_INDEX = -100


def sparse_index(options: object) -> int | None:
    """The branch's ``sparse_ignore_index`` for a head's options: -100 when it asks for sparse prediction."""
    return IGNORE_INDEX if getattr(options, "sparse_prediction", False) else None


# ----------------------------------------------------------------------------------------- compositions
def lm_prediction(a: HeadArguments, activation: nn.Module, width: int | None = None) -> LMPrediction:
    """HF's ``cls.predictions``: BERT's transform (to ``width``, default hidden) and the vocabulary decoder."""
    width = width or a.hidden_size
    transform = dense_act_norm(a.hidden_size, activation, a.layer_norm_eps, BERT_TRANSFORM, width=width)
    return LMPrediction(transform, width, a.vocab_size, tie=a.tie_word_embeddings)


def language_model(
    name: str, a: HeadArguments, *, causal: bool, activation: nn.Module | None = None, width: int | None = None
) -> ComposedHead:
    """Every position → ``cls.predictions`` → vocabulary logits; masked-LM or shifted causal-LM loss.

    Args:
        name: the registered name.
        a: the factory's arguments.
        causal: predict token ``i + 1`` at position ``i`` (``BertLMHeadModel``).
        activation: the transform's activation (default: the config's ``hidden_act``).
        width: the transform's output width (ELECTRA's generator narrows to ``embedding_size``).
    """
    predictions = lm_prediction(a, activation or a.activation(), width)
    output: type[ModelOutput] = CausalLMOutputWithCrossAttentions if causal else MaskedLMOutput
    # sparse prediction (masked LM only: the causal loss shifts labels along the sequence) reuses the branch
    # option ModernBERT's head uses, so both gather the labelled positions in one place
    sparse = None if causal else sparse_index(a.options)
    return ComposedHead(
        name,
        modules={"cls": Steps(("predictions", predictions))},  # HF's BertOnlyMLMHead
        branches=(Branch(("logits",), "none", ("cls",), sparse_ignore_index=sparse),),
        loss=CAUSAL_LM_LOSS if causal else MASKED_LM_LOSS,
        output=output,
    )


def dropout_classifier(
    name: str,
    a: HeadArguments,
    *,
    pooling: Pooling,
    loss: Loss,
    output: type[ModelOutput],
    transform: nn.Module | None = None,
    choices: bool = False,
) -> ComposedHead:
    """``classifier(dropout([transform](pool(h))))``: BERT's classification heads (and, with a transform,
    ModernBERT's): ``num_labels`` logits per pooled vector, or with ``choices`` one score per choice."""
    modules: dict[str, nn.Module] = {"dropout": nn.Dropout(a.classifier_dropout)}
    modules["classifier"] = nn.Linear(a.hidden_size, 1 if choices else a.num_labels)
    steps: tuple[str, ...] = ("dropout", "classifier")
    if transform is not None:
        modules["transform"] = transform
        steps = ("transform", *steps)
    return ComposedHead(
        name,
        modules=modules,
        branches=(Branch(("logits",), pooling, steps),),
        loss=loss,
        output=output,
        choices=choices,
    )


def span_head(name: str, a: HeadArguments, transform: nn.Module | None = None) -> ComposedHead:
    """Extractive QA: ``qa_outputs`` on every position ([transform → dropout] first), split into start and end
    logits; :class:`~.losses.SpanLoss`.

    Raises:
        ValueError: ``num_labels`` is not 2.
    """
    if a.num_labels != 2:
        raise InputError(
            f"the {name} head needs num_labels = 2 (start and end logits); the config has num_labels = {a.num_labels}"
        )
    modules: dict[str, nn.Module] = {"qa_outputs": nn.Linear(a.hidden_size, 2)}
    steps: tuple[str, ...] = ("qa_outputs",)
    if transform is not None:
        modules.update(transform=transform, dropout=nn.Dropout(a.classifier_dropout))
        steps = ("transform", "dropout", *steps)
    return ComposedHead(
        name,
        modules=modules,
        branches=(Branch(("start_logits", "end_logits"), "none", steps, split=True),),
        loss=SpanLoss(),
        output=QuestionAnsweringModelOutput,
        reads_padded_positions=True,  # the start/end softmax spans padding too, as HF's
    )


def next_sentence(name: str, a: HeadArguments) -> ComposedHead:
    """The pooled output → ``cls.seq_relationship``: does sentence B follow A (two logits)."""
    return ComposedHead(
        name,
        modules={"cls": Steps(("seq_relationship", nn.Linear(a.hidden_size, 2)))},  # HF's BertOnlyNSPHead
        branches=(Branch(("logits",), "pooler", ("cls",)),),
        loss=NEXT_SENTENCE_LOSS,
        output=NextSentencePredictorOutput,
    )


def pretraining(name: str, a: HeadArguments) -> ComposedHead:
    """Masked LM on every position plus next-sentence logits from the pooled output; the loss is their sum."""
    cls = nn.ModuleDict(  # HF's BertPreTrainingHeads
        {"predictions": lm_prediction(a, a.activation()), "seq_relationship": nn.Linear(a.hidden_size, 2)}
    )
    return ComposedHead(
        name,
        modules={"cls": cls},
        branches=(
            Branch(("prediction_logits",), "none", ("cls.predictions",)),
            Branch(("seq_relationship_logits",), "pooler", ("cls.seq_relationship",)),
        ),
        loss=PRETRAINING_LOSS,
        output=BertForPreTrainingOutput,
    )


# ------------------------------------------------------------ the registered compositions (see .catalog)
masked_lm = partial(language_model, causal=False)
causal_lm = partial(language_model, causal=True)
sequence_classification = partial(
    dropout_classifier, pooling="pooler", loss=ProblemTypeLoss(), output=SequenceClassifierOutput
)
token_classification = partial(dropout_classifier, pooling="none", loss=TOKEN_LOSS, output=TokenClassifierOutput)
multiple_choice = partial(
    dropout_classifier, pooling="pooler", loss=CHOICE_LOSS, output=MultipleChoiceModelOutput, choices=True
)
question_answering = span_head
