"""Checkpoint key maps: how the tensor names of a checkpoint layout become the model's, and back.

A :class:`KeyMap` is the one object the loading path (:func:`bertblocks.models.pretrained.map_checkpoint_keys`)
and the saving path (:meth:`bertblocks.models.pretrained.PretrainedModel.save_pretrained`) consult for
names: renames, legacy spellings, fused tensors split or joined. The base-model prefix (``bert.``) is *not*
a key map's business: it depends on the model class (backbone or task model), not on the checkpoint
layout, and the loading path handles it after the key map ran.

A model family whose checkpoints differ from BERT's supplies its own key map; BERT's is
:data:`BERT_KEY_MAP` (legacy ``LayerNorm.gamma``/``beta`` names read as ``weight``/``bias``, nothing else).

Example:
    >>> renames = SuffixRenames(load={"LayerNorm.gamma": "LayerNorm.weight"})
    >>> sorted(renames.to_model({"x.LayerNorm.gamma": t}))
    ['x.LayerNorm.weight']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from ..families.keymap import LEGACY_SUFFIXES


@runtime_checkable
class KeyMap(Protocol):
    """Translates state-dict keys (and, for splits and joins, tensors) between a checkpoint and the model.

    Both methods take and return a whole state dict, so a map may split one tensor into several (a fused
    QKV weight) or join several into one, not only rename. They must not change tensors they do not map.
    """

    def to_model(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Checkpoint keys (as read from the files) → the model's keys (before the base-model prefix)."""
        ...

    def to_checkpoint(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's keys → the keys the checkpoint layout stores (what ``save_pretrained`` writes)."""
        ...


@dataclass(frozen=True)
class SuffixRenames:
    """Renames by key suffix: ``load`` applies when reading; ``save`` when writing (empty: keys kept).

    Attributes:
        load: checkpoint suffix → model suffix (``"LayerNorm.gamma"`` → ``"LayerNorm.weight"``).
        save: model suffix → checkpoint suffix.
    """

    load: Mapping[str, str] = field(default_factory=dict)
    save: Mapping[str, str] = field(default_factory=dict)

    def to_model(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {_rename(key, self.load): tensor for key, tensor in state.items()}

    def to_checkpoint(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {_rename(key, self.save): tensor for key, tensor in state.items()}


def _rename(key: str, suffixes: Mapping[str, str]) -> str:
    for old, new in suffixes.items():
        if key.endswith(old):
            return key[: -len(old)] + new
    return key


#: BERT's layout: the model's keys are the checkpoint's, apart from legacy LayerNorm spellings on load
BERT_KEY_MAP: KeyMap = SuffixRenames(load=LEGACY_SUFFIXES)


__all__ = ["BERT_KEY_MAP", "KeyMap", "SuffixRenames"]
