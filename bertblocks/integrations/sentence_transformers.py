"""A bertblocks backbone as the first module of a sentence-transformers ``SentenceTransformer``.

sentence-transformers' own ``Transformer`` module loads its network with transformers' ``AutoModel``; this
module is its counterpart for a bertblocks :class:`~bertblocks.BertModel` (any config, hybrids and
third-party components included). It tokenizes with transformers' tokenizer of the checkpoint, runs the
model and hands ``token_embeddings`` on to sentence-transformers' ``Pooling`` / ``Normalize``, so a pipeline
built on the same weights encodes exactly as sentence-transformers' own.

Saved with the pipeline (``SentenceTransformer.save``), it writes the checkpoint (``config.json``, weights,
tokenizer) and ``bertblocks_module.json`` in the pipeline folder; ``modules.json`` names this class.
sentence-transformers imports a class that is not its own only with ``trust_remote_code=True``, which would
also let its modules import the folder's ``*.py`` files (``auto_map``). :func:`load_pipeline` never passes
it: it checks every ``modules.json`` type against an allow-list (:data:`ALLOWED_MODULE_TYPES`) and hands
sentence-transformers the classes themselves, so no name read from the folder is ever imported.

Example:
    >>> from sentence_transformers import SentenceTransformer
    >>> from sentence_transformers.sentence_transformer.modules import Normalize, Pooling
    >>> from bertblocks.integrations.sentence_transformers import BertblocksModule
    >>> encoder = BertblocksModule(minilm_path(), max_seq_length=256)
    >>> st = SentenceTransformer(modules=[encoder, Pooling(encoder.get_embedding_dimension(), "mean"), Normalize()])
    >>> st.encode(["A man is eating food."]).shape          # (1, 384)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from sentence_transformers.base.modules.input_module import InputModule
from transformers import AutoTokenizer

from ..errors import BertBlocksError, InputError, InputTypeError, MissingFileError
from ..models.backbone import BertModel
from ..readers import ReadError, read_json


class BertblocksModule(InputModule):
    """The input module: bertblocks backbone + transformers' tokenizer, ``token_embeddings`` out.

    Args:
        model_name_or_path: a checkpoint directory or hub id (``config.json``, weights, tokenizer files).
        max_seq_length: longest input in tokens (default: the tokenizer's ``model_max_length``, at most the
            model's ``max_position_embeddings``).
        model: an already built backbone to use instead of loading one (its tokenizer still comes from
            ``model_name_or_path``).
        overrides: dotted config overrides for loading (``["encoder.attention.backend=eager"]``).
        output: ``"hidden"``: the last hidden states (for ``Pooling``); ``"mlm_logits"``: the masked-LM head's
            vocabulary logits, loaded as bertblocks' ``splade`` head (a ``BertForMaskedLM`` checkpoint, e.g. a
            SPLADE model), for sentence-transformers' ``SpladePooling`` in a ``SparseEncoder`` (its
            ``MLMTransformer``'s counterpart).
    """

    config_file_name = "bertblocks_module.json"
    config_keys = ["max_seq_length", "output"]  # noqa: RUF012 (sentence-transformers' name and type)
    save_in_root = True

    def __init__(
        self,
        model_name_or_path: str | Path,
        max_seq_length: int | None = None,
        *,
        model: BertModel | None = None,
        overrides: Sequence[str] = (),
        output: Literal["hidden", "mlm_logits"] = "hidden",
    ) -> None:
        super().__init__()
        if output not in ("hidden", "mlm_logits"):
            raise InputError(f"output must be 'hidden' or 'mlm_logits'; got {output!r}")
        self.output = output
        self.lm_model = None
        if output == "mlm_logits":  # the splade head holds the masked-LM modules under their checkpoint names
            from ..models.auto import from_pretrained

            self.lm_model = from_pretrained(model_name_or_path, overrides, head="splade")
            model = self.lm_model.bert
        self.auto_model = model if model is not None else BertModel.from_pretrained(model_name_or_path, overrides)
        # never the folder's tokenization_*.py (tokenizer_config.json's auto_map): transformers' own classes only
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_name_or_path), trust_remote_code=False)
        limit = self.auto_model.config.max_position_embeddings
        self.max_seq_length = max_seq_length or min(self.tokenizer.model_max_length, limit)

    # ----------------------------------------------------------------------------------- encoding
    def preprocess(self, inputs: Sequence[Any], prompt: str | None = None, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Tokenize texts (or text pairs) as sentence-transformers' ``Transformer`` does: padded, truncated."""
        texts = [prompt + text for text in inputs] if prompt else list(inputs)
        if texts and isinstance(texts[0], list | tuple):  # pairs
            first, second = zip(*texts, strict=True)
            return dict(
                self.tokenizer(
                    list(first),
                    list(second),
                    padding=True,
                    truncation="longest_first",
                    max_length=self.max_seq_length,
                    return_tensors="pt",
                )
            )
        return dict(
            self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_seq_length, return_tensors="pt")
        )

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Run the backbone; add ``token_embeddings``: ``[b, s, hidden]`` (what ``Pooling`` reads), or with
        ``output="mlm_logits"`` the vocabulary logits ``[b, s, vocab]`` (what ``SpladePooling`` reads)."""
        inputs = {k: features[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in features}
        hidden = self.auto_model(**inputs).last_hidden_state
        features["token_embeddings"] = hidden if self.lm_model is None else self.lm_model.cls(hidden)
        return features

    def get_embedding_dimension(self) -> int:
        config = self.auto_model.config
        return int(config.vocab_size if self.lm_model is not None else config.hidden_size)

    def get_word_embedding_dimension(self) -> int:
        """sentence-transformers' older name of :meth:`get_embedding_dimension`."""
        return self.get_embedding_dimension()

    # ------------------------------------------------------------------------------ saving, loading
    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        """Write the checkpoint, the tokenizer and this module's settings into ``output_path``."""
        model = self.auto_model if self.lm_model is None else self.lm_model  # the LM head's weights too
        model.save_pretrained(output_path, safe_serialization=safe_serialization)
        self.tokenizer.save_pretrained(output_path)
        self.save_config(output_path)

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        **kwargs: Any,
    ) -> BertblocksModule:
        """What ``SentenceTransformer(folder)`` calls for a pipeline whose ``modules.json`` names this class."""
        config = cls.load_config(
            model_name_or_path,
            subfolder=subfolder,
            token=token,
            cache_folder=cache_folder,
            revision=revision,
            local_files_only=local_files_only,
        )
        directory = Path(model_name_or_path) / subfolder if subfolder else Path(model_name_or_path)
        return cls(directory, **config)


