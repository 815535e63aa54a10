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
* **what an attention module can do** — :class:`AttentionCapabilities` (attention weights for all heads, some
  or none; head pruning; the KV cache), an :class:`~bertblocks.core.interfaces.Attention`'s ``capabilities``.
  The builder refuses a config that needs what is absent (``pruned_heads``, a decoder with ``use_cache``), the
  model refuses such a call (``output_attentions``, ``prune_heads``, ``use_cache``) with a
  :class:`CapabilityError`, and the conformance suite skips the checks that do not apply with the component's
  own reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from ..errors import BertBlocksError

#: the attribute a component sets to declare that it reads padded positions
READS_PADDED_POSITIONS = "reads_padded_positions"


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


def declares_padding_reads(component: Any) -> bool:
    """Whether ``component`` declares ``reads_padded_positions`` (class or instance attribute, exactly ``True``)."""
    return getattr(component, READS_PADDED_POSITIONS, False) is True


def padding_readers(root: nn.Module, name: str = "", extra: dict[str, Any] | None = None) -> list[str]:
    """The components under ``root`` that declare ``reads_padded_positions``, each as ``path (ClassName)``.

    Every submodule is asked (``root`` itself included, reported as ``name``), and the attention backend each
    module holds (its ``backend`` attribute, which is not a module); ``extra`` names further objects to ask (the
    position scheme), by the name to report. Only the declaring object is named, not the modules around it.
    """
    found = []
    for path, module in root.named_modules(prefix=name):
        where = path or type(root).__name__
        if declares_padding_reads(module):
            found.append(f"{where} ({type(module).__name__})")
        backend = module.__dict__.get("backend")  # a plain attribute: an AttentionBackend is not a module
        if backend is not None and declares_padding_reads(backend):
            found.append(f"{where}.backend ({type(backend).__name__})")
    for label, component in (extra or {}).items():
        if declares_padding_reads(component):
            found.append(f"{label} ({type(component).__name__})")
    return found


def attention_capabilities(attention: Any) -> AttentionCapabilities:
    """An attention module's declared capabilities (the defaults, everything supported, when it declares none)."""
    declared = getattr(attention, "capabilities", None)
    return declared if isinstance(declared, AttentionCapabilities) else AttentionCapabilities()
