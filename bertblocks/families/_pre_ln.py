"""What the pre-LN variants of BERT and RoBERTa in transformers share: ``pre_ln`` layers and where their norms sit.

RoBERTa-PreLayerNorm, XLM-RoBERTa-XL and MegatronBERT (and X-MOD with ``pre_norm: true``, adapters aside) compute
the same layer, ``x + attn(LN(x))`` (``+ crossattn(LN(x), encoder)``) then ``x + ff(LN(x))``, with a LayerNorm
after the stack: bertblocks' ``pre_ln`` layer kind with its final norm. They differ only in the names of the three
norms in the checkpoint, and in whether the embeddings end with a LayerNorm (RoBERTa-PreLayerNorm's do; Megatron's
and XLM-R-XL's do not). A :class:`PreLNLayout` states those names once and gives the key-map rules and the fixed
facts of the family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .keymap import BACKBONE_PREFIX, Rename

#: what every pre-LN family of transformers requires of the config: ``pre_ln`` layers that all normalise their
#: attention input (layer 0 too), the BERT feed-forward block
PRE_LN_FIXED: dict[str, Any] = {
    "encoder.layer.name": "pre_ln",
    "encoder.layer.first_attention_norm": True,
    "encoder.feedforward.name": "bert",
}


@dataclass(frozen=True)
class PreLNLayout:
    """Where a pre-LN checkpoint keeps its norms.

    Attributes:
        attention_norm: the attention norm, relative to ``<prefix>.encoder.layer.{i}.attention`` (``LayerNorm``,
            Megatron's ``ln``); the cross-attention's norm has the same name under ``crossattention``.
        feedforward_norm: the feed-forward norm, relative to ``<prefix>.encoder.layer.{i}``
            (``intermediate.LayerNorm``, Megatron's ``ln``).
        final_norm: the norm after the stack, relative to ``<prefix>`` (``LayerNorm`` on the backbone,
            ``encoder.ln`` inside the encoder).
        embedding_norm: whether the embeddings end with a LayerNorm (``embeddings.LayerNorm``).
    """

    attention_norm: str
    feedforward_norm: str
    final_norm: str
    embedding_norm: bool

    def rules(self, prefix: str, *, if_model_has: bool = False) -> tuple[Rename, ...]:
        """The key-map rules of the norms of a checkpoint whose backbone is under ``prefix``; ``if_model_has``: on
        load only where the model is pre-LN (X-MOD, whose post-LN layout keeps the same checkpoint keys inside
        the sub-layers: :attr:`~bertblocks.families.keymap.Rename.if_model_has`)."""
        layer, ours = f"{prefix}.encoder.layer.{{i}}", f"{BACKBONE_PREFIX}.encoder.layer.{{i}}"
        return tuple(
            Rename(checkpoint, model, if_model_has=if_model_has)
            for checkpoint, model in (
                (f"{layer}.attention.{self.attention_norm}", f"{ours}.attention_norm"),
                (f"{layer}.crossattention.{self.attention_norm}", f"{ours}.crossattention_norm"),
                (f"{layer}.{self.feedforward_norm}", f"{ours}.feedforward_norm"),
                (f"{prefix}.{self.final_norm}", f"{BACKBONE_PREFIX}.encoder.final_norm"),
            )
        )

    @property
    def fixed(self) -> dict[str, Any]:
        """The config facts this layout requires (:data:`PRE_LN_FIXED` and the embedding norm)."""
        return {**PRE_LN_FIXED, "embedding.norm": self.embedding_norm}
