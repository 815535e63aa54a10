"""The transformers side of the family tests, in one place: a table of families (transformers' config class, tiny
settings, padding index, the head classes to compare, the family's tokenizer, and which shared tests the row
joins), a checkpoint saved by transformers' own class, a padded batch with labels of each head's kind, the
comparison of two outputs at the float32 parity tolerance, and the whole load → compare → save →
reload-in-transformers round trip that every family and head goes through.

Imported by the test modules of this folder (``from tests.families.reference import ...``); it holds no tests.

How a new family joins the table: add one row to :data:`FAMILIES` (nothing else in this folder lists families).
For example (the fields after ``classes`` are optional, each one a shared test the row joins)::

    "roformer": Family(
        "RoFormerConfig",                       # transformers' config class (its model_type is the family's)
        {**COMMON, ...},                        # tiny settings: choose values far from the defaults (a rope base,
                                                # an eps), so that a field read wrongly changes the numbers
        pad=0,                                  # what padded positions hold (the tokenizer's pad id)
        classes=_classes("RoFormer", "Model", "ForMaskedLM", *_TASKS),  # backbone first, then every head class
                                                # transformers has (check ``dir(transformers)``)
        config_fields=("rotary_value", ...),    # fields transformers must read back unchanged
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "RoFormerTokenizer"),  # the per-family paths
        tokenizer_convention=True,              # its template from model_type alone, as transformers'
        both_paddings=True,                     # positions enter as differences only (rotary, relative)
        hidden_states="RoFormerForMaskedLM",    # hidden states and eager attention probabilities, layer by layer
        in_memory_key=None,                     # (class, key) if transformers renames tensors in memory
        refusals=(({"rotary_value": True}, "rotary_value"), ...),  # config.json it cannot represent
        presets=("roformer-...",),              # its presets
    ),

The tokenizer is trained in the test: ``tests/families/test_tokenizers.py``'s trainers (WordPiece, BPE, Unigram and
their families' post-processors) or one of the family's kind written here (:func:`deberta_unigram`).

Then, with no other edit:

* ``test_parity.py`` runs the round trip for each of ``classes`` (transformers' checkpoint loads with no missing or
  unexpected keys and gives its numbers; bertblocks' save loads back in transformers), and each shared test the
  row opts into (``both_paddings``, ``hidden_states``, ``in_memory_key``, ``refusals``, ``tokenizer_convention``,
  ``presets``: see :class:`Family`);
* ``test_family_paths.py`` runs, on the backbone of the row that has a ``tokenizer``, the packed encoder path,
  ``torch.compile`` (one graph), sentence embeddings and ``bertblocks embed``/``similarity`` with the family's
  tokenizer, the CLI (validate, build, diagram, trace, convert) and an ablation study;
* ``tests/test_quantize.py`` quantizes each class of the row.

A path that cannot apply to the family is not left out silently: assert what really happens there (the exact
fallback, or the clear error) in the family's own test file. A variant of a family (other settings that matter,
such as ``gte-ntk`` or ``modernbert-biased``) is a further row, usually with fewer classes; one row per family has
the ``tokenizer`` (GTE's is ``gte-ntk``, so that the paths run its NTK-scaled rope). What only one family does (a
format transformers has no class for, its float64 reference, gradients, dropout) stays in ``test_<family>.py``.

A family transformers has no class for (remote code only) cannot be a row: its file tests it against a float64
reference of the published equations, and it joins the per-family paths as one row of ``REMOTE`` in
``test_family_paths.py`` (its tokenizer, and a function of its test file that writes a published-format checkpoint
and returns that reference as a module; GTE's ``new`` format is the example).
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import json
import logging
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import bertblocks
from tests.conftest import TINY_HF, to_device
from tests.families import test_tokenizers as toks

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


#: GTE (transformers' gte) at test size: a rope base far from the default 160000 and two token types (the second
#: segment from position 3), so that a base read wrongly or a token-type table skipped changes the numbers
GTE: dict[str, Any] = {
    **COMMON,
    "pad_token_id": 1,
    "type_vocab_size": 2,
    "rope_parameters": {"rope_theta": 30.0, "rope_type": "default"},
}
#: gte-base-en-v1.5's shape: no token-type table, and NTK-scaled rope as transformers' GteConfig states it (linear
#: scaling of the base θ·k by k^(2/d): the fixed-NTK frequencies), so that the scaled tables run every path
GTE_NTK: dict[str, Any] = {
    **GTE,
    "type_vocab_size": 0,
    "rope_parameters": {"rope_theta": 400.0, "rope_type": "linear", "factor": 1.5},
}


#: ESM-2's settings at test size (rotary positions, token dropout, no LayerNorm before the stack; mask token 4, which
#: :func:`batch` puts in every row), a rope base far from the default so that a base read wrongly changes the numbers
ESM2: dict[str, Any] = {
    **COMMON,
    "pad_token_id": 1,
    "mask_token_id": 4,
    "position_embedding_type": "rotary",
    "token_dropout": True,
    "emb_layer_norm_before": False,
    "rope_theta": 50.0,
}
ESM_FIELDS = ("position_embedding_type", "token_dropout", "emb_layer_norm_before", "mask_token_id", "rope_theta")


#: EuroBERT at test size: a rope base far from the default (a base read wrongly changes the numbers), SwiGLU; Llama-3's
#: specials at the ids of :func:`eurobert_bpe` (padding is <|end_of_text|>, as in the published models)
EUROBERT: dict[str, Any] = {
    "vocab_size": COMMON["vocab_size"],
    "hidden_size": COMMON["hidden_size"],
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "initializer_range": 0.2,
    "rms_norm_eps": 1e-5,
    "num_labels": 3,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 1,
    "mask_token_id": 2,
    "rope_parameters": {"rope_theta": 50.0, "rope_type": "default"},
}
EUROBERT_FIELDS = ("rope_parameters", "classifier_pooling", "num_key_value_heads", "mlp_bias", "tie_word_embeddings")
#: what EuroBERT's config.json can say and bertblocks does not build, each refused naming the field
EUROBERT_REFUSED = (
    ({"head_dim": 16}, "head_dim=16"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
    ({"rope_parameters": {"rope_theta": 10.0, "rope_type": "linear", "factor": 2.0}}, "rope_type"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_theta": [1.0], "rope_type": "default"}}, "rope_theta must be a number"),
    ({"head_dim": "8"}, "head_dim='8'"),
    ({"classifier_pooling": ["late"]}, "classifier_pooling=['late']"),
    ({"classifier_pooling": "max"}, "classifier_pooling='max'"),
    ({"is_decoder": True}, "is_decoder=True"),
    ({"clf_pooling": "bos", "classifier_pooling": "mean"}, "clf_pooling='bos'"),
    ({"architectures": ["EuroBertForQuestionAnswering"]}, "EuroBertForQuestionAnswering exists only"),
    ({"auto_map": {"AutoModel": "modeling_other.OtherModel"}}, "modeling_other.OtherModel"),
    ({"bertblocks": {"embedding": {"norm": True}}}, "embedding.norm"),
)


def eurobert_bpe() -> Tokenizer:
    """EuroBERT's kind: Llama-3's byte-level BPE with its specials (<|begin_of_text|> 0, <|end_of_text|> 1, which
    also pads, <|mask|> 2)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(toks.CORPUS, trainer)
    return tok


def eurobert_processor(tok: Tokenizer) -> processors.TemplateProcessing:
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    return processors.TemplateProcessing(
        single="<|begin_of_text|> $A <|end_of_text|>",
        pair="<|begin_of_text|> $A <|end_of_text|> $B <|end_of_text|>",
        special_tokens=[("<|begin_of_text|>", bos), ("<|end_of_text|>", eos)],
    )


