"""The built-in heads: every registered name, its options, what it outputs, and transformers' class for it.

The composition a name builds is the module attribute of the same name: :mod:`.bert` (BERT's heads, each with
transformers' class name, which a checkpoint's ``architectures`` lists), :mod:`.task_heads` (RoBERTa's,
ELECTRA's, ALBERT's, DistilBERT's), :mod:`.transform_heads` (ModernBERT's) and :mod:`.retrieval` (SPLADE, ColBERT,
BGE-M3). They register through the same hook a third-party plugin uses.
"""

from __future__ import annotations

from bertblocks.core.component import Component, NoOptions

from . import bert, linear_heads, retrieval, task_heads, transform_heads
from .bert import MaskedLMOptions
from .composition import head_component
from .linear_heads import DensePooledOptions, LinearLMOptions
from .retrieval import BGEM3Options, ColBERTOptions, SpladeOptions
from .task_heads import DenseClassificationOptions, GeluLMOptions, GeluMaskedLMOptions
from .transform_heads import TransformLMOptions, TransformOptions, TransformPoolingOptions

#: BERT's heads: name → (what it outputs, transformers' class); only ``masked_lm`` takes options (BERT_OPTIONS)
BERT_HEADS = {
    "masked_lm": ("masked-LM logits", "BertForMaskedLM"),
    "next_sentence": ("is B the sentence after A: two logits", "BertForNextSentencePrediction"),
    "pretraining": ("masked LM + NSP", "BertForPreTraining"),
    "causal_lm": ("next-token logits", "BertLMHeadModel"),
    "sequence_classification": ("classification / regression on the pooled output", "BertForSequenceClassification"),
    "token_classification": ("per-token classes", "BertForTokenClassification"),
    "question_answering": ("start/end span logits", "BertForQuestionAnswering"),
    "multiple_choice": ("one score per choice", "BertForMultipleChoice"),
}

#: the options of the BERT heads that take any
BERT_OPTIONS = {"masked_lm": MaskedLMOptions}

#: the other families' heads: name → (module of the composition, options, description)
FAMILY_HEADS = {
    "masked_lm_gelu": (task_heads, GeluMaskedLMOptions, "masked LM, gelu transform (RoBERTa, ELECTRA generator)"),
    "causal_lm_gelu": (task_heads, GeluLMOptions, "causal LM, gelu transform (RoBERTa, ELECTRA)"),
    "sentence_order_pretraining": (task_heads, GeluLMOptions, "masked LM + sentence order (AlbertForPreTraining)"),
    "dense_classification": (task_heads, DenseClassificationOptions, "first token → dense → act → out_proj"),
    "dense_multiple_choice": (task_heads, DenseClassificationOptions, "one score per choice through out_proj"),
    "replaced_token_detection": (task_heads, NoOptions, "ELECTRA's discriminator: one logit per token"),
    "last_position_multiple_choice": (
        task_heads,
        NoOptions,
        "one score per choice from its last position, padding or not (RoFormerForMultipleChoice)",
    ),
    "feedforward_question_answering": (
        task_heads,
        NoOptions,
        "feed-forward block → start/end span logits, the question left out (BigBirdForQuestionAnswering)",
    ),
    "transform_masked_lm": (transform_heads, TransformLMOptions, "transform → vocabulary (ModernBertForMaskedLM)"),
    "transform_classification": (transform_heads, TransformPoolingOptions, "pool → transform → classifier"),
    "transform_token_classification": (transform_heads, TransformOptions, "transform → per-token classifier"),
    "transform_question_answering": (transform_heads, TransformOptions, "transform → start/end span logits"),
    "transform_multiple_choice": (transform_heads, TransformPoolingOptions, "each choice pooled → transform → a score"),
    "linear_masked_lm": (linear_heads, LinearLMOptions, "one linear map onto the vocabulary (EuroBERT, NeoBERT)"),
    "causal_lm_linear": (
        linear_heads,
        LinearLMOptions,
        "causal LM, one linear map onto the vocabulary (BertGeneration)",
    ),
    "dense_pooled_classification": (linear_heads, DensePooledOptions, "pool → dense → act → classifier, or late"),
    "splade": (retrieval, SpladeOptions, "SPLADE: max over tokens of log(1 + relu(MLM logits)), [b, vocab]"),
    "colbert": (retrieval, ColBERTOptions, "ColBERT: normalised per-token vectors and their mask"),
    "bge_m3": (retrieval, BGEM3Options, "BGE-M3: dense, sparse lexical weights and ColBERT vectors"),
}


def bertblocks_register_components() -> list[Component]:
    return [
        *(
            head_component(n, getattr(bert, n), f"{what} ({cls})", BERT_OPTIONS.get(n, NoOptions))
            for n, (what, cls) in BERT_HEADS.items()
        ),
        *(head_component(n, getattr(module, n), text, options) for n, (module, options, text) in FAMILY_HEADS.items()),
    ]
