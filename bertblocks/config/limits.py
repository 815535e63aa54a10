"""Resource limits checked before any work: how deep and how big a model a config may ask for.

A config (or an HF ``config.json``) someone sends you is data, but data that says how much memory to
allocate: ``num_layers: 1000000`` or ``hidden_size: 10000000`` would otherwise build until the machine runs
out of memory. Every model is therefore checked against two limits before anything is allocated:

==========================  ===================  ==============================================================
limit                       default              raise it with
==========================  ===================  ==============================================================
layers in the stack         1024                 ``BERTBLOCKS_MAX_LAYERS=4096``
parameters and buffers      4,000,000,000        ``BERTBLOCKS_MAX_PARAMETERS=12e9`` (16 GB in float32)
labels (``num_labels``)     1,000,000            ``BERTBLOCKS_MAX_LABELS=5e6``
runs of an ablation study   10,000               ``BERTBLOCKS_MAX_STUDY_RUNS=1e5``
==========================  ===================  ==============================================================

The defaults are far above every BERT-family checkpoint published (XLM-R XL has 3.5 B parameters; extreme
multi-label classifiers have a few hundred thousand labels); a value of ``0`` or ``none`` switches a limit off.
The environment is read at every check, so a test or a long-lived process can change it.

The layer limit is checked wherever a per-layer list would be made before the builder runs: a family reading
``config.json`` calls :func:`check_layer_count` before it spells out one entry per layer (ModernBERT's
``layer_types``), and the label limit is checked before the default label names are made (``num_labels``
builds ``id2label``). Checks that compare layers (weight sharing) work on the layers that overrides name, never
on every layer.

The parameter limit is checked twice before anything is allocated. First against an *estimate* of the standard
layout (:func:`estimate_size`: embeddings, per layer the attention projections, the feed-forward block and two
norms, the pooler), which costs nothing and stops a million layers before even they are built on the meta device.
Then against the model itself: the builder builds it on the ``meta`` device (shapes only) and sums what it really
holds, parameters and buffers, a plugin component's included (:func:`check_allocation`, called by
:func:`bertblocks.registry.builder.measure_allocation`); tables sized by buckets, kernels or positions, which no
formula of the standard layout knows, are counted there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import BertBlocksError

if TYPE_CHECKING:
    from .schema import BertConfig

MAX_LAYERS_ENV = "BERTBLOCKS_MAX_LAYERS"
MAX_PARAMETERS_ENV = "BERTBLOCKS_MAX_PARAMETERS"
MAX_LABELS_ENV = "BERTBLOCKS_MAX_LABELS"
MAX_STUDY_RUNS_ENV = "BERTBLOCKS_MAX_STUDY_RUNS"
DEFAULT_MAX_LAYERS = 1024
DEFAULT_MAX_PARAMETERS = 4_000_000_000
DEFAULT_MAX_LABELS = 1_000_000
DEFAULT_MAX_STUDY_RUNS = 10_000


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


def max_labels() -> int | None:
    """The label limit now in force (``None``: no limit)."""
    return _read_limit(MAX_LABELS_ENV, DEFAULT_MAX_LABELS)


def max_study_runs() -> int | None:
    """The limit on the runs of one ablation study (variants × seeds) now in force (``None``: no limit)."""
    return _read_limit(MAX_STUDY_RUNS_ENV, DEFAULT_MAX_STUDY_RUNS)


def check_layer_count(num_layers: object, field: str = "num_hidden_layers") -> None:
    """Raise :class:`LimitError` when ``num_layers`` exceeds the layer limit; call it before making anything
    per layer (a family's ``config.json`` reader spelling out one entry per layer).

    A value that is not an integer is left to the config's own validation.

    Raises:
        LimitError: naming ``field``, the limit and the environment variable that raises it.
    """
    limit = max_layers()
    if limit is not None and isinstance(num_layers, int) and num_layers > limit:
        raise LimitError(
            f"{field}: {num_layers} layers exceed the limit of {limit}; if you mean it, raise the limit with "
            f"{MAX_LAYERS_ENV}={num_layers}"
        )


def label_limit_issue(num_labels: int) -> str | None:
    """Why ``num_labels`` is refused (above the label limit), or ``None``; checked before labels are named."""
    limit = max_labels()
    if limit is None or num_labels <= limit:
        return None
    return (
        f"{num_labels} labels exceed the limit of {limit:,}; if you mean it, raise the limit with "
        f"{MAX_LABELS_ENV}={num_labels}"
    )


def _int_option(options: dict[str, object], key: str) -> int | None:
    value = options.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def estimate_size(config: BertConfig) -> SizeEstimate:
    """Estimate the size of the model built from ``config`` without building it (no per-layer work).

    Per-layer overrides of ``intermediate_size`` are counted for the layers they name; a factorized embedding
    (``embedding.embedding_size``: tables at that width, then a projection), further type tables and a head
    (its classifier, and a masked LM narrowed to its own ``embedding_size``) are counted too, and so are a layer
    kind's stacked feed-forward blocks (``num_feedforward_networks``, at the hidden width: an upper bound).
    """
    hidden, enc = config.hidden_size, config.encoder
    embedding = config.embedding.options()
    width = _int_option(embedding, "embedding_size") or hidden
    rows = config.vocab_size + config.max_position_embeddings + config.type_vocab_size
    extra = embedding.get("extra_type_tables")
    if isinstance(extra, dict):
        rows += sum(size for size in extra.values() if isinstance(size, int))
    embeddings = rows * width + 2 * width
    if _int_option(embedding, "embedding_size"):
        embeddings += width * hidden + hidden  # the projection to the hidden size
    attention = 4 * hidden * hidden + 4 * hidden + 2 * hidden  # q, k, v, output projections; norm

    def feedforward(intermediate: int) -> int:
        return 2 * hidden * intermediate + intermediate + hidden + 2 * hidden  # two projections; norm

    # a layer kind may stack feed-forward blocks (MobileBERT's bottleneck layer: num_feedforward_networks)
    blocks = _int_option(enc.layer.options(), "num_feedforward_networks") or 1
    per_layer = attention + blocks * feedforward(enc.feedforward.intermediate_size)
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
    if config.head is not None:
        narrow = _int_option(config.head.options(), "embedding_size")
        total += hidden * hidden + config.num_labels * hidden  # a transform (or dense) and the classifier
        if narrow is not None:
            total += hidden * narrow + narrow * config.vocab_size  # a masked LM at its own width
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
            f"{config.encoder.feedforward.intermediate_size}{_embedding_size(config)}); if you mean it, raise "
            "the limit with "
            f"{MAX_PARAMETERS_ENV}={estimate.parameters:.3g}"
        )
    return estimate


def check_allocation(elements: int, nbytes: int, tensors: Iterable[tuple[str, torch.Tensor]] = ()) -> None:
    """Raise :class:`LimitError` when a model measured on the meta device (``elements`` parameter and buffer values,
    ``nbytes`` bytes) exceeds the parameter limit; the message names its largest tensors.

    Called by the builder (:func:`bertblocks.registry.builder.measure_allocation`) before any real module is made.

    Raises:
        LimitError: naming the size, the largest tensors and the environment variable that raises the limit.
    """
    limit = max_parameters()
    if limit is None or elements <= limit:
        return
    largest = sorted(tensors, key=lambda item: item[1].numel(), reverse=True)[:3]
    named = ", ".join(f"{name} {list(t.shape)}" for name, t in largest)
    raise LimitError(
        f"the model would be too big: {elements:,} parameter and buffer values ({_human_bytes(nbytes)}), above the "
        f"limit of {limit:,}{f'; the largest: {named}' if named else ''}; if you mean it, raise the limit with "
        f"{MAX_PARAMETERS_ENV}={elements:.3g}"
    )


def _embedding_size(config: BertConfig) -> str:
    size = _int_option(config.embedding.options(), "embedding_size")
    return f", embedding_size {size}" if size is not None else ""


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{n} B"  # pragma: no cover
