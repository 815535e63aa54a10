"""A bertblocks backbone as the first module of a sentence-transformers ``SentenceTransformer``.

sentence-transformers' own ``Transformer`` module loads its network with transformers' ``AutoModel``; this
module is its counterpart for a bertblocks :class:`~bertblocks.BertModel` (any config, hybrids and
third-party components included). It tokenizes with transformers' tokenizer of the checkpoint, runs the
model and hands ``token_embeddings`` on to sentence-transformers' ``Pooling`` / ``Normalize``, so a pipeline
built on the same weights encodes exactly as sentence-transformers' own.

Saved with the pipeline (``SentenceTransformer.save``), it writes the checkpoint (``config.json``, weights,
tokenizer) and ``bertblocks_module.json`` in the pipeline folder; ``modules.json`` names this class.
sentence-transformers refuses to import a class that is not its own unless told ``trust_remote_code=True``;
:func:`load_pipeline` first checks that ``modules.json`` names only sentence-transformers' classes and this
one, then loads with that permission (nothing is downloaded or run besides the installed bertblocks).

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
from typing import Any

import torch
from sentence_transformers.base.modules.input_module import InputModule
from transformers import AutoTokenizer

from ..models.backbone import BertModel


class BertblocksModule(InputModule):
    """The input module: bertblocks backbone + transformers' tokenizer, ``token_embeddings`` out.

    Args:
        model_name_or_path: a checkpoint directory or hub id (``config.json``, weights, tokenizer files).
        max_seq_length: longest input in tokens (default: the tokenizer's ``model_max_length``, at most the
            model's ``max_position_embeddings``).
        model: an already built backbone to use instead of loading one (its tokenizer still comes from
            ``model_name_or_path``).
        overrides: dotted config overrides for loading (``["encoder.attention.backend=eager"]``).
    """

    config_file_name = "bertblocks_module.json"
    config_keys = ["max_seq_length"]  # noqa: RUF012 (sentence-transformers' name and type)
    save_in_root = True

    def __init__(
        self,
        model_name_or_path: str | Path,
        max_seq_length: int | None = None,
        *,
        model: BertModel | None = None,
        overrides: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.auto_model = model if model is not None else BertModel.from_pretrained(model_name_or_path, overrides)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_name_or_path))
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
        """Run the backbone; add ``token_embeddings`` ``[b, s, hidden]`` (what ``Pooling`` reads)."""
        inputs = {k: features[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in features}
        features["token_embeddings"] = self.auto_model(**inputs).last_hidden_state
        return features

    def get_embedding_dimension(self) -> int:
        return int(self.auto_model.config.hidden_size)

    def get_word_embedding_dimension(self) -> int:
        """sentence-transformers' older name of :meth:`get_embedding_dimension`."""
        return self.get_embedding_dimension()

    # ------------------------------------------------------------------------------ saving, loading
    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        """Write the checkpoint, the tokenizer and this module's settings into ``output_path``."""
        self.auto_model.save_pretrained(output_path, safe_serialization=safe_serialization)
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


def load_pipeline(folder: str | Path, **kwargs: Any) -> Any:
    """Load a ``SentenceTransformer`` saved with a :class:`BertblocksModule` in it.

    Args:
        folder: the folder ``SentenceTransformer.save`` wrote.
        kwargs: passed to ``SentenceTransformer`` (``device=``, …).

    Raises:
        ValueError: ``modules.json`` names a class that is neither sentence-transformers' nor this module
            (such a pipeline would run code bertblocks cannot vouch for; load it yourself if you trust it).
        FileNotFoundError: no ``modules.json`` in ``folder``.
    """
    import json

    from sentence_transformers import SentenceTransformer

    modules_file = Path(folder) / "modules.json"
    if not modules_file.is_file():
        raise FileNotFoundError(f"{modules_file} not found: not a folder written by SentenceTransformer.save")
    foreign = [
        entry.get("type")
        for entry in json.loads(modules_file.read_text(encoding="utf-8"))
        if entry.get("type") != MODULE_TYPE and not str(entry.get("type")).startswith("sentence_transformers.")
    ]
    if foreign:
        raise ValueError(
            f"{modules_file} names modules that are neither sentence-transformers' nor bertblocks': {foreign}"
        )
    return SentenceTransformer(str(folder), trust_remote_code=True, **kwargs)


__all__ = ["MODULE_TYPE", "BertblocksModule", "load_pipeline"]