#: the ``modules.json`` type of this module
MODULE_TYPE = f"{BertblocksModule.__module__}.{BertblocksModule.__qualname__}"

#: sentence-transformers' modules a bertblocks pipeline may hold after :class:`BertblocksModule`: tensor
#: code only (their files are JSON settings and safetensors or ``weights_only`` weights). Its
#: ``Transformer`` is left out on purpose: it loads the folder with transformers' ``AutoModel``.
_SENTENCE_TRANSFORMERS_MODULES = ("Pooling", "Normalize", "Dense", "LayerNorm", "Dropout", "WeightedLayerPooling")


class UntrustedPipelineError(BertBlocksError, ValueError):
    """A pipeline folder that names a module class bertblocks will not import."""


def _allowed_module_types() -> dict[str, type]:
    """``modules.json`` type → class: this module and the allow-listed sentence-transformers modules, each
    under every name sentence-transformers writes for it (the defining module, the package it is exported
    from, and the ``sentence_transformers.models`` name of versions before 6)."""
    from sentence_transformers.sentence_transformer import modules

    allowed: dict[str, type] = {MODULE_TYPE: BertblocksModule}
    for name in _SENTENCE_TRANSFORMERS_MODULES:
        cls = getattr(modules, name)
        for spelling in (f"{cls.__module__}.{cls.__qualname__}", f"{modules.__name__}.{name}"):
            allowed[spelling] = cls
        allowed[f"sentence_transformers.models.{name}"] = cls
    return allowed


def _module_types(modules_file: Path) -> list[str]:
    try:
        entries = read_json(modules_file)
    except ReadError as e:
        raise UntrustedPipelineError(str(e)) from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UntrustedPipelineError(f"{modules_file}: expected a list of module entries (objects)")
    return [e.get("type") for e in entries]


def load_pipeline(folder: str | Path, **kwargs: Any) -> Any:
    """Load a ``SentenceTransformer`` saved with a :class:`BertblocksModule` in it, importing nothing from
    the folder.

    Every ``modules.json`` type must be in :data:`ALLOWED_MODULE_TYPES`; sentence-transformers receives
    those classes instead of their names, and is never given ``trust_remote_code``, so neither a module
    type nor a ``config.json`` / ``tokenizer_config.json`` ``auto_map`` can make it import a ``*.py``.

    Args:
        folder: the folder ``SentenceTransformer.save`` wrote.
        kwargs: passed to ``SentenceTransformer`` (``device=``, …); not ``trust_remote_code``.

    Raises:
        UntrustedPipelineError: ``modules.json`` names a class outside the allow-list (a pipeline that
            runs code bertblocks cannot vouch for: load it yourself if you trust it), or is malformed.
        TypeError: ``trust_remote_code`` was passed.
        FileNotFoundError: no ``modules.json`` in ``folder``.
    """
    from sentence_transformers import SentenceTransformer

    if "trust_remote_code" in kwargs:
        raise InputTypeError(
            "load_pipeline() takes no trust_remote_code: it never imports code from the pipeline folder"
        )
    modules_file = Path(folder) / "modules.json"
    if not modules_file.is_file():
        raise MissingFileError(f"{modules_file} not found: not a folder written by SentenceTransformer.save")
    allowed = _allowed_module_types()
    foreign = [t for t in _module_types(modules_file) if t not in allowed]
    if foreign:
        raise UntrustedPipelineError(
            f"{modules_file} names modules outside bertblocks' allow-list: {foreign} (allowed: "
            f"{MODULE_TYPE} and sentence-transformers' {', '.join(_SENTENCE_TRANSFORMERS_MODULES)}); "
            "bertblocks never imports a class a pipeline folder names"
        )
    # sentence-transformers' hook that resolves modules.json types to given classes instead of importing
    # them; without it (another version), loading would need trust_remote_code, which bertblocks never gives
    load_with_classes = getattr(SentenceTransformer, "_load_with_module_classes", None)
    if load_with_classes is None:
        raise UntrustedPipelineError(
            "this sentence-transformers version cannot be handed module classes (no "
            "SentenceTransformer._load_with_module_classes); bertblocks will not load a pipeline with "
            "trust_remote_code=True: install the version in constraints.txt"
        )
    return load_with_classes(str(folder), allowed, trust_remote_code=False, **kwargs)


#: every ``modules.json`` type :func:`load_pipeline` accepts (computed when sentence-transformers is importable)
ALLOWED_MODULE_TYPES: tuple[str, ...] = tuple(_allowed_module_types())

__all__ = ["ALLOWED_MODULE_TYPES", "MODULE_TYPE", "BertblocksModule", "UntrustedPipelineError", "load_pipeline"]
