"""The public model class: an assembled backbone that loads and saves HF BERT checkpoints."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config_files import ConfigSource, load_config, with_backend
from ..core.config import BertConfig
from ..core.encoder import EncoderModel, init_weights
from ..hf.hub import resolve_pretrained
from ..hf.weights import (
    LoadingInfo,
    find_weights,
    match_state_dict,
    normalize_keys,
    read_state_dict,
    untied_state_dict,
    write_checkpoint,
)
from ..registry import Registry, build_components, get_registry
from .meta_device import deferred_init, load_into, materialize

logger = logging.getLogger("bertblocks")


class BertModel(EncoderModel):
    """A BERT backbone assembled from a config; a drop-in for transformers' ``BertModel``.

    Example:
        >>> model = BertModel.from_pretrained("path/to/bert")          # HF checkpoint directory
        >>> out = model(input_ids, attention_mask=mask)
        >>> out.last_hidden_state.shape
    """

    #: key prefix of the backbone in task checkpoints (``bert.encoder...``); a bare backbone has none
    base_model_prefix = "bert"

    @classmethod
    def from_config(
        cls,
        config: ConfigSource,
        overrides: Sequence[str] | Mapping[str, Any] = (),
        *,
        registry: Registry | None = None,
        add_pooling_layer: bool = True,
    ) -> BertModel:
        """Build a randomly initialised model (HF's initialisation) from a config, a file or a dict."""
        cfg = load_config(config, overrides, registry)
        if not add_pooling_layer and cfg.pooler is not None:
            cfg = cfg.model_copy(update={"pooler": None})
        parts = build_components(cfg, registry or get_registry())
        model = cls(cfg, parts.embeddings, parts.encoder, parts.pooler, parts.position)
        init_weights(model, cfg.initializer_range)
        pruned = {int(k): list(v) for k, v in cfg.pruned_heads.items()}
        if pruned:
            model.prune_heads(pruned)
        return model

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        overrides: Sequence[str] | Mapping[str, Any] = (),
        *,
        registry: Registry | None = None,
        attn_implementation: str | None = None,
        add_pooling_layer: bool = True,
        strict: bool = True,
        output_loading_info: bool = False,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        token: str | bool | None = None,
    ) -> BertModel | tuple[BertModel, LoadingInfo]:
        """Load an HF BERT checkpoint: a directory (``config.json`` + weights) or a hub id.

        Args:
            path: directory with ``config.json`` and ``model.safetensors`` (or a sharded index, or
                ``pytorch_model.bin``), or a hub id (``"org/name"``) resolved by
                :func:`bertblocks.hub.resolve_pretrained`, which fetches only those files.
            overrides: dotted config overrides applied to the checkpoint's config.
            registry: where components are looked up.
            attn_implementation: ``"eager"``/``"sdpa"``/a plugin backend, as in transformers; same as the
                override ``encoder.attention.backend=...``.
            add_pooling_layer: ``False`` drops the pooler (its weights become unexpected, not an error).
            strict: missing backbone weights are an error (``False``: keep them as initialised, report them).
            output_loading_info: also return the :class:`LoadingInfo`.
            revision: hub branch, tag or commit.
            cache_dir: hub cache directory (default: ``huggingface_hub``'s).
            local_files_only: use the hub cache only (``HF_HUB_OFFLINE=1`` does the same).
            token: hub token for private repositories.

        Raises:
            FileNotFoundError: no config or weights at ``path`` (a hub id not found, or offline and not cached:
                :class:`bertblocks.hub.PretrainedNotFoundError`).
            ConfigError: the config is invalid.
            CheckpointError: weights that do not fit (wrong shape, foreign architecture, missing).
        """
        directory = resolve_pretrained(
            path, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token
        )
        extra = with_backend(overrides, attn_implementation)
        # Parameters start on the meta device: the checkpoint's tensors become the parameters, and only
        # what it lacks is initialised (no random init of weights about to be overwritten, no second copy).
        with deferred_init():
            model = cls.from_config(directory, extra, registry=registry, add_pooling_layer=add_pooling_layer)
        info = model.load_checkpoint(directory, strict=strict)
        materialize(model, model.config.initializer_range)
        return (model, info) if output_loading_info else model

    def load_checkpoint(self, directory: str | Path, strict: bool = True) -> LoadingInfo:
        """Load the weights of an HF checkpoint directory into this model; report what did not fit."""
        state = normalize_keys(read_state_dict(find_weights(Path(directory))), f"{self.base_model_prefix}.")
        position = self.config.position.name
        ignorable = self.position_scheme.ignored_checkpoint_keys
        loadable, info = match_state_dict(self, state, ignorable=ignorable, strict=strict)
        load_into(self, loadable)
        if info.missing_keys:
            logger.warning(
                "Some weights were not in the checkpoint at %s and are newly initialised: %s",
                directory,
                ", ".join(info.missing_keys),
            )
        if info.unexpected_keys:
            logger.warning(
                "Some checkpoint weights at %s were not used (position scheme %r): %s",
                directory,
                position,
                ", ".join(info.unexpected_keys),
            )
        return info

    def save_pretrained(
        self, directory: str | Path, *, safe_serialization: bool = True, max_shard_size: int | None = None
    ) -> None:
        """Write ``config.json`` and the weights so that transformers' ``BertModel.from_pretrained`` loads them.

        Args:
            directory: created if needed.
            safe_serialization: safetensors (default) or ``pytorch_model.bin``.
            max_shard_size: split the weights into shards of at most this many bytes, with an index file.
        """
        # A backbone is saved as a backbone, whatever head its config names (a task model's `bert` shares it).
        config_json = self.config.model_copy(update={"head": None}).to_hf()
        config_json["architectures"] = ["BertModel"]
        write_checkpoint(Path(directory), untied_state_dict(self), config_json, safe_serialization, max_shard_size)

    @property
    def num_parameters(self) -> int:
        """Unique parameters (a tied weight counts once)."""
        return sum(p.numel() for p in self.parameters())


