"""transformers' rotary config fields (``rope_parameters``, ``head_dim``) ↔ the ``rope`` position scheme, for the
families whose transformers classes use Llama's rotary code (NomicBERT, Jina-embeddings-v3).

That code rotates halves (``rotate_half``), the whole head, with ``inv_freq = 1 / θ^(2i/d)``: the ``rope``
scheme with ``interleaved: false`` and no partial width. Only ``rope_type: default`` exists for these families'
checkpoints; a scaled variant (``linear``, ``dynamic``, ``yarn`` …) would compute other frequencies, so it is an
error rather than a silently different model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig

from ..errors import InputError
from .fields import HFField

#: what the families fix about their rope scheme (a config.json's ``bertblocks`` block may not say otherwise)
ROPE_FIXED: dict[str, Any] = {
    "position.name": "rope",
    "position.interleaved": False,
    "position.rotary_dim": None,
    "position.rotary_fraction": None,
    "embedding.position_offset": "none",
}

#: the fields :func:`rope_from_hf` reads (a family declares them among its ``Family.fields``)
ROPE_FIELDS: dict[str, HFField] = {
    "rope_parameters": HFField(dict, nullable=True),
    "rope_theta": HFField(float, gt=0),
}


def rope_from_hf(src: dict[str, Any], default_theta: float) -> dict[str, Any]:
    """Pop ``rope_parameters`` (and a legacy top-level ``rope_theta``) from ``src``: the ``position`` spec's base
    (its name and the rest of the scheme are :data:`ROPE_FIXED`, which the family's ``fixed`` includes and the
    translator applies).

    Raises:
        ValueError: a rope type or field transformers' default rotary code does not have.
    """
    params = src.pop("rope_parameters", None) or {}
    if not isinstance(params, Mapping):
        raise InputError(f"rope_parameters must be a mapping, got {params!r}")
    theta = params.get("rope_theta", src.pop("rope_theta", default_theta))
    if isinstance(theta, bool) or not isinstance(theta, int | float):
        raise InputError(f"rope_theta must be a number; got {theta!r}")
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise InputError(
            f"rope_parameters.rope_type is {rope_type!r}; bertblocks' rope scheme computes the default frequencies "
            "only (1 / rope_theta^(2i/d))"
        )
    unknown = sorted(set(params) - {"rope_theta", "rope_type"})
    if unknown:
        raise InputError(f"rope_parameters has fields bertblocks' rope scheme cannot represent: {', '.join(unknown)}")
    return {"base": float(theta)}


def rope_to_hf(config: BertConfig) -> dict[str, Any]:
    """``rope_parameters`` of ``config``'s rope scheme, as transformers writes it."""
    base = config.position.options().get("base", 10000.0)
    return {"rope_parameters": {"rope_theta": float(base), "rope_type": "default"}}