def deberta_unigram() -> Tokenizer:
    """DeBERTa-v3's kind: a SentencePiece-style Unigram with BERT's special tokens at DeBERTa-v3's ids ([PAD] 0,
    [CLS] 1, [SEP] 2, [UNK] 3; its [MASK] is last in the published vocabulary, here after them)."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    tok.train_from_iterator(
        toks.CORPUS, trainers.UnigramTrainer(vocab_size=150, special_tokens=specials, unk_token="[UNK]")
    )
    return tok


@dataclasses.dataclass(frozen=True)
class Tokenizing:
    """A family's tokenizer, as the tests make one: a tokenizer.json of the family's kind trained in the test, the
    family's post-processor, and transformers' tokenizer class of the family (what the reference ids come from).

    Attributes:
        train: trains the tokenizer (WordPiece, BPE or Unigram; no post-processor).
        processor: the family's post-processor (its single and pair templates) for that tokenizer.
        tokenizer_class: transformers' tokenizer class of the family (ElectraTokenizer is BertTokenizer in 5.x).
        special_tokens: written into tokenizer_config.json, as a family whose tokenizer class is the generic one
            (ModernBERT's ``PreTrainedTokenizerFast``) has them.
        vocab_txt: the family's checkpoints ship a ``vocab.txt`` and no ``tokenizer.json`` (ESM's): the trained
            vocabulary is written so (:func:`save_tokenizer`), and both tokenizers split text their family's way.
        texts: texts of the family's kind for the per-family paths and the convention (ESM's: protein
            sequences, very different lengths); ``None``: the English test texts.
    """

    train: Callable[[], Tokenizer]
    processor: Callable[[Tokenizer], processors.PostProcessor]
    tokenizer_class: str
    special_tokens: dict[str, str] | None = None
    vocab_txt: bool = False
    texts: tuple[str, ...] | None = None


def save_tokenizer(directory: Path, tokenizing: Tokenizing, tok: Tokenizer) -> Path:
    """``tok`` written as the family ships it: ``tokenizer.json`` (or, for ``vocab_txt``, its vocabulary as
    ``vocab.txt``, line i = id i) and ``tokenizer_config.json`` naming transformers' tokenizer class (with the
    family's ``special_tokens``)."""
    toks.save(directory, tok, tokenizing.tokenizer_class)
    if tokenizing.vocab_txt:
        (directory / "tokenizer.json").unlink()
        vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
        assert [i for _, i in vocab] == list(range(len(vocab)))
        (directory / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in vocab))
    if tokenizing.special_tokens:
        settings = json.loads((directory / "tokenizer_config.json").read_text())
        settings.update(tokenizing.special_tokens)
        (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory


#: ESM-2's vocabulary as its vocab.txt lists it (the specials, the residues, gaps, <null_1>, <mask>)
ESM_VOCAB = ("<cls>", "<pad>", "<eos>", "<unk>", *"LAGVSERTIDPKQNFYMHWCXBUZO.-", "<null_1>", "<mask>")
#: protein sequences of very different lengths (a third of a padded batch is padding), one with an unknown residue
PROTEINS = ("MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPVAJ", "MKV", "ACDEFGHIKLMNPQRSTVWY")


def esm_vocabulary() -> Tokenizer:
    """ESM's vocabulary (its ids are the line numbers of vocab.txt: nothing to train)."""
    return Tokenizer(models.WordLevel({token: i for i, token in enumerate(ESM_VOCAB)}, unk_token="<unk>"))


def esm_processor(tok: Tokenizer) -> processors.TemplateProcessing:
    cls, eos = tok.token_to_id("<cls>"), tok.token_to_id("<eos>")
    return processors.TemplateProcessing(
        single="<cls> $A <eos>", pair="<cls> $A <eos> $B <eos>", special_tokens=[("<cls>", cls), ("<eos>", eos)]
    )


#: X-MOD at test size: three languages, a narrow bottleneck, the default language not the first
XMOD: dict[str, Any] = {
    **COMMON,
    "type_vocab_size": 1,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "languages": ["en_XX", "de_DE", "fr_XX"],
    "default_language": "de_DE",
    "adapter_reduction_factor": 4,
}
XMOD_FIELDS = (
    "languages",
    "default_language",
    "adapter_reduction_factor",
    "adapter_layer_norm",
    "adapter_reuse_layer_norm",
    "ln_before_adapter",
    "pre_norm",
)


def xmod_languages(shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """X-MOD's ``lang_ids`` for ids of ``shape``: one language per sequence, the rows' differing (fr, en, de, …);
    for multiple choice ``[b, c, L]`` one for all, the form transformers' ``XmodForMultipleChoice`` repeats."""
    if len(shape) == 3:
        return {"lang_ids": torch.tensor([2])}
    return {"lang_ids": torch.tensor([(2 + row) % 3 for row in range(shape[0])])}


#: LayoutLM's 2-D grid at test size (max_2d_position_embeddings): boxes span all of it
LAYOUTLM_GRID = 64


def layoutlm_boxes(shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """LayoutLM's ``bbox`` for ids of ``shape``: a box ``x0, y0, x1, y1`` per token on the test grid, corners and
    sizes varied (zero-width and full-page boxes among them), as a document's words give."""
    g = torch.Generator().manual_seed(2)
    corner = torch.randint(0, LAYOUTLM_GRID, (*shape, 2), generator=g)
    size = torch.randint(0, LAYOUTLM_GRID, (*shape, 2), generator=g)
    far = torch.minimum(corner + size, torch.tensor(LAYOUTLM_GRID - 1))
    boxes = torch.cat([corner, far], dim=-1)
    boxes[..., 0, :] = torch.tensor([0, 0, LAYOUTLM_GRID - 1, LAYOUTLM_GRID - 1])  # [CLS]: the whole page
    return {"bbox": boxes}


def longformer_globals(shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Longformer's ``global_attention_mask`` for ids of ``shape``: the first token global, as transformers' sequence
    classifier makes it when none is given, and one more position per row, so that the global projections count."""
    mask = torch.zeros(shape, dtype=torch.long)
    mask[..., 0] = 1
    mask[..., shape[-1] // 3] = 1
    return {"global_attention_mask": mask}


#: (change to config.json, the error message's pattern): one refusal of a family (see :attr:`Family.refusals`)
Refusal = tuple[dict[str, Any], str]


@dataclasses.dataclass(frozen=True)
class Family:
    """One row of the table: a transformers family at test size, and which shared tests it takes part in.

    The first group of attributes says how to build and compare the family (every row goes through the round
    trip of ``test_parity.py`` on each of its ``classes``); the second says which of the shared tests beyond it
    the row joins: each defaults to "not this one", so that a row states only what applies to it.

    Attributes:
        config: transformers' config class of the family.
        settings: its tiny settings.
        pad: the padding index (what padded positions hold).
        token_types: whether the batch carries ``token_type_ids``.
        classes: the transformers classes (backbone first, then heads) compared in the round trip.
        length: the batch's sequence length.
        real: real tokens in the padded (second) row.
        second_segment: from this position the token types are 1, so that the token-type table is read.
        config_fields: config fields transformers must read back unchanged from bertblocks' config.json.
        tokenizer: the family's tokenizer; with it, the row's backbone (``classes[0]``) runs every per-family path
            of ``test_family_paths.py`` (packing, compile, sentence embeddings, CLI, ablation study). One row per
            family sets it (a family's variants, such as ``modernbert-biased``, leave it out).
        tokenizer_convention: ``test_parity.py`` checks that ``tokenizer``'s files without a post-processor get the
            family's template from config.json's ``model_type`` alone, with transformers' ids.
        both_paddings: the padded and packed paths agree with transformers under right and left padding (families
            whose positions enter only as differences: rotary, DeBERTa's relative table).
        hidden_states: the class whose hidden states (and, with ``attentions``, attention probabilities under the
            eager backend) are compared layer by layer.
        attentions: whether ``hidden_states`` compares attention probabilities too.
        in_memory_key: ``(class, a key)``: the class's checkpoint saved under transformers' in-memory names
            (``save_original_format=False``; the key is one of them) loads and gives its numbers.
        refusals: config.json changes the family cannot represent, each with the pattern of the error that names
            the field (tested on config.json as transformers writes it and as a sparse one).
        presets: presets of the family (tests/families/test_presets.py builds each against transformers).
        mask_token: put at positions 2 of the first row and 1 and 3 of the padded one by :func:`batch`, so that
            a family that rescales by the share of mask tokens (ESM's token dropout) does so in every row.
        sep_token: frames every row (every choice) as a question and a context, RoBERTa's ``<s> q </s></s> c </s>``:
            this id at positions 2 and 3 and at the last real position (three per row, as transformers' Longformer
            asks), so that the task classes that find the question through ``sep_token_id`` (Longformer's global
            tokens, BigBird's question mask) find it; a QA batch's answers then start after the question.
        chooses_inputs: class-name endings of the heads that choose :attr:`extra_inputs` themselves when a call
            gives none (Longformer's classifiers): :func:`batch` gives them none, so that transformers' choice and
            bertblocks' are compared.
        extra_inputs: the inputs beyond BERT's that the family's classes take (LayoutLM's ``bbox``), made for the
            shape of ``input_ids``: :func:`batch` adds them (so every shared test that takes its batch feeds them,
            to the backbone too), and ``test_family_paths.py`` adds them to the padded batch of its packing and
            compile tests (its sentence embeddings and CLI run on token ids alone, the tokenizer's output).
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
    tokenizer: Tokenizing | None = None
    tokenizer_convention: bool = False
    both_paddings: bool = False
    hidden_states: str | None = None
    attentions: bool = True
    in_memory_key: tuple[str, str] | None = None
    refusals: tuple[Refusal, ...] = ()
    presets: tuple[str, ...] = ()
    mask_token: int | None = None
    sep_token: int | None = None
    chooses_inputs: tuple[str, ...] = ()
    extra_inputs: Callable[[tuple[int, ...]], dict[str, torch.Tensor]] | None = None

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
#: the post-processor and special tokens of a family whose tokenizer class is the generic one (ModernBERT)
_BERT_SPECIALS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}

#: the generic tokenizer class EuroBERT's tokenizer_config.json names, with Llama-3's specials and EuroBERT's mask
_EUROBERT_SPECIALS = {
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|end_of_text|>",
    "pad_token": "<|end_of_text|>",
    "mask_token": "<|mask|>",
}

FAMILIES: dict[str, Family] = {
    "roberta": Family(
        "RobertaConfig",
        {**COMMON, "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
        pad=1,
        classes=_classes("Roberta", *_ROBERTA_HEADS),
        tokenizer=Tokenizing(toks.bpe, toks.roberta_processor, "RobertaTokenizer"),
    ),
    "xlm-roberta": Family(
        "XLMRobertaConfig",
        {**COMMON, "type_vocab_size": 1, "pad_token_id": 1},
        pad=1,
        classes=_classes("XLMRoberta", *_ROBERTA_HEADS),
        tokenizer=Tokenizing(toks.unigram, toks.xlmr_processor, "XLMRobertaTokenizer"),
    ),
    "camembert": Family(
        "CamembertConfig",
        {**COMMON, "type_vocab_size": 1, "pad_token_id": 1},
        pad=1,
        classes=_classes("Camembert", *_ROBERTA_HEADS),
        tokenizer=Tokenizing(toks.unigram, toks.xlmr_processor, "CamembertTokenizer"),
    ),
    "electra": Family(
        "ElectraConfig",
        {**COMMON, "embedding_size": 16},
        pad=0,
        classes=_classes("Electra", "Model", "ForPreTraining", "ForMaskedLM", "ForCausalLM", *_TASKS),
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "ElectraTokenizer"),
    ),
    "distilbert": Family(
        "DistilBertConfig",
        DISTILBERT,
        pad=0,
        token_types=False,
        classes=_classes("DistilBert", "Model", "ForMaskedLM", *_TASKS),
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "DistilBertTokenizer"),
    ),
    "albert": Family(
        "AlbertConfig",
        {**COMMON, "embedding_size": 16, "hidden_act": "gelu_new"},
        pad=0,
        classes=_classes("Albert", "Model", "ForPreTraining", "ForMaskedLM", *_TASKS),
        tokenizer=Tokenizing(toks.albert_unigram, toks.bert_processor, "AlbertTokenizer"),
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
        tokenizer=Tokenizing(toks.mpnet_wordpiece, toks.roberta_processor, "MPNetTokenizer"),
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
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "BertTokenizer"),
        tokenizer_convention=True,
        both_paddings=True,
        hidden_states="NomicBertForSequenceClassification",
        in_memory_key=("NomicBertForMaskedLM", "nomic_bert.layers.0.self_attn.q_proj.weight"),
        refusals=(
            ({"rope_parameters": {"rope_theta": 10.0, "rope_type": "linear", "factor": 2.0}}, "rope_type is 'linear'"),
            ({"head_dim": 16}, "head_dim 16"),
            ({"bertblocks": {"encoder": {"attention": {"fused_qkv": False}}}}, "encoder.attention.fused_qkv"),
            ({"bertblocks": {"position": {"name": "absolute"}}}, "position.name"),
        ),
        presets=("nomic-bert-2048", "nomic-embed-text-v1.5"),
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
        tokenizer=Tokenizing(toks.unigram, toks.xlmr_processor, "XLMRobertaTokenizer"),
        tokenizer_convention=True,
        both_paddings=True,
        hidden_states="JinaEmbeddingsV3ForMaskedLM",
        in_memory_key=("JinaEmbeddingsV3ForSequenceClassification", "roberta.layers.0.self_attn.q_proj.bias"),
        refusals=(
            (
                {"rope_parameters": {"rope_theta": 10.0, "rope_type": "dynamic", "factor": 2.0}},
                "rope_type is 'dynamic'",
            ),
            ({"bertblocks": {"embedding": {"position_offset": "padding"}}}, "embedding.position_offset"),
            ({"bertblocks": {"encoder": {"feedforward": {"name": "glu"}}}}, "encoder.feedforward.name"),
        ),
        presets=("jina-embeddings-v3",),
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
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "PreTrainedTokenizerFast", _BERT_SPECIALS),
        both_paddings=True,
        # the local layers need their sliding-window backend: the default backends, hidden states only
        hidden_states="ModernBertModel",
        attentions=False,
        refusals=(
            ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}}, "rope_type 'linear'"),
            ({"layer_types": ["full_attention"]}, "layer_types must list"),
            ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling is not supported"),
            ({"bertblocks": {"encoder": {"layer": {"name": "post_ln"}}}}, "encoder.layer.name"),
        ),
        presets=("modernbert-base", "modernbert-large"),
    ),
    "deberta-v2": Family(
        "DebertaV2Config",
        DEBERTA_V3,
        pad=0,
        classes=_classes("DebertaV2", "Model", "ForMaskedLM", *_TASKS),
        config_fields=DEBERTA_FIELDS,
        tokenizer=Tokenizing(deberta_unigram, toks.bert_processor, "DebertaV2Tokenizer"),
        tokenizer_convention=True,
        both_paddings=True,
        hidden_states="DebertaV2ForSequenceClassification",
        refusals=(
            ({"conv_kernel_size": 4}, "conv_kernel_size=4"),
            ({"embedding_size": 16}, "embedding_size=16"),
            ({"attention_head_size": 4}, "attention_head_size=4"),
            ({"norm_rel_ebd": "batch_norm"}, "norm_rel_ebd='batch_norm'"),
            ({"relative_attention": False}, "norm_rel_ebd='layer_norm'.*without relative_attention"),
            ({"pos_att_type": ["p2p"]}, "pos_att_type=.*'p2p'"),
            ({"pooler_hidden_size": 16}, "pooler_hidden_size=16"),
            ({"pooler_dropout": 0.1}, "pooler_dropout=0.1"),
            ({"bertblocks": {"position": {"name": "absolute"}}}, "position.name"),
        ),
        presets=("deberta-v3-xsmall", "deberta-v3-small", "deberta-v3-base", "deberta-v3-large", "mdeberta-v3-base"),
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
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "BertTokenizer"),
    ),
    "gte": Family(
        "GteConfig",
        GTE,
        pad=1,
        # transformers has no GteForQuestionAnswering or GteForMultipleChoice
        classes=_classes("Gte", "Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"),
        second_segment=3,
        config_fields=("rope_parameters", "type_vocab_size"),
        tokenizer_convention=True,  # with gte-ntk's tokenizer: the same model_type
        both_paddings=True,
        in_memory_key=("GteForMaskedLM", "gte.layers.0.self_attn.q_proj.weight"),
        refusals=(
            (
                {"rope_parameters": {"rope_theta": 30.0, "rope_type": "dynamic", "factor": 2.0}},
                "rope_type is 'dynamic'",
            ),
            (
                {"rope_parameters": {"rope_theta": 30.0, "rope_type": "linear", "factor": 0.5}},
                "rope_parameters.factor must be a number >= 1",
            ),
            ({"tie_word_embeddings": False, "architectures": ["GteForMaskedLM"]}, "tie_word_embeddings is false"),
            ({"bertblocks": {"position": {"name": "absolute"}}}, "position.name"),
            ({"bertblocks": {"encoder": {"feedforward": {"name": "mlp"}}}}, "encoder.feedforward.name"),
        ),
        presets=("gte-base-en-v1.5", "gte-large-en-v1.5", "gte-multilingual-base"),
    ),
    "gte-ntk": Family(
        "GteConfig",
        GTE_NTK,
        pad=1,
        token_types=False,  # no table; and gte's tokenizer (XLM-R's) returns none
        classes=("GteModel", "GteForMaskedLM"),
        # rope_parameters reads back as the same frequencies, its numbers rounded (test_gte.py checks them)
        config_fields=("type_vocab_size",),
        # gte's convention is XLM-R's (transformers' tokenizer class for gte): a Unigram framed <s> A </s>
        tokenizer=Tokenizing(toks.unigram, toks.xlmr_processor, "XLMRobertaTokenizer"),
        both_paddings=True,
        hidden_states="GteForMaskedLM",
    ),
    "esm": Family(
        "EsmConfig",
        ESM2,
        pad=1,
        token_types=False,
        classes=_classes("Esm", "Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"),
        config_fields=ESM_FIELDS,
        # ESM ships vocab.txt only; transformers' EsmTokenizer splits one token per residue
        tokenizer=Tokenizing(esm_vocabulary, esm_processor, "EsmTokenizer", vocab_txt=True, texts=PROTEINS),
        tokenizer_convention=True,
        both_paddings=True,
        hidden_states="EsmForMaskedLM",
        in_memory_key=("EsmForMaskedLM", "esm.encoder.layer.0.LayerNorm.weight"),  # written .gamma/.beta
        refusals=(
            ({"is_folding_model": True}, "is_folding_model=True"),
            ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
            ({"bertblocks": {"position": {"name": "absolute"}}}, "position.name"),
        ),
        presets=("esm2-t6-8m", "esm2-t12-35m", "esm2-t30-150m", "esm2-t33-650m"),
        mask_token=4,
    ),
    # ESM-1b: a learned table with RoBERTa's positions past the padding index, a LayerNorm before the stack
    "esm-1b": Family(
        "EsmConfig",
        {**ESM2, "position_embedding_type": "absolute", "emb_layer_norm_before": True},
        pad=1,
        token_types=False,
        classes=("EsmModel", "EsmForMaskedLM"),
        config_fields=ESM_FIELDS,
        hidden_states="EsmForMaskedLM",
        mask_token=4,
    ),
    "esm-no-token-dropout": Family(
        "EsmConfig",
        {**ESM2, "token_dropout": False},
        pad=1,
        token_types=False,
        classes=("EsmModel", "EsmForMaskedLM"),
        config_fields=ESM_FIELDS,
        mask_token=4,
    ),
    "eurobert": Family(
        "EuroBertConfig",
        EUROBERT,
        pad=1,
        token_types=False,
        classes=_classes("EuroBert", "Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"),
        config_fields=EUROBERT_FIELDS,
        # PreTrainedTokenizerFast frames nothing without a post-processor: EuroBERT's framing is its tokenizer.json's
        # (test_eurobert.py checks bertblocks' template for a file without one)
        tokenizer=Tokenizing(eurobert_bpe, eurobert_processor, "PreTrainedTokenizerFast", _EUROBERT_SPECIALS),
        both_paddings=True,
        hidden_states="EuroBertForMaskedLM",
        refusals=tuple((change, re.escape(message)) for change, message in EUROBERT_REFUSED),
        presets=("eurobert-210m", "eurobert-610m", "eurobert-2.1b"),
    ),
    # grouped-query attention with biases (mlp_bias also gives the lm_head one) and a GELU gate
    "eurobert-gqa-biased": Family(
        "EuroBertConfig",
        {**EUROBERT, "num_key_value_heads": 2, "attention_bias": True, "mlp_bias": True, "hidden_act": "gelu"},
        pad=1,
        token_types=False,
        classes=("EuroBertModel", "EuroBertForMaskedLM", "EuroBertForSequenceClassification"),
        config_fields=EUROBERT_FIELDS,
        both_paddings=True,
        hidden_states="EuroBertForMaskedLM",
    ),
    # one key/value head, and the decoder tied to the embeddings
    "eurobert-mqa-tied": Family(
        "EuroBertConfig",
        {**EUROBERT, "num_key_value_heads": 1, "tie_word_embeddings": True},
        pad=1,
        token_types=False,
        classes=("EuroBertModel", "EuroBertForMaskedLM", "EuroBertForSequenceClassification"),
        config_fields=EUROBERT_FIELDS,
        both_paddings=True,
    ),
    "roformer": Family(
        "RoFormerConfig",
        COMMON,
        pad=0,
        classes=_classes("RoFormer", "Model", "ForMaskedLM", "ForCausalLM", *_TASKS),
        second_segment=3,
        config_fields=("embedding_size", "rotary_value", "hidden_act"),
        # transformers' RoFormerTokenizer pre-splits Chinese with jieba (a package outside tokenizer.json that it
        # needs installed); on the WordPiece tokenizer.json it frames and numbers as BertTokenizer does
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "BertTokenizer"),
        tokenizer_convention=True,
        both_paddings=True,
        hidden_states="RoFormerForMaskedLM",
        refusals=(
            ({"bertblocks": {"position": {"name": "absolute"}}}, "position.name"),
            ({"bertblocks": {"position": {"interleaved": False}}}, "position.interleaved"),
            ({"bertblocks": {"encoder": {"layer": {"name": "pre_ln"}}}}, "encoder.layer.name"),
        ),
        presets=("roformer-chinese-base",),
    ),
    # a narrower embedding_size (the projection, and the LM heads narrowing to it), rotated values, and relu (the
    # classifier and LM transform use hidden_act, not gelu or tanh): each read wrongly changes the numbers
    "roformer-narrow": Family(
        "RoFormerConfig",
        {**COMMON, "embedding_size": 16, "rotary_value": True, "hidden_act": "relu"},
        pad=0,
        classes=_classes("RoFormer", "Model", "ForMaskedLM", "ForCausalLM", "ForSequenceClassification"),
        second_segment=3,
        config_fields=("embedding_size", "rotary_value", "hidden_act"),
        both_paddings=True,
        hidden_states="RoFormerForMaskedLM",
    ),
    # decoupled embeddings: input tables 16 wide (projected to 32), an LM head narrowing to 24, untied; gelu_new
    # and a classifier dropout of its own, so that a width or activation read wrongly changes the numbers
    "rembert": Family(
        "RemBertConfig",
        {**COMMON, "input_embedding_size": 16, "output_embedding_size": 24, "hidden_act": "gelu_new"},
        pad=0,
        classes=_classes("RemBert", "Model", "ForMaskedLM", "ForCausalLM", *_TASKS),
        second_segment=3,
        config_fields=("input_embedding_size", "output_embedding_size", "hidden_act", "tie_word_embeddings"),
        tokenizer=Tokenizing(toks.albert_unigram, toks.bert_processor, "RemBertTokenizer"),
        hidden_states="RemBertForMaskedLM",
        refusals=(
            ({"bertblocks": {"position": {"name": "rope"}}}, "position.name"),
            ({"bertblocks": {"tie_word_embeddings": True}}, "tie_word_embeddings"),
        ),
        presets=("rembert",),
    ),
    # mixed attention (2 softmax + 2 convolution heads of width 8, a window of 5 that reaches into the padding),
    # grouped feed-forward projections, a narrower embedding_size and gelu_new (the classifier reads hidden_act)
    "convbert": Family(
        "ConvBertConfig",
        {
            **COMMON,
            "pad_token_id": 0,
            "embedding_size": 16,
            "head_ratio": 2,
            "conv_kernel_size": 5,
            "num_groups": 2,
            "intermediate_size": 38,
            "hidden_act": "gelu_new",
        },
        pad=0,
        classes=_classes("ConvBert", "Model", "ForMaskedLM", *_TASKS),
        second_segment=3,
        config_fields=("embedding_size", "head_ratio", "conv_kernel_size", "num_groups", "hidden_act"),
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "ConvBertTokenizer"),
        tokenizer_convention=True,
        hidden_states="ConvBertForMaskedLM",
        refusals=(
            ({"conv_kernel_size": 4}, "conv_kernel_size 4 must be odd"),
            ({"num_groups": 3}, "groups 3 must divide"),
            ({"summary_use_proj": True}, "summary_use_proj"),
            ({"tie_word_embeddings": False}, "tie_word_embeddings"),
            ({"bertblocks": {"encoder": {"attention": {"name": "bert"}}}}, "encoder.attention.name"),
        ),
        presets=("convbert-base", "convbert-medium-small", "convbert-small"),
    ),
    # a different group count on every projection (1, 2 and 4), so that a count read into the wrong place changes
    # the numbers; transformers returns pre-softmax scores as "attentions": hidden states only
    "squeezebert": Family(
        "SqueezeBertConfig",
        {
            **COMMON,
            "embedding_size": 32,
            "intermediate_size": 40,
            "q_groups": 2,
            "k_groups": 4,
            "v_groups": 1,
            "post_attention_groups": 2,
            "intermediate_groups": 4,
            "output_groups": 2,
            "hidden_act": "gelu_new",
        },
        pad=0,
        classes=_classes("SqueezeBert", "Model", "ForMaskedLM", *_TASKS),
        second_segment=3,
        config_fields=(
            "q_groups",
            "k_groups",
            "v_groups",
            "post_attention_groups",
            "intermediate_groups",
            "output_groups",
        ),
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "SqueezeBertTokenizer"),
        tokenizer_convention=True,
        both_paddings=True,
        hidden_states="SqueezeBertForMaskedLM",
        attentions=False,
        refusals=(
            ({"embedding_size": 16}, "embedding_size 16 must equal hidden_size 32"),
            ({"q_groups": 3}, "q_groups 3 must divide hidden_size 32"),
            ({"bertblocks": {"encoder": {"attention": {"name": "bert"}}}}, "encoder.attention.name"),
        ),
        presets=("squeezebert-uncased",),
    ),
    # windows of 4 and 8 keys (2 and 4 per side) over 14 tokens: several windows per row, one per layer so that a
    # window read from the wrong layer changes the numbers; the backbone, masked LM and token classifier get global
    # tokens (longformer_globals), the classes that choose them on their own (classification: the first token; QA:
    # the question; multiple choice: each choice's answer) get none, in rows framed as question and context (sep 2,
    # LongformerConfig's sep_token_id); test_longformer.py compares every class with explicit global tokens
    "longformer": Family(
        "LongformerConfig",
        {
            **COMMON,
            "type_vocab_size": 1,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "attention_window": [4, 8],
        },
        pad=1,
        classes=_classes("Longformer", "Model", "ForMaskedLM", *_TASKS),
        length=14,
        real=9,
        sep_token=2,
        chooses_inputs=("ForSequenceClassification", "ForQuestionAnswering", "ForMultipleChoice"),
        config_fields=("attention_window",),
        tokenizer=Tokenizing(toks.bpe, toks.roberta_processor, "LongformerTokenizer"),
        hidden_states="LongformerForMaskedLM",
        attentions=False,  # transformers returns banded [b, h, L, w + 1 + G] weights: test_longformer.py compares them
        refusals=(
            ({"attention_window": 5}, "attention_window=5"),
            ({"attention_window": [4, 4, 4]}, "attention_window=\\[4, 4, 4\\]"),
            ({"bertblocks": {"encoder": {"attention": {"name": "bert"}}}}, "encoder.attention.name"),
        ),
        presets=("longformer-base-4096",),
        extra_inputs=longformer_globals,
    ),
    # LayoutLM: BERT plus 2-D box tables; every batch carries boxes (layoutlm_boxes), so that a table read wrongly, or
    # a bbox lost on a path (packing, the backbone inside a task model), changes the numbers
    "layoutlm": Family(
        "LayoutLMConfig",
        {**COMMON, "max_2d_position_embeddings": LAYOUTLM_GRID},
        pad=0,
        classes=_classes(
            "LayoutLM",
            "Model",
            "ForMaskedLM",
            "ForSequenceClassification",
            "ForTokenClassification",
            "ForQuestionAnswering",
        ),
        second_segment=3,
        config_fields=("max_2d_position_embeddings",),
        tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "LayoutLMTokenizer"),
        tokenizer_convention=True,
        hidden_states="LayoutLMForTokenClassification",
        refusals=(
            ({"position_embedding_type": "relative_key"}, "position.name"),
            ({"max_2d_position_embeddings": 0}, "max_2d_position_embeddings"),
            ({"bertblocks": {"pooler": {"always": False}}}, "pooler.always"),
        ),
        presets=("layoutlm-base-uncased",),
        extra_inputs=layoutlm_boxes,
    ),
    # X-MOD: RoBERTa with per-language adapters; every batch carries lang_ids (xmod_languages) choosing other
    # adapters per row than the default language, so that an adapter read wrongly, or lang_ids lost on a path,
    # changes the numbers
    "xmod": Family(
        "XmodConfig",
        XMOD,
        pad=1,
        classes=_classes("Xmod", *_ROBERTA_HEADS),
        config_fields=XMOD_FIELDS,
        # XLM-R's tokenizer (XmodTokenizer does not exist); the tokenizer paths omit lang_ids: the default language
        tokenizer=Tokenizing(toks.unigram, toks.xlmr_processor, "XLMRobertaTokenizer"),
        hidden_states="XmodForMaskedLM",
        refusals=(
            ({"default_language": "xx_XX"}, "default_language: 'xx_XX' is not one of languages"),
            ({"languages": ["de_DE", "de_DE"]}, "name a language twice"),
            ({"bertblocks": {"encoder": {"feedforward": {"name": "bert"}}}}, "encoder.feedforward.name"),
        ),
        extra_inputs=xmod_languages,
    ),
    # pre_norm: each LayerNorm before its sub-layer, the adapters reusing the feed-forward's, a final LayerNorm (the
    # other norm placements: tests/families/test_xmod.py)
    "xmod-pre-norm": Family(
        "XmodConfig",
        {**XMOD, "pre_norm": True},
        pad=1,
        classes=("XmodModel", "XmodForCausalLM", "XmodForSequenceClassification"),
        config_fields=XMOD_FIELDS,
        hidden_states="XmodModel",
        extra_inputs=xmod_languages,
    ),
    # the adapters' own LayerNorm, their residual before it
    "xmod-own-norm": Family(
        "XmodConfig",
        {**XMOD, "adapter_layer_norm": True, "ln_before_adapter": False},
        pad=1,
        classes=("XmodModel", "XmodForMaskedLM", "XmodForSequenceClassification"),
        config_fields=XMOD_FIELDS,
        extra_inputs=xmod_languages,
    ),
}
FAMILIES["modernbert-biased"] = Family(  # every bias and the other choices flipped from the defaults; round trip only
    "ModernBertConfig",
    {
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
    pad=0,
    token_types=False,
    classes=FAMILIES["modernbert"].classes,
    length=14,
    real=9,
    config_fields=MODERNBERT_FIELDS,
)

# RoBERTa-PreLayerNorm: RoBERTa with pre-LN layers and a final norm on the backbone
FAMILIES["roberta-prelayernorm"] = Family(
    "RobertaPreLayerNormConfig",
    {**COMMON, "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "layer_norm_eps": 1e-3},
    pad=1,
    classes=_classes("RobertaPreLayerNorm", *_ROBERTA_HEADS),
    tokenizer=Tokenizing(toks.bpe, toks.roberta_processor, "RobertaTokenizer"),
    tokenizer_convention=True,
    hidden_states="RobertaPreLayerNormForMaskedLM",
    refusals=(
        ({"bertblocks": {"encoder": {"layer": {"name": "post_ln"}}}}, "encoder.layer.name"),
        ({"bertblocks": {"encoder": {"layer": {"first_attention_norm": False}}}}, "encoder.layer.first_attention_norm"),
        ({"bertblocks": {"embedding": {"norm": False}}}, "embedding.norm"),
    ),
    presets=("roberta-prelayernorm-large",),
)
# MegatronBERT: BERT with pre-LN layers, no embedding norm, the final norm at encoder.ln; BERT's heads, two token types
FAMILIES["megatron-bert"] = Family(
    "MegatronBertConfig",
    {**COMMON, "layer_norm_eps": 1e-3},
    pad=0,
    classes=_classes(
        "MegatronBert",
        "Model",
        "ForMaskedLM",
        "ForCausalLM",
        "ForPreTraining",
        "ForNextSentencePrediction",
        *_TASKS,
    ),
    second_segment=3,
    tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "BertTokenizer"),
    tokenizer_convention=True,
    hidden_states="MegatronBertForMaskedLM",
    refusals=(
        ({"bertblocks": {"encoder": {"layer": {"name": "post_ln"}}}}, "encoder.layer.name"),
        ({"bertblocks": {"embedding": {"norm": True}}}, "embedding.norm"),
        ({"bertblocks": {"position": {"name": "relative_key"}}}, "position.name"),
    ),
    presets=("megatron-bert-cased-345m", "megatron-bert-uncased-345m"),
)
#: XLM-R's special tokens, as the tokenizer_config.json of facebook/xlm-roberta-xl states them
_XLMR_SPECIALS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "sep_token": "</s>",
    "pad_token": "<pad>",
    "cls_token": "<s>",
    "mask_token": "<mask>",
}
# XLM-RoBERTa-XL: RoBERTa with pre-LN layers, no embedding norm, no dropout after the feed-forward output
FAMILIES["xlm-roberta-xl"] = Family(
    "XLMRobertaXLConfig",
    {**COMMON, "type_vocab_size": 1, "pad_token_id": 1, "layer_norm_eps": 1e-3},
    pad=1,
    classes=_classes("XLMRobertaXL", *_ROBERTA_HEADS),
    # transformers maps xlm-roberta-xl to the generic tokenizer class, which takes its special tokens from
    # tokenizer_config.json (as the published one states them)
    # (that generic class frames nothing for a tokenizer.json without a post-processor: no convention to compare)
    tokenizer=Tokenizing(toks.unigram, toks.xlmr_processor, "XLMRobertaTokenizer", _XLMR_SPECIALS),
    hidden_states="XLMRobertaXLForMaskedLM",
    refusals=(
        ({"bertblocks": {"encoder": {"layer": {"name": "parallel"}}}}, "encoder.layer.name"),
        ({"bertblocks": {"embedding": {"norm": True}}}, "embedding.norm"),
        ({"bertblocks": {"encoder": {"feedforward": {"output_dropout": True}}}}, "encoder.feedforward.output_dropout"),
    ),
    presets=("xlm-roberta-xl",),
)
# Data2VecText: RoBERTa's modelling under data2vec_text.
FAMILIES["data2vec-text"] = Family(
    "Data2VecTextConfig",
    {**COMMON, "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
    pad=1,
    classes=_classes("Data2VecText", *_ROBERTA_HEADS),
    tokenizer=Tokenizing(toks.bpe, toks.roberta_processor, "RobertaTokenizer"),
    tokenizer_convention=True,
    refusals=(({"bertblocks": {"embedding": {"position_offset": "none"}}}, "embedding.position_offset"),),
    presets=("data2vec-text-base",),
)


#: DeBERTa v1 as microsoft/deberta-base publishes it (relative attention with both terms, written as the string
#: "c2p|p2c"; no absolute table, no token types, max_relative_positions -1), at test size, with a tanh pooler so that
#: pooler_hidden_act read wrongly changes the numbers
DEBERTA_V1: dict[str, Any] = {
    **COMMON,
    "relative_attention": True,
    "pos_att_type": "c2p|p2c",
    "position_biased_input": False,
    "type_vocab_size": 0,
    "max_relative_positions": -1,
    "layer_norm_eps": 1e-7,
    "pooler_hidden_act": "tanh",
}
#: the config fields of DeBERTa v1 that transformers must read back unchanged from the config.json bertblocks writes
DEBERTA_V1_FIELDS = (
    "relative_attention",
    "max_relative_positions",
    "pos_att_type",
    "position_biased_input",
    "type_vocab_size",
    "pooler_hidden_act",
)


def deberta_bpe() -> Tokenizer:
    """DeBERTa v1's kind: GPT-2's byte-level BPE with BERT's special tokens at microsoft/deberta-base's ids ([PAD] 0,
    [CLS] 1, [SEP] 2, [UNK] 3; its [MASK] is last in the published vocabulary, here after them)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(toks.CORPUS, trainer)
    return tok


def deberta_processor(tok: Tokenizer) -> processors.TemplateProcessing:
    """transformers' DebertaTokenizer frames a pair as RoBERTa does ([SEP] [SEP] between), every token type 0."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    return processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )


FAMILIES["deberta"] = Family(
    "DebertaConfig",
    DEBERTA_V1,
    pad=0,
    # transformers has no DebertaForMultipleChoice
    classes=_classes(
        "Deberta", "Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"
    ),
    config_fields=DEBERTA_V1_FIELDS,
    tokenizer=Tokenizing(deberta_bpe, deberta_processor, "DebertaTokenizer"),
    tokenizer_convention=True,
    both_paddings=True,
    hidden_states="DebertaForSequenceClassification",
    refusals=(
        ({"talking_head": True}, "talking_head=True"),
        ({"embedding_size": 16}, "embedding_size=16"),
        ({"pos_att_type": ["p2p"]}, "pos_att_type=.*'p2p'"),
        ({"pos_att_type": "c2p|p2p"}, "pos_att_type=.*'p2p'"),
        ({"pooler_hidden_size": 16}, "pooler_hidden_size=16"),
        ({"pooler_dropout": 0.1}, "pooler_dropout=0.1"),
        ({"bertblocks": {"position": {"name": "absolute"}}}, "position.name"),
        ({"bertblocks": {"position": {"position_buckets": 32}}}, "position.position_buckets"),
        ({"bertblocks": {"encoder": {"attention": {"qv_bias": False}}}}, "encoder.attention.qv_bias"),
    ),
    presets=("deberta-base", "deberta-large"),
)


#: BertGeneration at test size: BertGenerationConfig's special ids (padding 0, end 1, start 2)
BERT_GENERATION: dict[str, Any] = {
    **{k: v for k, v in COMMON.items() if k != "num_labels"},  # no task class with labels
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "layer_norm_eps": 1e-6,
}


def bert_generation_unigram() -> Tokenizer:
    """BertGeneration's kind: a SentencePiece-style Unigram with its specials at the published ids (<pad> 0, </s> 1,
    <s> 2, <unk> 3) and its tokenizer's separator <::::>."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = ["<pad>", "</s>", "<s>", "<unk>", "<::::>"]
    tok.train_from_iterator(
        toks.CORPUS, trainers.UnigramTrainer(vocab_size=150, special_tokens=specials, unk_token="<unk>")
    )
    return tok


def bert_generation_processor(tok: Tokenizer) -> processors.TemplateProcessing:
    """transformers' BertGenerationTokenizer adds no special tokens (its ``special_tokens_pattern`` is none)."""
    return processors.TemplateProcessing(single="$A", pair="$A $B", special_tokens=[])


FAMILIES["bert-generation"] = Family(
    "BertGenerationConfig",
    BERT_GENERATION,
    pad=0,
    token_types=False,
    # the backbone (BertGenerationEncoder) and the causal LM (BertGenerationDecoder); the decoder with is_decoder,
    # cross-attention, its cache and the encoder-decoder round trip: tests/families/test_bert_generation.py
    classes=("BertGenerationEncoder", "BertGenerationDecoder"),
    config_fields=("layer_norm_eps", "tie_word_embeddings", "is_decoder"),
    # transformers' BertGenerationTokenizer reads a SentencePiece spiece.model only: the tokenizer.json is read by
    # the generic class, with BertGeneration's specials
    tokenizer=Tokenizing(
        bert_generation_unigram,
        bert_generation_processor,
        "PreTrainedTokenizerFast",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "sep_token": "<::::>"},
    ),
    hidden_states="BertGenerationDecoder",
    refusals=(
        ({"bertblocks": {"embedding": {"token_types": True}}}, "embedding.token_types"),
        ({"bertblocks": {"pooler": {"name": "first_token"}}}, "pooler"),
        ({"bertblocks": {"position": {"name": "relative_key"}}}, "position.name"),
        ({"bertblocks": {"encoder": {"layer": {"name": "pre_ln"}}}}, "encoder.layer.name"),
    ),
    presets=("bert-for-seq-generation-l24",),
)


