"""The one load path and the one save path, shared by every model class (backbone, task models, encoder-decoder).

Loading (:meth:`PretrainedModel.from_pretrained`), in order:

1. **resolve** — a local directory as is, a hub id through the hub cache (:func:`bertblocks.hf.hub.resolve_pretrained`);
2. **config** — the class's ``_from_config`` reads the directory's ``config.json`` (overrides applied);
3. **build on the meta device** — inside :func:`~bertblocks.models.meta_device.deferred_init`: shapes only, no
   memory, no random initialisation of weights about to be overwritten;
4. **map keys** — :func:`map_checkpoint_keys`: the model's :class:`~bertblocks.families.keymap.KeyMap` (the one place
   a checkpoint layout's renames, legacy names and splits plug in), then the base-model prefix (``bert.``);
5. **assign** — :func:`~bertblocks.hf.weights.match_state_dict` decides key by key, and the checkpoint's tensors
   *become* the parameters (:func:`~bertblocks.models.meta_device.load_into`, no copy);
6. **initialise only what is missing** — :func:`~bertblocks.models.meta_device.materialize`, HF's rule;
7. **tie** — tied parameters (a masked-LM decoder and the token embeddings) are tied again after 5 and 6;
8. **report** — missing and unexpected keys by name, in one wording for every class (:func:`report_loading`),
   and in the returned :class:`~bertblocks.hf.weights.LoadingInfo`.

Saving (:meth:`PretrainedModel.save_pretrained`): the state dict without tied copies → the key map's
``to_checkpoint`` → ``config.json`` (:meth:`PretrainedModel.checkpoint_config`, plus the weights' ``dtype``)
and safetensors (or ``.bin``), sharded on request, replacing what the folder held as one
(:func:`~bertblocks.hf.weights.write_checkpoint`: after a kill at any step, the old checkpoint or the new one).

A class joins by inheriting :class:`PretrainedModel` and saying where its backbones sit
(:meth:`~PretrainedModel.checkpoint_backbones`), how its keys relate to a bare backbone's
(:meth:`~PretrainedModel.checkpoint_prefix`) and what its ``config.json`` is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..atomic import reading
from ..config import BertConfig
from ..config_files import with_backend
from ..families.keymap import BACKBONE_PREFIX, BERT_KEY_MAP, KeyMap
from ..hf.hub import resolve_pretrained
from ..hf.weight_files import read_companion_file
from ..hf.weights import (
    BACKBONE_PREFIXES,
    STALE_BUFFERS,
    LoadingInfo,
    find_weights,
    match_state_dict,
    read_state_dict,
    tied_parameters,
    write_checkpoint,
)
from .compiling import CompileEntry
from .meta_device import deferred_init, load_into, materialize, non_finite
from .surface import (
    LOAD_OPTIONS,
    apply_load_options,
    config_keywords,
    parse_size,
    requested_dtype,
    resolve_dtype,
    split_load_kwargs,
)

if TYPE_CHECKING:
    from ..core.encoder import EncoderModel
    from ..registry import Registry

logger = logging.getLogger("bertblocks")

P = TypeVar("P", bound="PretrainedModel")


def map_checkpoint_keys(
    state: Mapping[str, torch.Tensor], key_map: KeyMap, *, prefix: str = "", model_has_prefix: bool = False
) -> dict[str, torch.Tensor]:
    """Checkpoint keys → the model's keys: the one place where a key map plugs into loading.

    Args:
        state: the checkpoint's tensors, keys as stored.
        key_map: the checkpoint layout's map (renames, legacy names, fused tensors split); applied first.
        prefix: the base-model prefix (``"bert."``); ``""``: keys are taken as the key map leaves them.
        model_has_prefix: the model keeps its backbone under ``prefix`` (a task model): a backbone-only
            checkpoint (no key under ``prefix``) gets it added. ``False`` (a bare backbone): ``prefix`` is
            stripped where present, so a task checkpoint loads into a backbone.

    Returns:
        The tensors under the model's names (unmatched keys included: :func:`match_state_dict` reports them).

    Example:
        >>> map_checkpoint_keys({"bert.embeddings.LayerNorm.gamma": t}, BERT_KEY_MAP, prefix="bert.")
        {'embeddings.LayerNorm.weight': t}
    """
    mapped = key_map.to_model(state)
    if not prefix:
        return mapped
    has_prefix = any(key.startswith(prefix) for key in mapped)
    if model_has_prefix and not has_prefix:
        return {prefix + key: tensor for key, tensor in mapped.items()}
    if not model_has_prefix and has_prefix:
        return {key.removeprefix(prefix): tensor for key, tensor in mapped.items()}
    return mapped


def report_loading(model_name: str, source: str | Path, info: LoadingInfo) -> None:
    """Log what did not load, by name, in transformers' words (the same for every model class)."""
    if info.missing_keys:
        logger.warning(
            "Some weights of %s were not initialized from the checkpoint at %s and are newly initialized: %s. "
            "You should probably train this model on a down-stream task.",
            model_name,
            source,
            ", ".join(info.missing_keys),
        )
    if info.unexpected_keys:
        logger.warning(
            "Some weights of the checkpoint at %s were not used when initializing %s: %s",
            source,
            model_name,
            ", ".join(info.unexpected_keys),
        )


