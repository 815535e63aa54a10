"""Model families at loading and saving: the family a ``model_type`` names, and checkpoint keys both ways.

Every checkpoint goes through its family's declarative key map (:mod:`bertblocks.families.keymap`) on its way
into a model and out of it: the loaders and savers call :func:`checkpoint_to_model` and
:func:`model_to_checkpoint`. A ``config.json`` goes through the same family in
:mod:`bertblocks.hf.config_json`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..config import BertConfig, ComponentSpec, ConfigError, ConfigIssue
from ..families.family import Family
from ..families.keymap import BACKBONE_PREFIX, KeyMapError, to_checkpoint, to_model
from ..registry import Registry, UnknownComponentError, get_registry
from ..registry.builder import build_component
from .weights import CheckpointError


class UnknownFamilyError(ConfigError):
    """A ``model_type`` no family plugin handles; lists those that exist."""


def get_family(model_type: str, registry: Registry | None = None, source: str | None = "config.json") -> Family:
    """The family registered for ``model_type``.

    Raises:
        UnknownFamilyError: no plugin registers it; the message lists the families that exist.
    """
    reg = registry or get_registry()
    try:
        reg.get("family", model_type)  # an unknown family is a config error, naming the families that exist
    except UnknownComponentError:
        known = sorted(c.name for c in reg.components("family"))
        raise UnknownFamilyError(
            [
                ConfigIssue(
                    "model_type",
                    f"no model family handles {model_type!r}; families: {', '.join(known)} "
                    "(a plugin can add one: see docs/explanation/model-families.md)",
                )
            ],
            source,
        ) from None
    # built by the builder's one mechanism: the family contract's arguments and type, errors naming the provider
    family: Family = build_component(
        "family", ComponentSpec(name=model_type), where=f"family {model_type!r}", loc="model_type", registry=reg
    )
    return family


# -------------------------------------------------------------------------------------------- checkpoints
def checkpoint_to_model(
    state: Mapping[str, torch.Tensor],
    config: BertConfig,
    shapes: Mapping[str, Iterable[int]],
    *,
    registry: Registry | None = None,
    strict: bool = True,
) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under the family's keys → bertblocks' keys (backbone under ``bert.``).

    Args:
        state: the checkpoint as read from its files.
        config: the model's config (its ``family`` and ``head`` choose the rules).
        shapes: the model's keys (backbone under ``bert.``) → shapes: sizes fused parts, expands shared layers.
        registry: where the family is looked up.
        strict: a key that fits neither the backbone nor any head of the family is an error.

    Raises:
        CheckpointError: a key that fits nowhere (strict), or one the key map cannot translate (a fused tensor
            of the wrong size names the key and the expected shape).
    """
    family = get_family(config.family, registry, source=None)
    key_map = family.key_map
    if family.prepare_checkpoint is not None:  # what no rename expresses (LoRA adapters merged for a task)
        try:
            state = family.prepare_checkpoint(state, config)
        except KeyMapError as e:
            raise CheckpointError(f"{family.model_type} checkpoint: {e}") from None
    # old Google conversions' LayerNorm.gamma/beta: renamed by the key map itself (to_model), in every family
    renamed = dict(state)
    prefix = key_map.prefix + "."
    if renamed and not any(k.startswith(prefix) for k in renamed):
        # a backbone-only checkpoint (RobertaModel.save_pretrained writes no `roberta.`)
        renamed = {prefix + k: v for k, v in renamed.items()}
    if strict:
        # the model's own keys (a third-party head's) fit, whatever the family knows
        nowhere = [k for k in renamed if k not in shapes and not key_map.knows(k)]
        if nowhere:
            raise CheckpointError(
                f"checkpoint keys fit nowhere in a {family.model_type} model (neither its backbone "
                f"{key_map.prefix!r} nor a head it knows): {', '.join(nowhere)}"
            )
    head = config.head.name if config.head is not None else None
    try:
        return to_model(renamed, key_map, head=head, shapes=shapes)
    except KeyMapError as e:
        raise CheckpointError(f"{family.model_type} checkpoint: {e}") from None


def model_to_checkpoint(
    state: Mapping[str, torch.Tensor], config: BertConfig, *, registry: Registry | None = None
) -> dict[str, torch.Tensor]:
    """bertblocks' tensors (backbone under ``bert.``) → the family's checkpoint keys.

    Raises:
        CheckpointError: the model holds something the family's format cannot store.
    """
    family = get_family(config.family, registry, source=None)
    head = config.head.name if config.head is not None else None
    try:
        return to_checkpoint(state, family.key_map, head=head)
    except KeyMapError as e:
        raise CheckpointError(f"cannot save as {family.model_type}: {e}") from None


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """``state`` with ``prefix.`` removed where keys have it (a backbone saved or loaded alone)."""
    p = prefix + "."
    return {k[len(p) :] if k.startswith(p) else k: v for k, v in state.items()}


def add_prefix(state: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {f"{prefix}.{k}": v for k, v in state.items()}


def known_families(registry: Registry | None = None) -> list[Family]:
    """Every registered family, sorted by ``model_type``."""
    reg = registry or get_registry()
    return [get_family(c.name, reg) for c in reg.components("family")]


class FamilyKeyMap:
    """A model's family key map bound to the model, at the loading path's plug point
    (``PretrainedModel.checkpoint_key_map``): a :class:`~bertblocks.families.keymap.KeyMap` (by its two methods)
    that applies the family's rules (``config.family``) with the model's head and shapes.

    It knows the model (its shapes size fused parts and expand shared layers), its config (family and head)
    and whether it is a bare backbone, so that the loading path's base-model prefix step finds bertblocks' own
    ``bert.`` keys afterwards. Loading through it is strict: a key that fits nowhere is an error naming it.

    Args:
        model: the model being loaded or saved.
        config: its config.
        backbone: ``True`` for a bare backbone (its own keys carry no ``bert.``).
        registry: where the family is looked up.
    """

    def __init__(
        self, model: torch.nn.Module, config: BertConfig, *, backbone: bool, registry: Registry | None = None
    ) -> None:
        self.model = model
        self.config = config
        self.backbone = backbone
        self.registry = registry

    def _shapes(self) -> dict[str, Any]:
        shapes = {k: v.shape for k, v in self.model.state_dict().items()}
        return add_prefix(shapes, BACKBONE_PREFIX) if self.backbone else shapes

    def to_model(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The family's checkpoint keys → bertblocks' (backbone under ``bert.``; the loading path then strips
        it for a bare backbone)."""
        return checkpoint_to_model(state, self.config, self._shapes(), registry=self.registry)

    def to_checkpoint(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """bertblocks' keys → the family's; a bare backbone is written without the family's prefix, as
        transformers writes base models."""
        if not self.backbone:
            return model_to_checkpoint(state, self.config, registry=self.registry)
        stored = model_to_checkpoint(add_prefix(state, BACKBONE_PREFIX), self.config, registry=self.registry)
        family = get_family(self.config.family, self.registry, source=None)
        return strip_prefix(stored, family.key_map.prefix)