#: Nyströmformer at test size: full attention (num_landmarks == segment_means_seq_len, as the published model has it;
#: transformers' landmark path fails on a padded batch, so tests/families/test_nystromformer.py covers it) with a
#: 3-wide value convolution, so that the convolution (which reads padded values) changes the numbers
NYSTROMFORMER: dict[str, Any] = {
    **COMMON,
    "pad_token_id": 0,  # the WordPiece vocabulary's [PAD]
    "num_landmarks": 16,
    "segment_means_seq_len": 16,
    "conv_kernel_size": 3,
}
FAMILIES["nystromformer"] = Family(
    "NystromformerConfig",
    NYSTROMFORMER,
    pad=0,
    classes=_classes("Nystromformer", "Model", "ForMaskedLM", *_TASKS),
    second_segment=3,
    config_fields=("num_landmarks", "segment_means_seq_len", "conv_kernel_size", "max_position_embeddings"),
    # transformers maps nystromformer to the generic tokenizer class, which takes its specials from
    # tokenizer_config.json
    tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "BertTokenizer", _BERT_SPECIALS),
    hidden_states="NystromformerForMaskedLM",
    refusals=(
        ({"inv_coeff_init_option": True}, "inv_coeff_init_option=True"),
        ({"conv_kernel_size": 4}, "conv_kernel_size"),
        ({"bertblocks": {"embedding": {"position_start": 0}}}, "embedding.position_start"),
        ({"bertblocks": {"encoder": {"attention": {"name": "bert"}}}}, "encoder.attention.name"),
    ),
    presets=("nystromformer-512", "tiny-nystromformer"),
)


