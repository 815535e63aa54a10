"""Capabilities as declarations: what a component says about itself, so that the model, the builder and the
conformance suite act on it instead of finding out from wrong numbers.

Two declarations:

* **reads padded positions** — any component (embedding, position scheme, attention, backend, feed-forward half,
  norm, layer, pooler, head) may set the attribute ``reads_padded_positions = True`` (on the class or the
  instance). Its outputs at real tokens then depend on the hidden states at padded positions (a convolution over
  the sequence, as ConvBERT's; a softmax over every position, as question answering's), which a packed batch
  does not have (packing leaves zeros there). ``encoder.packing: auto`` then never packs that model, and
  :attr:`~bertblocks.core.encoder.EncoderModel.packing_off_reason` names the component;
  :func:`padding_readers` is the one function that finds the declarations.
  A component that reads padded positions only in *long* batches sets ``reads_padded_positions_above = N``
  instead (an ``int``): in a batch whose padded length is at most ``N`` tokens its outputs at real tokens do not
  depend on the padding (BigBird's block-sparse attention: up to its full-attention limit it attends in full, as
  BERT does; past it the block layout counts the padded length). ``auto`` then packs batches of at most ``N``
  tokens and leaves longer ones padded (:meth:`~bertblocks.core.encoder.EncoderModel.auto_packs`); the reason
  says from which length. ``reads_padded_positions = True`` is the same as ``reads_padded_positions_above = 0``.
* **what an attention module can do** — :class:`AttentionCapabilities` (attention weights for all heads, some
  or none; head pruning; the KV cache), an :class:`~bertblocks.core.interfaces.Attention`'s ``capabilities``.
  The builder refuses a config that needs what is absent (``pruned_heads``, a decoder with ``use_cache``), the
  model refuses such a call (``output_attentions``, ``prune_heads``, ``use_cache``) with a
  :class:`CapabilityError`, and the conformance suite skips the checks that do not apply with the component's
  own reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from ..errors import BertBlocksError

#: the attribute a component sets to declare that it reads padded positions
READS_PADDED_POSITIONS = "reads_padded_positions"
#: the attribute a component sets to declare that it reads padded positions in batches longer than so many tokens
READS_PADDED_POSITIONS_ABOVE = "reads_padded_positions_above"


class CapabilityError(BertBlocksError, ValueError):
    """A call or config asks a component for something it declares it cannot do (attention weights, head
    pruning, the KV cache); the message names the component, the layer and its reason."""


@dataclass(frozen=True)
class AttentionCapabilities:
    """What an attention module (kind ``attention``) can do; declared, checked when the model is built.

    Attributes:
        attention_weights: which heads ``output_attentions=True`` returns probabilities for: ``"all"`` (``[b, h,
            q, k]``), ``"some"`` (``[b, h', q, k]`` with ``0 < h' < h``: ConvBERT's self-attention heads, its
            convolution heads have none) or ``"none"`` (the model refuses ``output_attentions``). The backend
            must also claim ``attention_weights`` for any to come back.
        pruning: ``prune_heads`` works (the projections can lose a head without changing the others).
        cache: the module appends to and attends over a :class:`~bertblocks.core.cache.KVCache` (decoding).
        reason: why something is absent, in the component's words: shown in the errors and in the conformance
            suite's skips.
    """

    attention_weights: Literal["all", "some", "none"] = "all"
    pruning: bool = True
    cache: bool = True
    reason: str = ""

    def refusal(self, what: str) -> str:
        """``what`` (``"cannot return attention weights"``) with the declared reason, for messages."""
        return f"{what} ({self.reason})" if self.reason else what


@dataclass(frozen=True)
class PaddingReader:
    """A component that declares reading padded positions, as :func:`padding_readers` finds it.

    Attributes:
        path: where it sits in the model (``encoder.layer.0.attention``; ``position``, ``head``).
        class_name: its class.
        above: it reads padded positions in batches whose padded length exceeds this many tokens; ``0``: in every
            batch (``reads_padded_positions = True``).
    """

    path: str
    class_name: str
    above: int = 0

    def reads_at(self, length: int) -> bool:
        """Whether it reads padded positions in a batch padded to ``length`` tokens."""
        return length > self.above

    def __str__(self) -> str:
        """``path (Class)``, or ``path (Class, above N tokens)`` for a length-dependent declaration."""
        when = f", above {self.above} tokens" if self.above else ""
        return f"{self.path} ({self.class_name}{when})"


def padded_reads_above(component: Any, where: str = "") -> int | None:
    """From which padded length ``component`` declares reading padded positions: ``0`` in every batch
    (``reads_padded_positions`` exactly ``True``), ``N`` in batches longer than ``N`` tokens
    (``reads_padded_positions_above = N``), ``None`` never (no declaration).

    Raises:
        CapabilityError: ``reads_padded_positions_above`` is set to something else than ``None`` or a token count
            (an ``int`` of at least 0); the message names the component (at ``where``).
    """
    if getattr(component, READS_PADDED_POSITIONS, False) is True:
        return 0
    above = getattr(component, READS_PADDED_POSITIONS_ABOVE, None)
    if above is None:
        return None
    if isinstance(above, bool) or not isinstance(above, int) or above < 0:
        at = f" at {where}" if where else ""
        raise CapabilityError(
            f"{type(component).__name__}{at} declares reads_padded_positions_above = {above!r}: it must be None or "
            "the longest padded length (an int >= 0) up to which its outputs at real tokens do not depend on the "
            "padding"
        )
    return above


def padding_readers(root: nn.Module, name: str = "", extra: dict[str, Any] | None = None) -> list[PaddingReader]:
    """The components under ``root`` that declare reading padded positions (``reads_padded_positions``, or
    ``reads_padded_positions_above``: see :func:`padded_reads_above`), in model order.

    Every submodule is asked (``root`` itself included, reported as ``name``), and the attention backend each
    module holds (its ``backend`` attribute, which is not a module); ``extra`` names further objects to ask (the
    position scheme), by the name to report. Only the declaring object is named, not the modules around it.

    Raises:
        CapabilityError: a malformed ``reads_padded_positions_above`` (see :func:`padded_reads_above`).
    """
    candidates: list[tuple[str, Any]] = []
    for path, module in root.named_modules(prefix=name):
        where = path or type(root).__name__
        candidates.append((where, module))
        backend = module.__dict__.get("backend")  # a plain attribute: an AttentionBackend is not a module
        if backend is not None:
            candidates.append((f"{where}.backend", backend))
    candidates += list((extra or {}).items())
    found = []
    for where, component in candidates:
        above = padded_reads_above(component, where)
        if above is not None:
            found.append(PaddingReader(where, type(component).__name__, above))
    return found


def auto_packing_limit(readers: Iterable[PaddingReader]) -> int | None:
    """The longest padded length ``encoder.packing: auto`` may pack with these readers in the model: ``None`` any
    length (no reader), ``0`` none (one reads padded positions in every batch), else the lowest declared
    ``reads_padded_positions_above``."""
    limit = None
    for reader in readers:
        limit = reader.above if limit is None else min(limit, reader.above)
    return limit


def attention_capabilities(attention: Any) -> AttentionCapabilities:
    """An attention module's declared capabilities (the defaults, everything supported, when it declares none)."""
    declared = getattr(attention, "capabilities", None)
    return declared if isinstance(declared, AttentionCapabilities) else AttentionCapabilities()
