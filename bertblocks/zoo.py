"""The model zoo: named presets in, models out (``list_presets``, ``get_preset``, ``create_model``).

Presets come from plugins through the ``bertblocks_register_presets`` hook; the built-in ones are the YAML
files in ``bertblocks/presets/``. A preset is an ordinary config, so everything a config file accepts applies:
dotted overrides, per-layer overrides, another attention backend.

Example:
    >>> import bertblocks
    >>> bertblocks.list_presets("bert-*-uncased")
    ['bert-base-uncased', 'bert-large-uncased', 'bert-medium-uncased', 'bert-mini-uncased', ...]
    >>> model = bertblocks.create_model("bert-tiny-uncased", overrides={"encoder.attention.backend": "eager"})
    >>> model = bertblocks.create_model("all-minilm-l6-v2", pretrained=bertblocks.sentence.minilm_path())
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from .config import ConfigError
from .config_files import apply_overrides
from .core.component import Preset
from .hf.hub import resolve_pretrained
from .models.backbone import BertModel
from .models.meta_device import deferred_init, materialize
from .models.task_models import BertTaskModel, task_model_class
from .registry import Registry, get_registry


def list_presets(pattern: str = "*", *, registry: Registry | None = None) -> list[str]:
    """Names of the registered presets that match ``pattern`` (``fnmatch`` wildcards), sorted.

    Args:
        pattern: ``"*"`` for all, ``"bert-*-cased"``, ``"*relative*"``, ``"bert-[bl]*"``, …
        registry: where presets are looked up (default: the process-wide registry).

    Example:
        >>> list_presets("*relative-key")
        ['bert-base-uncased-relative-key', 'bert-mini-uncased-relative-key', 'bert-tiny-uncased-relative-key']
    """
    names = [p.name for p in (registry or get_registry()).presets()]
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def get_preset(name: str, *, registry: Registry | None = None) -> Preset:
    """The preset called ``name``: its raw config, description and the plugin that provides it.

    Raises:
        UnknownPresetError: the message names the closest presets and every available one.
    """
    return (registry or get_registry()).get_preset(name)


def create_model(
    name: str,
    *,
    head: str | Mapping[str, Any] | None = None,
    pretrained: str | Path | None = None,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    registry: Registry | None = None,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    token: str | bool | None = None,
    strict: bool = True,
    **fields: Any,
) -> BertModel | BertTaskModel:
    """Build the architecture of preset ``name``, optionally with a head and pretrained weights.

    Args:
        name: a preset (see :func:`list_presets`).
        head: a task head by name (``"masked_lm"``) or as a spec with its options
            (``{"name": "sequence_classification", ...}``); the model is then the matching task class
            (:class:`~bertblocks.BertForMaskedLM`, …, with HF's checkpoint keys). ``None`` builds the backbone,
            :class:`~bertblocks.BertModel` (unless an override sets ``head``).
        pretrained: a checkpoint directory or hub id whose weights are loaded into the preset's architecture
            (its ``config.json`` is not used: the preset and overrides decide the architecture, and weights that
            do not fit raise :class:`~bertblocks.CheckpointError`). With a head, a backbone-only checkpoint
            leaves the head newly initialised (reported, as transformers does).
        overrides: dotted keys, as a mapping (``{"encoder.attention.backend": "eager"}``) or as
            ``["encoder.num_layers=4"]`` strings whose values are parsed as YAML; what ``--set`` does on the
            command line.
        registry: where presets and components are looked up (default: the process-wide registry).
        revision: hub branch, tag or commit, for a hub id in ``pretrained``.
        cache_dir: hub cache directory.
        local_files_only: use the hub cache only (``HF_HUB_OFFLINE=1`` does the same).
        token: hub token for private repositories.
        strict: with ``pretrained``, backbone weights missing from the checkpoint are an error.
        **fields: top-level config fields, e.g. ``num_labels=3`` or ``hidden_dropout_prob=0.0`` (applied before
            ``overrides``).

    Returns:
        The model: randomly initialised as HF initialises BERT and in training mode; or, with ``pretrained``,
        holding those weights and in eval mode (as transformers' ``from_pretrained`` returns a model).

    Raises:
        UnknownPresetError: no preset of that name (the closest are named).
        ConfigError: an override makes the config invalid (every problem, with its dotted path).
        BuildError: a head the config cannot serve (e.g. one reading the pooled output with ``pooler: null``).
        FileNotFoundError: ``pretrained`` is neither a directory nor a hub id that can be found.
        CheckpointError: the pretrained weights do not fit the architecture.

    Example:
        >>> model = create_model("bert-mini-uncased-relative-key", overrides={"encoder.num_layers": 2})
        >>> model = create_model("bert-base-uncased", pretrained="google-bert/bert-base-uncased")
        >>> classifier = create_model("bert-tiny-uncased", head="sequence_classification", num_labels=3)
    """
    reg = registry or get_registry()
    data = copy.deepcopy(dict(reg.get_preset(name).config))
    data.update(fields)
    if head is not None:
        data["head"] = {"name": head} if isinstance(head, str) else dict(head)
    data = apply_overrides(data, overrides)
    spec = data.get("head")
    head_name = spec if isinstance(spec, str) else spec.get("name") if isinstance(spec, Mapping) else None
    model: BertModel | BertTaskModel
    directory = None
    if pretrained is not None:  # resolved first: a missing checkpoint fails before anything is built
        directory = resolve_pretrained(
            pretrained, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token
        )
    try:
        # with weights to come, parameters start on the meta device, as in PretrainedModel.from_pretrained
        with deferred_init() if directory is not None else nullcontext():
            if head_name is None:
                model = BertModel.from_config(data, registry=reg)
            else:
                model = task_model_class(head_name).from_config(data, head=head_name, registry=reg)
    except ConfigError as e:
        raise ConfigError(e.issues, f"preset {name}") from None
    if directory is not None:
        model.load_checkpoint(directory, strict=strict)
        materialize(model, model.initializer_std())
        model.eval()  # as transformers' from_pretrained returns it
    return model


__all__ = ["create_model", "get_preset", "list_presets"]
