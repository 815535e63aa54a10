"""Building models: :func:`create_model` from a preset, a config file, a dict or a config; the zoo's presets
(``list_presets``, ``get_preset``).

Presets come from plugins through the ``bertblocks_register_presets`` hook; the built-in ones are the YAML
files in ``bertblocks/presets/``. A preset is an ordinary config, so everything a config file accepts applies:
dotted overrides, per-layer overrides, another attention backend.

Example:
    >>> import bertblocks
    >>> bertblocks.list_presets("bert-*-uncased")
    ['bert-base-uncased', 'bert-large-uncased', 'bert-medium-uncased', 'bert-mini-uncased', ...]
    >>> model = bertblocks.create_model("bert-tiny-uncased", {"encoder.attention.backend": "eager"})
    >>> model = bertblocks.create_model("all-minilm-l6-v2", pretrained=bertblocks.sentence.minilm_path())
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from .config import ConfigError
from .config_files import ConfigSource, config_data
from .core.component import Preset
from .hf.hub import resolve_pretrained
from .models.backbone import BertModel
from .models.encoder_decoder import BertEncoderDecoder, EncoderDecoderConfig
from .models.meta_device import deferred_init, materialize
from .models.task_models import BertTaskModel, task_model_class
from .registry import BuildError, Registry, get_registry


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
    source: ConfigSource | EncoderDecoderConfig,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    head: str | Mapping[str, Any] | None = None,
    pretrained: str | Path | None = None,
    registry: Registry | None = None,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    token: str | bool | None = None,
    strict: bool = True,
    **fields: Any,
) -> Any:
    """Build a model from a preset, a config file, a dict or a :class:`~bertblocks.BertConfig`; the one way to
    build one (:func:`bertblocks.from_pretrained` loads a checkpoint as the class its config names).

    Args:
        source: a preset name (see :func:`list_presets`), a YAML/JSON config file, a checkpoint directory (its
            ``config.json``; weights are not read: see ``pretrained``), a config dict (ours, or HF's flat
            ``config.json`` form) or a :class:`~bertblocks.BertConfig`. A mapping with ``encoder`` and
            ``decoder`` configs (or an :class:`~bertblocks.models.encoder_decoder.EncoderDecoderConfig`) builds
            a :class:`~bertblocks.models.encoder_decoder.BertEncoderDecoder`.
        overrides: dotted keys, as a mapping (``{"encoder.attention.backend": "eager"}``) or as
            ``["encoder.num_layers=4"]`` strings whose values are parsed as YAML; what ``--set`` does on the
            command line. Applied after ``fields``.
        head: a task head by name (``"masked_lm"``) or as a spec with its options
            (``{"name": "sequence_classification", ...}``); the model is then the matching task class
            (:class:`~bertblocks.BertForMaskedLM`, …, with HF's checkpoint keys). ``None``: the head the config
            names, if any, else the backbone :class:`~bertblocks.BertModel`. A head of the name the config
            already has keeps the config's options.
        pretrained: a checkpoint directory or hub id whose weights are loaded into the architecture built here
            (its ``config.json`` is not used: ``source`` and the overrides decide the architecture, and weights
            that do not fit raise :class:`~bertblocks.hf.weights.CheckpointError`). With a head, a backbone-only
            checkpoint leaves the head newly initialised (reported, as transformers does).
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
        UnknownPresetError: a bare name that is neither a file nor a preset (the closest are named).
        ConfigError: the config, with the fields and overrides, is invalid (every problem, with its dotted path).
        BuildError: a head the config cannot serve (e.g. one reading the pooled output with ``pooler: null``).
        FileNotFoundError: a config file, or ``pretrained``, that cannot be found (a
            :class:`~bertblocks.BertBlocksError` too).
        CheckpointError: the pretrained weights do not fit the architecture.

    Example:
        >>> model = create_model("bert-mini-uncased-relative-key", {"encoder.num_layers": 2})
        >>> model = create_model("examples/configs/bert-mini-relative.yaml")
        >>> model = create_model("bert-base-uncased", pretrained="google-bert/bert-base-uncased")
        >>> classifier = create_model("bert-tiny-uncased", head="sequence_classification", num_labels=3)
    """
    if isinstance(source, EncoderDecoderConfig) or (isinstance(source, Mapping) and "decoder" in source):
        if head is not None or pretrained is not None or fields:
            raise BuildError(
                "an encoder-decoder config takes no head, pretrained weights or fields here; set each side with "
                "overrides (decoder.encoder.num_layers=2) and load weights with BertEncoderDecoder.from_pretrained"
            )
        return BertEncoderDecoder._from_config(source, overrides, registry=registry)
    reg = registry or get_registry()
    data, where = config_data(source, fields, overrides, registry=reg)
    if head is not None:
        data["head"] = _head_spec(data.get("head"), head)
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
                model = BertModel._from_config(data, registry=registry)
            else:
                model = task_model_class(head_name)._from_config(data, head=head_name, registry=registry)
    except ConfigError as e:
        if where is None:
            raise
        raise ConfigError(e.issues, where) from None
    if directory is not None:
        model.load_checkpoint(directory, strict=strict)
        materialize(model, model.initializer_std())
        model.eval()  # as transformers' from_pretrained returns it
    return model


def _head_spec(current: Any, head: str | Mapping[str, Any]) -> Any:
    """The config's ``head`` once ``head`` is asked for: a name the config already has keeps its options."""
    if not isinstance(head, str):
        return dict(head)
    name = current if isinstance(current, str) else current.get("name") if isinstance(current, Mapping) else None
    return current if name == head else {"name": head}


__all__ = ["create_model", "get_preset", "list_presets"]
