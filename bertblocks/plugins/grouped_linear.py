"""The one grouped projection of the built-in components: slice ``g`` of the input feeds slice ``g`` of the output
alone, through its own ``[in/groups, out/groups]`` weight, then one bias over all outputs.

Two families store the same product in two layouts, under the same key names (``weight``, ``bias``):

- ``"blocks"``: ``weight [groups, in/groups, out/groups]`` (transformers' ConvBERT ``GroupedLinearLayer``; the
  ``bert`` feed-forward's ``groups`` option);
- ``"conv1d"``: ``weight [out, in/groups, 1]`` (a kernel-1 ``nn.Conv1d`` with ``groups``: transformers'
  SqueezeBERT; the ``grouped_conv`` attention and feed-forward).

The layout only decides how the parameter is stored (so each family's checkpoints load unchanged); the forward
pass, the initialisation and int8 quantization (:mod:`bertblocks.models.quantize`, through :meth:`GroupedLinear.rows`)
are one code path for both. It is a :class:`~bertblocks.core.interfaces.GroupedProjection`: the declaration int8
quantization reads.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from bertblocks.core.interfaces import GroupedProjection

from ..errors import InputError

Layout = Literal["blocks", "conv1d"]


class GroupedLinear(GroupedProjection):
    """A grouped projection ``[..., in] → [..., out]`` (see the module docstring for the two weight layouts).

    Shapes::

        x [..., in] → [n, g, in/g] → [g, n, in/g] @ weight [g, in/g, out/g] (+ bias [g, 1, out/g]) → [g, n, out/g]
          → [..., out]

    Args:
        in_features: the input width.
        out_features: the output width.
        groups: how many slices; must divide both widths.
        bias: one bias over all outputs.
        layout: how ``weight`` is stored: ``"blocks"`` (ConvBERT's) or ``"conv1d"`` (SqueezeBERT's).
        where: the config field the group count comes from, for the error message.

    Raises:
        InputError: ``groups`` does not divide both widths.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        groups: int,
        bias: bool = True,
        layout: Layout = "blocks",
        where: str = "groups",
    ) -> None:
        super().__init__()
        if in_features % groups or out_features % groups:
            raise InputError(
                f"{where} {groups} must divide both widths of each projection ({in_features} and {out_features})"
            )
        self.groups, self.in_features, self.out_features, self.layout = groups, in_features, out_features, layout
        shape = (
            (groups, in_features // groups, out_features // groups)
            if layout == "blocks"
            else (out_features, in_features // groups, 1)
        )
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def reset_parameters_like_hf(self, std: float) -> None:
        """As transformers initialises both (a ``GroupedLinearLayer``, an ``nn.Conv1d``): normal weights, zero bias."""
        with torch.no_grad():
            self.weight.normal_(0.0, std)
            if self.bias is not None:
                self.bias.zero_()

    def blocks(self) -> torch.Tensor:
        """The weight as ``[groups, in/groups, out/groups]`` (a view in either layout)."""
        if self.layout == "blocks":
            return self.weight
        return self.weight.view(self.groups, self.out_features // self.groups, -1).transpose(1, 2)

    def rows(self) -> torch.Tensor:
        """The weight as ``[out, in/groups]``: output channel ``o`` (of group ``o // (out/groups)``) on row ``o``,
        over its group's slice of the input (what per-channel int8 quantization scales row by row)."""
        if self.layout == "conv1d":
            return self.weight[..., 0]
        return self.weight.transpose(1, 2).reshape(self.out_features, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        grouped = x.reshape(-1, self.groups, self.in_features // self.groups).transpose(0, 1)  # [g, n, in/g]
        if self.bias is None:
            out = torch.bmm(grouped, self.blocks())  # [g, n, out/g]
        else:  # the bias inside the product: one pass over the output fewer than adding it after (measured faster)
            out = torch.baddbmm(self.bias.view(self.groups, 1, -1), grouped, self.blocks())
        return out.transpose(0, 1).reshape(*lead, self.out_features)  # [..., out]

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, groups={self.groups}, "
            f"bias={self.bias is not None}, layout={self.layout}"
        )
