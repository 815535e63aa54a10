"""What a run's result depends on besides its config and seed: the code and the data.

A finished run is reused on resume only when its fingerprint matches (see
:func:`bertblocks.ablation.runner.run_study`). Besides the study's own settings, the fingerprint holds:

* :func:`code_version`: the versions of bertblocks and torch, and a hash of bertblocks' own Python
  sources (so an edited checkout, whose version string does not change, re-runs instead of reusing
  numbers an older code produced);
* :func:`plugin_versions`: the distribution and version of each plugin whose components a variant uses;
* :func:`data_fingerprint`: a hash of the token tensors every run trains on (the corpus as tokenised by the
  study's tokenizer, cut to the study's sequence length), so a changed corpus file or tokenizer re-runs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
from functools import cache
from pathlib import Path
from typing import Any

import torch

from bertblocks.config import BertConfig, merge_spec

from .data import PreparedData


@cache
def source_hash() -> str:
    """A hash of every ``.py`` file of the bertblocks package (paths and contents)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def code_version() -> dict[str, Any]:
    """The code every run executes: bertblocks (version and source hash) and torch."""
    try:
        version = metadata.version("bertblocks")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"bertblocks": version, "source": source_hash(), "torch": torch.__version__}


def components_used(config: BertConfig) -> list[tuple[str, str]]:
    """Every ``(kind, name)`` a config builds from, per-layer overrides and the activation included."""
    used = {("embedding", config.embedding.name), ("position", config.position.name)}
    if config.pooler is not None:
        used.add(("pooler", config.pooler.name))
    if config.head is not None:
        used.add(("head", config.head.name))
    enc = config.encoder
    specs = [(enc.attention, enc.feedforward)]
    for override in enc.overrides:
        specs.append(
            (
                merge_spec(enc.attention, override.attention or {}),
                merge_spec(enc.feedforward, override.feedforward or {}),
            )
        )
    for attention, feedforward in specs:
        used |= {("attention", attention.name), ("backend", attention.backend.name)}
        used |= {("feedforward", feedforward.name), ("activation", feedforward.activation)}
    return sorted(used)


def plugin_versions(config: BertConfig) -> list[str]:
    """``distribution==version`` of every plugin that provides a component ``config`` uses: installing,
    upgrading or removing a plugin re-runs exactly the variants built from its components."""
    from bertblocks.registry import RegistryError, get_registry

    registry = get_registry()
    origins = {p.name: f"{p.distribution}=={p.version}" for p in registry.plugins()}
    out = set()
    for kind, name in components_used(config):
        try:
            provider = registry.get(kind, name).provider
        except RegistryError:  # unknown or clashing: the run itself will say so
            out.add(f"{kind} {name}: unavailable")
            continue
        out.add(origins.get(provider.split(" (", 1)[0], provider))
    return sorted(out)


def data_fingerprint(data: PreparedData | None) -> str | None:
    """A hash of the tensors every run of the study trains and evaluates on (``None`` without training)."""
    if data is None:
        return None
    digest = hashlib.sha256()
    for tensor in (data.train_ids, data.train_mask, data.eval_ids, data.eval_mask, data.train_labels, data.eval_labels):
        if tensor is None:
            digest.update(b"-")
            continue
        digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    digest.update(str((data.vocab_size, data.pad_id, data.cls_id, data.sep_id, data.mask_id)).encode())
    return digest.hexdigest()[:16]