def build_model(
    config: ConfigSource,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    registry: Registry | None = None,
) -> BertModel:
    """Build a model from a config (YAML/JSON path, dict or :class:`BertConfig`) without weights."""
    return BertModel.from_config(config, overrides, registry=registry)


def from_pretrained(
    path: str | Path, overrides: Sequence[str] | Mapping[str, Any] = (), *, head: str | None = None, **kwargs: Any
) -> Any:
    """Load a checkpoint as a backbone (default) or as a task model.

    Args:
        path: checkpoint directory or hub id.
        overrides: dotted config overrides.
        head: ``None``: the backbone, :class:`BertModel` (whatever the checkpoint's ``architectures``);
            ``"auto"``: the head ``config.json``'s ``architectures`` names (``BertForMaskedLM`` → a
            :class:`~bertblocks.BertForMaskedLM`), or the backbone if it names none; a head name
            (``"sequence_classification"``): a task model with that head.
        kwargs: as for :meth:`BertModel.from_pretrained` / :meth:`bertblocks.BertTaskModel.from_pretrained`.
    """
    if head is None:
        return BertModel.from_pretrained(path, overrides, **kwargs)
    # imported here: task models are built on BertModel, so task_model imports this module
    from .task_models import task_model_class

    if head == "auto":
        directory = resolve_pretrained(
            path,
            **{k: kwargs[k] for k in ("revision", "cache_dir", "local_files_only", "token") if k in kwargs},
        )
        config = load_config(directory, overrides, kwargs.get("registry"))
        if config.head is None:
            return BertModel.from_pretrained(directory, overrides, **kwargs)
        head = config.head.name
        path = directory
    return task_model_class(head).from_pretrained(path, overrides, head=head, **kwargs)


__all__ = ["BertConfig", "BertModel", "build_model", "from_pretrained"]