# BigBird: block-sparse attention (blocks of 2, one random block: sequences past (5 + 2·1)·2 = 14 tokens run
# block-sparse, so the batch of 24 has 12 blocks), rescaled embeddings; every row has a question (sep_token 2, the
# settings' sep_token_id), which BigBirdForQuestionAnswering finds on its own; BigBirdForCausalLM and QA's short
# inputs and own token types are tested in test_big_bird.py (a decoder attends causally)
FAMILIES["big_bird"] = Family(
    "BigBirdConfig",
    {
        **COMMON,
        "block_size": 2,
        "num_random_blocks": 1,
        "rescale_embeddings": True,
        "layer_norm_eps": 1e-5,
        "sep_token_id": 2,
    },
    pad=0,
    classes=_classes(
        "BigBird",
        "Model",
        "ForMaskedLM",
        "ForPreTraining",
        "ForSequenceClassification",
        "ForTokenClassification",
        "ForQuestionAnswering",
        "ForMultipleChoice",
    ),
    length=24,
    real=15,
    second_segment=3,
    sep_token=2,
    config_fields=(
        "attention_type",
        "block_size",
        "num_random_blocks",
        "use_bias",
        "rescale_embeddings",
        "sep_token_id",
    ),
    refusals=(
        ({"bertblocks": {"embedding": {"dropout_before_norm": False}}}, "embedding.dropout_before_norm"),
        ({"bertblocks": {"encoder": {"attention": {"name": "bert"}}}}, "encoder.attention.name"),
    ),
    presets=("bigbird-roberta-base",),
)