def _warn_non_finite(source: str | Path, state: Mapping[str, torch.Tensor]) -> None:
    """Warn, naming each tensor, when checkpoint weights hold NaN or inf: every output would be NaN."""
    found = non_finite(state)
    if found:
        logger.warning(
            "The checkpoint at %s holds non-finite weights (NaN or inf), so the model's outputs will be NaN: %s. "
            "The file is damaged, or was saved after training diverged",
            source,
            ", ".join(f"{name} ({count:,} values)" for name, count in found.items()),
        )


class PretrainedModel(CompileEntry):
    """Loading and saving HF checkpoints, once, for every model class (see the module docstring for the steps).

    Subclasses implement ``_from_config(config, overrides, *, registry, **build_options)`` and the three
    ``checkpoint_*`` methods; they may override :meth:`checkpoint_key_map` (a model family with another layout)
    and :meth:`backend_overrides` (where ``attn_implementation`` goes in their config).
    """

    #: key prefix of the backbone in task checkpoints (``bert.encoder…``): where task models keep it
    base_model_prefix: str = BACKBONE_PREFIX

    # ------------------------------------------------------------------------------------- what a class says
    @classmethod
    def _from_config(
        cls: type[P], config: Any, overrides: Sequence[str] | Mapping[str, Any] = (), **kwargs: Any
    ) -> P:  # pragma: no cover - every model class defines it
        raise NotImplementedError

    def checkpoint_backbones(self) -> dict[str, EncoderModel]:
        """Every backbone of this model by its key prefix (``{"bert.": self.bert}``).

        Their module prefixes (``embeddings.``, ``encoder.``) must be complete in a checkpoint (``strict``), a
        checkpoint key there that the model lacks means another architecture, and their position schemes' unused
        leftovers and stale buffers are dropped without complaint.
        """
        raise NotImplementedError  # pragma: no cover

    def checkpoint_prefix(self) -> tuple[str, bool]:
        """``(prefix, model_has_prefix)`` for :func:`map_checkpoint_keys`; ``("", False)``: keys as they are."""
        return "", False

    def checkpoint_config(self) -> dict[str, Any]:
        """The ``config.json`` that ``save_pretrained`` writes (what transformers' matching class reads)."""
        raise NotImplementedError  # pragma: no cover

    def checkpoint_key_map(self) -> KeyMap:
        """The key map of this model's checkpoint layout (BERT's by default)."""
        return BERT_KEY_MAP

    @classmethod
    def backend_overrides(
        cls, overrides: Sequence[str] | Mapping[str, Any], attn_implementation: str | None
    ) -> Sequence[str] | Mapping[str, Any]:
        """``overrides`` plus what ``attn_implementation`` (transformers' name) sets in this class's config."""
        return with_backend(overrides, attn_implementation)

    def initializer_std(self) -> float:
        """The standard deviation of the normal initialiser for weights a checkpoint lacked."""
        return float(self.config.initializer_range)  # type: ignore[attr-defined]

    # ----------------------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(
        cls: type[P],
        path: str | Path,
        overrides: Sequence[str] | Mapping[str, Any] = (),
        *,
        registry: Registry | None = None,
        attn_implementation: str | None = None,
        strict: bool = True,
        output_loading_info: bool = False,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        token: str | bool | None = None,
        **build_options: Any,
    ) -> P | tuple[P, LoadingInfo]:
        """Load an HF checkpoint: a directory (``config.json`` + weights) or a hub id.

        Args:
            path: directory with ``config.json`` and ``model.safetensors`` (or a sharded index, or
                ``pytorch_model.bin``), or a hub id (``"org/name"``) resolved by
                :func:`bertblocks.hf.hub.resolve_pretrained`, which fetches only those files.
            overrides: dotted config overrides applied to the checkpoint's config (``["num_labels=3"]``).
            registry: where components are looked up.
            attn_implementation: ``"eager"``/``"sdpa"``/a plugin backend, as in transformers; same as the
                override ``encoder.attention.backend=...``.
            strict: missing backbone weights are an error (``False``: keep them as initialised, report them).
            output_loading_info: also return the :class:`~bertblocks.hf.weights.LoadingInfo`.
            revision: hub branch, tag or commit.
            cache_dir: hub cache directory (default: ``huggingface_hub``'s).
            local_files_only: use the hub cache only (``HF_HUB_OFFLINE=1`` does the same).
            token: hub token for private repositories.
            build_options: passed to the class's ``_from_config`` (``add_pooling_layer=False`` for
                :class:`~bertblocks.BertModel`, ``head=…`` for :class:`~bertblocks.BertTaskModel`); and
                transformers' keywords: ``dtype``/``torch_dtype`` (a dtype, its name, or ``"auto"``: the
                checkpoint's), ``device_map`` (one device), and config fields (``num_labels=3``,
                ``num_hidden_layers=…``) as overrides (see :mod:`bertblocks.models.surface`).

        Raises:
            FileNotFoundError: no config or weights at ``path`` (a hub id not found, or offline and not cached:
                :class:`bertblocks.hf.hub.PretrainedNotFoundError`).
            ConfigError: the config is invalid.
            CheckpointError: weights that do not fit (wrong shape, foreign architecture, missing backbone weights).
        """
        options = {k: build_options.pop(k) for k in LOAD_OPTIONS if k in build_options}
        if getattr(cls, "takes_config_keywords", False):
            # `head` is a build option of task models (the head to attach), not the config field here
            names = [k for k in config_keywords(BertConfig.model_fields) if k != "head"]
            fields = {k: build_options.pop(k) for k in list(build_options) if k in names}
            overrides, _ = split_load_kwargs(overrides, fields, names)
        directory = resolve_pretrained(
            path, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token
        )
        extra = cls.backend_overrides(overrides, attn_implementation)
        # config and weights of one generation of the folder: no save swaps it while they are read
        with reading(directory):
            # Parameters start on the meta device: the checkpoint's tensors become the parameters, and only
            # what it lacks is initialised (no random init of weights about to be overwritten, no second copy).
            with deferred_init():
                model = cls._from_config(directory, extra, registry=registry, **build_options)
            hf_extra = getattr(model.config, "hf", None) or {}  # type: ignore[attr-defined]
            config_dtype = hf_extra.get("dtype", hf_extra.get("torch_dtype"))
            # The dtype is settled before the weights are assigned, so each tensor is cast once, straight into
            # it ("auto" without a dtype in config.json follows the weights, read in _load).
            info, weights_dtype = model._load(directory, strict, requested_dtype(options), config_dtype)
        materialize(model, model.initializer_std())
        apply_load_options(model, options, config_dtype, weights_dtype)
        model.name_or_path = str(path)
        return (model, info) if output_loading_info else model

    def load_checkpoint(self, directory: str | Path, strict: bool = True) -> LoadingInfo:
        """Load the weights of a checkpoint directory into this model; report what did not fit, by name.

        Raises:
            CheckpointError: shape mismatches, backbone weights the model has no place for, and (``strict``)
                backbone weights missing from the checkpoint.
        """
        return self._load(directory, strict)[0]

    def _load(
        self,
        directory: str | Path,
        strict: bool = True,
        dtype: torch.dtype | str | None = None,
        config_dtype: str | None = None,
    ) -> tuple[LoadingInfo, torch.dtype | None]:
        """:meth:`load_checkpoint`, casting floating-point weights straight to the dtype ``dtype`` resolves to
        (see :func:`~bertblocks.models.surface.resolve_dtype`); also returns the weights' own dtype."""
        prefix, model_has_prefix = self.checkpoint_prefix()
        with reading(directory):  # the index, every shard and the companion files of one generation
            state = read_state_dict(find_weights(Path(directory)))
            # transformers' rule for "auto" without a dtype in config.json: the first floating-point tensor's dtype
            weights_dtype = next((t.dtype for t in state.values() if t.is_floating_point()), None)
            key_map = self.checkpoint_key_map()
            state = map_checkpoint_keys(state, key_map, prefix=prefix, model_has_prefix=model_has_prefix)
            state.update(self._companion_tensors(Path(directory), state))
        _warn_non_finite(directory, state)
        target = resolve_dtype(dtype, config_dtype, weights_dtype)
        backbones = self.checkpoint_backbones()
        ignorable = [
            where + key
            for where, backbone in backbones.items()
            for key in (*backbone.position_scheme.ignored_checkpoint_keys, *STALE_BUFFERS)
        ]
        required = tuple(where + module for where in backbones for module in BACKBONE_PREFIXES)
        loadable, info = match_state_dict(self, state, ignorable=ignorable, required_prefixes=required, strict=strict)
        load_into(self, loadable, target)
        report_loading(type(self).__name__, directory, info)
        return info, weights_dtype

    def checkpoint_companion_files(self) -> Mapping[str, str]:
        """Module name → the stem of a weight file of the module's own beside the checkpoint, read when the weight
        files hold none of its tensors (a head's :attr:`~bertblocks.core.interfaces.Head.companion_files`)."""
        return {}

    def _companion_tensors(self, directory: Path, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors of every companion file whose module the checkpoint's weights leave out, under the model's
        names (:func:`~bertblocks.hf.weight_files.read_companion_file`)."""
        found: dict[str, torch.Tensor] = {}
        for module, stem in self.checkpoint_companion_files().items():
            if any(key.startswith(f"{module}.") for key in state):
                continue  # saved with the rest (by save_pretrained): those win
            shapes = {key: tensor.shape for key, tensor in self.get_submodule(module).state_dict().items()}
            tensors = read_companion_file(directory, stem, shapes)
            found.update({f"{module}.{key}": tensor for key, tensor in (tensors or {}).items()})
        return found

    # ------------------------------------------------------------------------------------------ saving
    def save_pretrained(
        self,
        save_directory: str | Path,
        *,
        is_main_process: bool = True,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        safe_serialization: bool = True,
        max_shard_size: int | str | None = None,
        push_to_hub: bool = False,
        **hub_kwargs: Any,
    ) -> None:
        """Write ``config.json`` and the weights, without tied copies, so that transformers' matching class
        (and its Auto classes) load them with no missing or unexpected keys.

        The folder's earlier checkpoint is replaced as one: a kill at any moment leaves the old checkpoint or
        the new one, never a mix (see :mod:`bertblocks.atomic`); weight files of the old one that the new one
        does not use are removed; other files (a tokenizer) stay.

        Args:
            save_directory: created if needed.
            is_main_process: ``False`` writes nothing (the other ranks of a distributed run).
            state_dict: the tensors to write instead of the model's own (what transformers' Trainer, PEFT and
                accelerate pass); keys are the model's; the second names of tied weights are dropped.
            safe_serialization: safetensors (default) or ``pytorch_model.bin``.
            max_shard_size: split the weights into shards of at most this size (bytes, or ``"5GB"``, ``"200MB"``),
                with an index file; default: one file.
            push_to_hub: also upload the folder (``push_to_hub``'s upload; ``hub_kwargs`` go there, ``repo_id``
                defaulting to the folder's name).

        Raises:
            ValueError: a ``max_shard_size`` that is not a size.
            WriteError: the folder is a file or cannot be written (read-only, disk full); the checkpoint it
                held is unchanged (:class:`bertblocks.atomic.WriteError`, an ``OSError``).
        """
        if not is_main_process:
            return
        size = parse_size(max_shard_size)
        tied = tied_parameters(self)
        state = dict(state_dict) if state_dict is not None else self.state_dict()
        state = self.checkpoint_key_map().to_checkpoint({k: v for k, v in state.items() if k not in tied})
        directory = Path(save_directory)
        config = dict(self.checkpoint_config())
        dtype = _stored_dtype(state.values()) or _stored_dtype(self.parameters())
        if dtype is not None:
            # as transformers writes it: `dtype` (5.x) and `torch_dtype` (what 4.x reads); and, as transformers
            # sets `config.dtype` on save, the model's config keeps them too, so that it equals the reloaded one
            name = str(dtype).removeprefix("torch.")
            config["dtype"] = config["torch_dtype"] = name
            kept = getattr(self.config, "hf", None)  # type: ignore[attr-defined]
            if isinstance(kept, dict) and (kept.get("dtype"), kept.get("torch_dtype")) != (name, name):
                self.config.hf = {**kept, "dtype": name, "torch_dtype": name}  # type: ignore[attr-defined]
        write_checkpoint(directory, state, config, safe_serialization, size)
        if push_to_hub:
            repo_id = hub_kwargs.pop("repo_id", directory.name)
            self._upload(directory, repo_id, **hub_kwargs)  # type: ignore[attr-defined]


def _stored_dtype(tensors: Iterable[torch.Tensor]) -> torch.dtype | None:
    """The dtype transformers records for a model: that of its first floating-point tensor."""
    return next((t.dtype for t in tensors if t.is_floating_point()), None)


__all__ = ["PretrainedModel", "map_checkpoint_keys", "report_loading"]
