"""What a model-family plugin hands the registry: one HF ``model_type`` in and out.

A family (BERT, RoBERTa, ELECTRA, DistilBERT, …) is not new modelling code: it is a composition of the
registry's components plus this description of its Hugging Face format. A plugin registers it as a
:class:`~bertblocks.core.component.Component` of kind ``family`` whose factory (:class:`FamilyFactory`)
returns a :class:`Family`; the component's name is the ``model_type``. The kind's contract lives here, not
in :mod:`bertblocks.core.factories`: core knows no checkpoint format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from ..core.factories import KindContract, contract
from ..core.interfaces import InputDefault
from .fields import HFField
from .keymap import KeyMap


@dataclass(frozen=True)
class TokenizerConvention:
    """How a family's tokenizer frames texts: what ``tokenizer.json`` leaves to the tokenizer class.

    Attributes:
        special_tokens: ``cls_token``, ``sep_token``, ``pad_token``, ``unk_token``, ``mask_token`` (the
            defaults; ``tokenizer_config.json`` / ``special_tokens_map.json`` override them).
        single: the template for one text, in ``tokenizers``' ``TemplateProcessing`` syntax, used when the
            ``tokenizer.json`` has no post-processor of its own.
        pair: the template for a pair (``$B:1`` gives the second segment token type 1).
        model_input_names: what the tokenizer returns (no ``token_type_ids`` where the family has none).
        tokenizer_classes: transformers' tokenizer class names of the family (``tokenizer_config.json``'s
            ``tokenizer_class`` picks the convention when no config.json says the family).
        from_vocab: how the family's tokenizer class splits text over a ``vocab.txt`` (a folder without
            ``tokenizer.json``): ``(vocabulary, special tokens) → tokenizers.Tokenizer`` without post-processor
            (the templates above frame it); ``None``: BERT's WordPiece pipeline.
    """

    special_tokens: Mapping[str, str]
    single: str
    pair: str
    model_input_names: tuple[str, ...] = ("input_ids", "token_type_ids", "attention_mask")
    tokenizer_classes: tuple[str, ...] = ()
    from_vocab: Callable[[Mapping[str, int], Mapping[str, str]], Any] | None = None


BERT_TOKENIZER = TokenizerConvention(
    special_tokens={
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    },
    single="[CLS] $A [SEP]",
    pair="[CLS] $A [SEP] $B:1 [SEP]:1",
)


@dataclass(frozen=True)
class RemoteCode:
    """Remote code a family reproduces: what an ``auto_map`` entry may name for the family to read the file.

    An entry is ``"owner/repository--module.Class"`` (code in another hub repository) or ``"module.Class"`` (code
    in the checkpoint's own folder). Only the repository *and* the class together say whose code it is: the same
    class name in another repository, or in a folder's own ``*.py``, is code bertblocks has never seen.

    Attributes:
        repository: the hub repository holding the code (``jinaai/jina-bert-implementation``); ``None``: the
            checkpoint's own folder (EuroBERT and NeoBERT publish their code beside the weights).
        classes: the ``module.Class`` names of that code whose modelling the family reproduces.
        format: whether a config.json is in that code's format, beyond its ``auto_map`` (NomicBERT's original
            fields, ``n_embd`` …: transformers' own format with Nomic's ``auto_map`` is not it); ``None``: any.
    """

    repository: str | None
    classes: frozenset[str]
    format: Callable[[Mapping[str, Any]], bool] | None = None

    def names(self, value: object) -> bool:
        """Whether the ``auto_map`` value ``value`` names one of :attr:`classes` in :attr:`repository`."""
        if not isinstance(value, str):
            return False
        repository, _, name = value.rpartition("--")
        return (repository or None) == self.repository and name in self.classes


@dataclass(frozen=True)
class Family:
    """One HF model family: config.json both ways, a checkpoint key map, and its task classes.

    Attributes:
        model_type: the ``model_type`` of its ``config.json`` (RoBERTa's is roberta).
        config_from_hf: HF ``config.json`` dict → a bertblocks config as a nested dict (the YAML form), with
            ``family`` set to ``model_type``. It reads the family's field names (``dim``, ``n_layers`` …)
            and fixes what the family implies (RoBERTa's position offset). Raise ``ValueError`` for fields
            it cannot represent.
        config_to_hf: a validated config → the HF ``config.json`` fields transformers' config class of this
            family reads (``model_type`` and ``architectures`` are added by the caller).
        key_map: the checkpoint layout relative to bertblocks' keys (see :mod:`bertblocks.families.keymap`).
        architectures: transformers' task-model class name → the head spec it means (a head name, or a
            mapping with ``name`` and the head's options): what ``architectures`` in ``config.json`` picks
            with ``head="auto"``, and what ``save_pretrained`` writes back.
        base_architecture: transformers' backbone class of the family, written for a model without head.
        fixed: dotted config path → value this family requires (``embedding.position_offset: padding``); a
            config.json (or the block of bertblocks' own choices in it) that says otherwise is an error naming the
            field.
        description: one line for listings and the docs table.
        tokenizer: the family's special tokens and templates (:class:`TokenizerConvention`).
        fields: every ``config.json`` field ``config_from_hf`` reads, each with its type and range
            (:class:`~bertblocks.families.fields.HFField`): the translator checks a file against it before the family
            sees it, gives "did you mean" from it, and refuses a family that reads a field it does not declare.
        example_config: a small ``config.json`` the family translates (``model_type`` added): what the field fuzz
            test starts from. Empty: ``{"model_type": ...}`` alone.
        remote_code: the remote-code classes whose modelling the family reproduces
            (:class:`RemoteCode`: repository and ``module.Class``); a config.json whose ``auto_map`` names only
            those is translated (NomicBERT's original format, GTE's ``new``), any other ``auto_map`` is refused,
            never built as the ``model_type``'s plain model.
        remote_model_types: other ``model_type`` values whose config.json this family reads when its
            :attr:`remote_code` is what the ``auto_map`` names: a remote-code format published under a transformers
            ``model_type`` (Jina-embeddings-v2 says ``bert``, v3 ``xlm-roberta``). What ``config_to_hf`` returns
            as ``model_type`` is written (Jina-embeddings-v2 writes its published format back); without one, the
            family's own.
        prepare_checkpoint: what a key map cannot express, computed on the checkpoint's tensors (its own keys)
            before the key map renames them, given the model's config: Jina-embeddings-v3's published LoRA
            adapters merged into the weights for the task the config names. Raise ``KeyMapError`` for a
            checkpoint it cannot prepare.
        input_defaults: head name → input name → :data:`~bertblocks.core.interfaces.InputDefault`: what
            transformers' task class for that head chooses itself when the call leaves an input out
            (``LongformerForSequenceClassification`` puts global attention on the first token,
            ``LongformerForQuestionAnswering`` on the question). The task model applies each default whose input its
            backbone or head takes (a model whose attention reads no ``global_attention_mask`` gets none), before the
            head's own (:attr:`~bertblocks.core.interfaces.Head.input_defaults`).
    """

    model_type: str
    config_from_hf: Callable[[Mapping[str, Any]], dict[str, Any]]
    config_to_hf: Callable[[Any], dict[str, Any]]
    key_map: KeyMap
    architectures: Mapping[str, str | Mapping[str, Any]] = field(default_factory=dict)
    base_architecture: str = ""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    tokenizer: TokenizerConvention = field(default_factory=lambda: BERT_TOKENIZER)
    fields: Mapping[str, HFField] = field(default_factory=dict)
    example_config: Mapping[str, Any] = field(default_factory=dict)
    remote_code: tuple[RemoteCode, ...] = ()
    remote_model_types: tuple[str, ...] = ()
    prepare_checkpoint: Callable[[Mapping[str, Any], Any], dict[str, Any]] | None = None
    input_defaults: Mapping[str, Mapping[str, InputDefault]] = field(default_factory=dict)

    def reads_remote(self, hf: Mapping[str, Any]) -> bool:
        """Whether the config.json ``hf`` has an ``auto_map`` that names classes, and only classes one
        :attr:`remote_code` entry reproduces (in that entry's format); its ``AutoTokenizer`` aside (bertblocks reads
        ``tokenizer.json``, never a tokenizer class)."""
        auto_map = hf.get("auto_map")
        if not isinstance(auto_map, Mapping):
            return False
        named = [value for key, value in auto_map.items() if key != "AutoTokenizer"]
        return bool(named) and any(
            all(code.names(value) for value in named) and (code.format is None or code.format(hf))
            for code in self.remote_code
        )

    def head_for(self, architecture: str) -> dict[str, Any] | None:
        """The head spec (``{"name": ..., **options}``) transformers' class ``architecture`` means, or ``None``."""
        spec = self.architectures.get(architecture)
        if spec is None:
            return None
        return {"name": spec} if isinstance(spec, str) else dict(spec)

    def architecture_for(self, head: str | None) -> str:
        """transformers' class name for a model with ``head`` (the backbone class when there is none or the
        family has no class for it)."""
        for architecture, spec in self.architectures.items():
            name = spec if isinstance(spec, str) else spec.get("name")
            if name == head:
                return architecture
        return self.base_architecture


class FamilyFactory(Protocol):
    """Kind ``family``: the component's name is the HF ``model_type`` it handles."""

    def __call__(self, *, options: BaseModel) -> Family: ...


#: the kind ``family``'s row of the contract table (:data:`bertblocks.core.factories.CONTRACTS` holds the component
#: kinds'; the registry answers both)
FAMILY_CONTRACT: KindContract = contract("family", FamilyFactory, Family, "")