#: MobileBERT at test size: a narrow table (16) and bottleneck (16) under a 32-wide residual stream, three stacked
#: feed-forward blocks, NoNorm (the published choice), an epsilon far from the default (the layer norms that read it)
MOBILEBERT: dict[str, Any] = {
    **COMMON,
    "embedding_size": 16,
    "intra_bottleneck_size": 16,
    "num_feedforward_networks": 3,
    "layer_norm_eps": 1e-3,
}
FAMILIES["mobilebert"] = Family(
    "MobileBertConfig",
    MOBILEBERT,
    pad=0,
    classes=_classes(
        "MobileBert",
        "Model",
        "ForMaskedLM",
        "ForPreTraining",
        "ForNextSentencePrediction",
        *_TASKS,
    ),
    second_segment=3,
    config_fields=(
        "embedding_size",
        "trigram_input",
        "use_bottleneck",
        "intra_bottleneck_size",
        "use_bottleneck_attention",
        "key_query_shared_bottleneck",
        "num_feedforward_networks",
        "normalization_type",
        "true_hidden_size",
    ),
    tokenizer=Tokenizing(toks.wordpiece, toks.bert_processor, "MobileBertTokenizer"),
    tokenizer_convention=True,
    hidden_states="MobileBertForMaskedLM",
    refusals=(
        ({"use_bottleneck_attention": False, "key_query_shared_bottleneck": False}, "key_query_shared_bottleneck"),
        ({"true_hidden_size": 8}, "true_hidden_size=8"),
        ({"bertblocks": {"encoder": {"layer": {"name": "post_ln"}}}}, "encoder.layer.name"),
        ({"bertblocks": {"embedding": {"norm_eps": 1e-12}}}, "embedding.norm_eps"),
    ),
    presets=("mobilebert-uncased",),
)


