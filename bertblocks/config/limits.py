"""Resource limits checked before any work: how deep and how big a model a config may ask for.

A config (or an HF ``config.json``) someone sends you is data, but data that says how much memory to
allocate: ``num_layers: 1000000`` or ``hidden_size: 10000000`` would otherwise build until the machine runs
out of memory. Every model is therefore checked against two limits before anything is allocated:

==========================  ===================  ==============================================================
limit                       default              raise it with
==========================  ===================  ==============================================================
layers in the stack         1024                 ``BERTBLOCKS_MAX_LAYERS=4096``
parameters (estimated)      4,000,000,000        ``BERTBLOCKS_MAX_PARAMETERS=12e9`` (16 GB in float32)
==========================  ===================  ==============================================================

The defaults are far above every BERT-family checkpoint published (XLM-R XL has 3.5 B parameters); a value of
``0`` or ``none`` switches a limit off. The environment is read at every check, so a test or a long-lived
process can change it.

The parameter count is an *estimate* of the standard layout (embeddings, per layer the attention projections,
the feed-forward block and two norms, the pooler): a plugin component may hold somewhat more or less, which
does not matter for a limit meant to stop a model a thousand times too big.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import BertBlocksError

if TYPE_CHECKING:
    from .schema import BertConfig

MAX_LAYERS_ENV = "BERTBLOCKS_MAX_LAYERS"
MAX_PARAMETERS_ENV = "BERTBLOCKS_MAX_PARAMETERS"
DEFAULT_MAX_LAYERS = 1024
DEFAULT_MAX_PARAMETERS = 4_000_000_000


class LimitError(BertBlocksError, ValueError):
    """A config asks for more than a resource limit allows; the message says how much and how to raise it."""


@dataclass(frozen=True)
class SizeEstimate:
    """How big a model built from a config would be.

    Attributes:
        parameters: estimated parameter count.
        bytes: ``parameters`` times the element size of the default dtype (``torch.get_default_dtype()``).
        layers: layers in the stack.
    """

    parameters: int
    bytes: int
    layers: int

    def describe(self) -> str:
        return f"{self.layers} layers, about {self.parameters:,} parameters ({_human_bytes(self.bytes)})"


def _read_limit(env: str, default: int) -> int | None:
    """The limit set in ``env`` (``"12e9"``, ``"4_000_000"``; ``0``/``none`` = no limit), else ``default``."""
    text = os.environ.get(env, "").strip().lower().replace("_", "")
    if not text:
        return default
    if text in ("0", "none", "off", "inf"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise LimitError(f"{env}={os.environ[env]!r} is not a number (write e.g. 12e9, or 0 for no limit)") from None
    return int(value) if value > 0 else None


def max_layers() -> int | None:
    """The layer limit now in force (``None``: no limit)."""
    return _read_limit(MAX_LAYERS_ENV, DEFAULT_MAX_LAYERS)


def max_parameters() -> int | None:
    """The parameter limit now in force (``None``: no limit)."""
    return _read_limit(MAX_PARAMETERS_ENV, DEFAULT_MAX_PARAMETERS)


def estimate_size(config: BertConfig) -> SizeEstimate:
    """Estimate the size of the backbone built from ``config`` without building it (no per-layer work).

    Per-layer overrides of ``intermediate_size`` are counted for the layers they name.
    """
    hidden, enc = config.hidden_size, config.encoder
    embeddings = (config.vocab_size + config.max_position_embeddings + config.type_vocab_size) * hidden + 2 * hidden
    attention = 4 * hidden * hidden + 4 * hidden + 2 * hidden  # q, k, v, output projections; norm

    def feedforward(intermediate: int) -> int:
        return 2 * hidden * intermediate + intermediate + hidden + 2 * hidden  # two projections; norm

    per_layer = attention + feedforward(enc.feedforward.intermediate_size)
    if config.add_cross_attention:
        per_layer += attention
    total = embeddings + enc.num_layers * per_layer
    for override in enc.overrides:
        size = (override.feedforward or {}).get("intermediate_size")
        if isinstance(size, int) and size > enc.feedforward.intermediate_size:
            inside = sum(1 for i in override.layers if 0 <= i < enc.num_layers)
            total += inside * (feedforward(size) - feedforward(enc.feedforward.intermediate_size))
    if config.pooler is not None:
        total += hidden * hidden + hidden
    element = torch.empty((), dtype=torch.get_default_dtype()).element_size()
    return SizeEstimate(parameters=total, bytes=total * element, layers=enc.num_layers)


def check_size(config: BertConfig) -> SizeEstimate:
    """Raise :class:`LimitError` when ``config`` asks for more layers or parameters than the limits allow.

    Called by the builder before any module is made.

    Raises:
        LimitError: naming the estimated size, the limit, and the environment variable that raises it.
    """
    layers_limit = max_layers()
    if layers_limit is not None and config.encoder.num_layers > layers_limit:
        raise LimitError(
            f"encoder.num_layers: {config.encoder.num_layers} layers exceed the limit of {layers_limit}; "
            f"if you mean it, raise the limit with {MAX_LAYERS_ENV}={config.encoder.num_layers}"
        )
    estimate = estimate_size(config)
    parameters_limit = max_parameters()
    if parameters_limit is not None and estimate.parameters > parameters_limit:
        raise LimitError(
            f"the model would be too big: {estimate.describe()}, above the limit of {parameters_limit:,} "
            f"parameters (hidden_size {config.hidden_size}, vocab_size {config.vocab_size}, intermediate_size "
            f"{config.encoder.feedforward.intermediate_size}); if you mean it, raise the limit with "
            f"{MAX_PARAMETERS_ENV}={estimate.parameters:.3g}"
        )
    return estimate


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{n} B"  # pragma: no cover
