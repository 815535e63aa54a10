"""What a head does between pooling and its output layer: nothing, ``norm(act(dense(h)))`` (BERT's and
ModernBERT's prediction transform), ``act(dense(h))`` (ELECTRA's discriminator) or ``dropout → dense → act →
dropout`` (RoBERTa's classifier).

Each transform is a :class:`Steps` module: its layers sit under the names the family's checkpoints use, and run
in the order listed. The names are the checkpoint contract (a family's key map renames them), so each builder
takes them from its caller; the layers and their order are what the builder decides.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import InputError

#: the transform's layer names in BERT's ``BertPredictionHeadTransform`` (CamelCase ``LayerNorm``: HF's key)
BERT_TRANSFORM = ("dense", "transform_act_fn", "LayerNorm")
#: the same layers in ModernBERT's prediction head (bertblocks' names; the family's key map renames them)
MODERNBERT_TRANSFORM = ("dense", "act", "norm")

#: one step of a :class:`Steps`: its checkpoint name and the module
Step = tuple[str, nn.Module]


class Steps(nn.Module):
    """Modules under checkpoint names, applied in the order given; a name given twice runs twice (RoBERTa's
    classifier applies its one dropout before and after the dense layer).

    Example:
        >>> dropout = nn.Dropout(0.1)
        >>> Steps(("dropout", dropout), ("dense", nn.Linear(8, 8)), ("dropout", dropout))  # keys: dense.*
    """

    def __init__(self, *steps: Step) -> None:
        super().__init__()
        self.order = tuple(name for name, _ in steps)
        for name, module in steps:
            if name in self._modules and self._modules[name] is not module:
                raise InputError(f"two different modules named {name!r} in one Steps")
            self.add_module(name, module)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for name in self.order:
            hidden_states = self._modules[name](hidden_states)  # type: ignore[misc]
        return hidden_states


def dense_act_norm(
    hidden_size: int,
    activation: nn.Module,
    layer_norm_eps: float,
    names: tuple[str, str, str],
    *,
    width: int | None = None,
    dense_bias: bool = True,
    norm_bias: bool = True,
) -> Steps:
    """``norm(act(dense(h)))``: BERT's ``BertPredictionHeadTransform`` and ModernBERT's prediction head.

    Args:
        hidden_size: the input width.
        activation: the activation module.
        layer_norm_eps: the LayerNorm's epsilon.
        names: the names of the dense layer, the activation and the LayerNorm (:data:`BERT_TRANSFORM`,
            :data:`MODERNBERT_TRANSFORM`).
        width: the output width (ELECTRA's generator narrows to ``embedding_size``); default ``hidden_size``.
        dense_bias: a bias on the dense layer (ModernBERT's ``classifier_bias``).
        norm_bias: a bias in the LayerNorm (ModernBERT's ``norm_bias``).
    """
    width = width or hidden_size
    dense, act, norm = names
    return Steps(
        (dense, nn.Linear(hidden_size, width, bias=dense_bias)),
        (act, activation),
        (norm, nn.LayerNorm(width, eps=layer_norm_eps, bias=norm_bias)),
    )


def dense_act(hidden_size: int, activation: nn.Module) -> list[Step]:
    """``act(dense(h))`` as steps (ELECTRA's ``discriminator_predictions`` before its one-logit layer)."""
    return [("dense", nn.Linear(hidden_size, hidden_size)), ("activation", activation)]


def dropout_dense_act(hidden_size: int, activation: nn.Module, dropout: float) -> list[Step]:
    """``dropout(act(dense(dropout(h))))`` as steps (RoBERTa's ``RobertaClassificationHead`` before ``out_proj``;
    one dropout module, applied twice)."""
    drop = nn.Dropout(dropout)
    return [("dropout", drop), ("dense", nn.Linear(hidden_size, hidden_size)), ("act", activation), ("dropout", drop)]