def rows(joins: Callable[[Family], object]) -> list[str]:
    """The names of the rows that take part in a shared test (``joins(row)`` truthy), in the table's order."""
    return [name for name, family in FAMILIES.items() if joins(family)]


def tokenizer_of(name: str) -> Tokenizing:
    """The family's tokenizer: the row's own, or that of the row of the same ``model_type`` that has one."""
    family = FAMILIES[name]
    if family.tokenizer is not None:
        return family.tokenizer
    for other in FAMILIES.values():
        if other.tokenizer is not None and other.model_type == family.model_type:
            return other.tokenizer
    raise LookupError(f"no row of model_type {family.model_type!r} has a tokenizer")


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


#: the checkpoints :func:`saved_hf` saved this session: (config class, settings, class) → (directory, model)
_SAVED: dict[tuple[str, str, str], tuple[Path, torch.nn.Module]] = {}
_SAVED_ROOT: list[Path] = []


def saved_hf(family: Family, cls: str, **extra: Any) -> tuple[Path, torch.nn.Module]:
    """:func:`save_hf`'s checkpoint of ``cls`` (seed 0, ``extra`` over the row's settings), saved once per session:
    its directory, shared by every test that reads the same checkpoint (the round trip of each class, the packed and
    hidden-state tables of its backbone, its int8 test), and a fresh copy of transformers' model that wrote it (a
    copy each call: a forward changes a model's config, transformers' classifiers set ``problem_type`` from the
    first labels they see).

    The directory is read-only: a test that changes files saves its own with :func:`save_hf`. The key is the config
    class, the settings and the class (not the row's name), so a row and a variant with other settings never share
    one."""
    settings = {**family.settings, **extra}
    key = (family.config, json.dumps(settings, sort_keys=True, default=str), cls)
    if key not in _SAVED:
        if not _SAVED_ROOT:
            root = Path(tempfile.mkdtemp(prefix="bertblocks-families-"))
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            _SAVED_ROOT.append(root)
        directory = _SAVED_ROOT[0] / str(len(_SAVED))
        _SAVED[key] = (directory, save_hf(family, cls, directory, **extra))
        for file in directory.iterdir():  # a test that writes into a shared checkpoint fails (as a non-root user)
            file.chmod(0o444)
    torch.manual_seed(0)  # as after save_hf: the caller's random draws do not depend on which test saved first
    directory, model = _SAVED[key]
    return directory, copy.deepcopy(model)


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
    if family.mask_token is not None:
        ids[0, ..., 2] = ids[1, ..., 1] = ids[1, ..., 3] = family.mask_token
    if family.sep_token is not None:
        ids[..., 2:4] = family.sep_token
        ids[0, ..., -1] = family.sep_token
        ids[1, ..., -1 if left else family.real - 1] = family.sep_token
    inputs = {"input_ids": ids.masked_fill(mask == 0, family.pad), "attention_mask": mask}
    if family.token_types:
        inputs["token_type_ids"] = torch.zeros(shape, dtype=torch.long)
        if family.second_segment is not None:
            inputs["token_type_ids"][..., family.second_segment :] = 1
    if family.extra_inputs is not None and not cls.endswith(family.chooses_inputs):
        inputs.update(family.extra_inputs(shape))
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
        # after the question when the batch has one (a question token's logit is lowered by 10⁶ in BigBird's)
        inputs["start_positions"] = torch.tensor([4, 5] if family.sep_token is not None else [1, 3])
        inputs["end_positions"] = torch.tensor([4, 40])  # out of range: clamped and ignored, as transformers
    elif cls.endswith("MultipleChoice"):
        inputs["labels"] = torch.tensor([1, 2])
    return inputs, mask


#: what :func:`batch` gives a head and a backbone does not take
LABELS = ("labels", "next_sentence_label", "sentence_order_label", "start_positions", "end_positions")


def call_inputs(cls: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What ``cls`` is called with: a backbone takes no labels (and every other input of :func:`batch`)."""
    if cls.endswith("Model"):
        return {k: v for k, v in inputs.items() if k not in LABELS}
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
            real = mask.bool().to(a.device)
            a, b = a[real], b[real]
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
    *,
    device: str = "cpu",
    **extra: Any,
) -> None:
    """A checkpoint saved by transformers' ``cls`` (settings changed by ``extra``) loads with
    ``from_pretrained(dir, head="auto")`` with no missing or unexpected keys and gives transformers' numbers
    (on :func:`batch`, or ``inputs`` with their real-token ``mask``); saved by bertblocks, the same class loads
    it with no missing, unexpected or mismatched keys, reads the family's config back, and gives them again.
    Both models run on ``device`` (the ``device`` fixture of tests/conftest.py), in float32."""
    directory, reference = saved_hf(family, cls, **extra)
    reference = reference.to(device)
    if inputs is None or mask is None:
        inputs, mask = batch(family, cls)
    inputs = to_device(call_inputs(cls, inputs), device)
    ours, info = bertblocks.from_pretrained(directory, head="auto", output_loading_info=True)
    ours.to(device).eval()
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
        assert_same(expected, again.to(device).eval()(**inputs), mask)


#: a remote family's written-out equations: ``(weights, input_ids, attention_mask, token_type_ids)`` → the last hidden
#: state (float64)
HiddenStates = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


class WrittenOutReference(torch.nn.Module):
    """A remote family's written-out equations as a backbone, for the shared per-family path tests
    (``tests/families/test_family_paths.py``): called like a model, returns ``last_hidden_state`` in float32; its
    parameters are the published checkpoint's tensors (what a parameter count of the checkpoint counts)."""

    def __init__(self, weights: dict[str, torch.Tensor], hidden_states: HiddenStates) -> None:
        super().__init__()
        self.hidden_states = hidden_states
        # ParameterDict keys may not hold dots
        self.weights = torch.nn.ParameterDict(
            {key.replace(".", ":"): torch.nn.Parameter(value, requires_grad=False) for key, value in weights.items()}
        )

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> SimpleNamespace:
        weights = {key.replace(":", "."): value for key, value in self.weights.items()}
        hidden = self.hidden_states(weights, input_ids, attention_mask, token_type_ids)
        return SimpleNamespace(last_hidden_state=hidden.float())
