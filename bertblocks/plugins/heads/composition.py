"""A task head as a composition: what it reads (:mod:`.pooling`), the modules that map that to logits
(:mod:`.transforms`, :mod:`.projections`, under the checkpoint's names), and its loss (:mod:`.losses`).

Every built-in head is a :class:`ComposedHead`; the catalogues (:mod:`.bert`, :mod:`.task_heads`,
:mod:`.transform_heads`) only say which pieces each registered name puts together.

Data flow of one call::

    for each branch:  pool(output, attention_mask) → modules in order → output field(s)
                      ([b·c, 1] → [b, c] for multiple choice; [.., k] split into k fields for QA's start/end)
    loss(fields, labels, LossContext(attention_mask, problem_type))   when labels are given
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from bertblocks.core.component import Component, NoOptions
from bertblocks.core.interfaces import Head
from bertblocks.core.outputs import ModelOutput, ModelOutputWithPooling
from bertblocks.core.packing import real_token_index

from ...errors import InputError
from .losses import Loss, LossContext, check_shape, is_integer
from .pooling import Pooling, pool

#: the inputs a multiple-choice head flattens from ``[b, c, q]`` to ``[b·c, q]``
CHOICE_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


@dataclass(frozen=True)
class Branch:
    """One path from the backbone output to output fields.

    Attributes:
        fields: the output fields it fills; two or more split the last dimension among them (QA's
            ``start_logits``/``end_logits``; one field with ``split`` squeezes a last dimension of 1).
        pooling: what it reads (see :data:`.pooling.POOLINGS`).
        modules: dotted names of the head's modules, applied in this order.
        split: split the last dimension among ``fields``.
        sparse_ignore_index: with labels, run the modules only on positions whose label is not this
            (ModernBERT's ``sparse_prediction``: logits ``[n, vocab]`` for the ``n`` labelled positions).
        late: the modules run on every position and ``pooling`` then pools their output (EuroBERT's
            ``classifier_pooling: late``: per-token logits averaged over the real tokens).
    """

    fields: tuple[str, ...]
    pooling: Pooling
    modules: tuple[str, ...]
    split: bool = False
    sparse_ignore_index: int | None = None
    late: bool = False


class ComposedHead(Head):
    """A head put together from a pooling, modules and a loss per :class:`Branch` (see the module docstring).

    Args:
        name: the registered name (for error messages).
        modules: the head's modules by checkpoint name, in registration order (the task model adopts them).
        branches: the paths from the backbone output to the output fields.
        loss: the loss over the output fields, given every label it names.
        output: the output type, built from ``loss`` and the branches' fields.
        choices: inputs are ``[b, c, q]``: flattened to ``[b·c, q]`` for the backbone, the one score per choice
            reshaped to ``[b, c]``.
        reads_padded_positions: see :class:`~bertblocks.core.interfaces.Head`.
    """

    def __init__(
        self,
        name: str,
        *,
        modules: Mapping[str, nn.Module],
        branches: Sequence[Branch],
        loss: Loss,
        output: type[ModelOutput],
        choices: bool = False,
        reads_padded_positions: bool = False,
    ) -> None:
        super().__init__()
        for key, module in modules.items():
            self.add_module(key, module)
        self.name = name
        self.branches = tuple(branches)
        self.loss = loss
        self.output_type = output
        self.choices = choices
        self.reshapes_inputs = choices  # the conformance suite gives such a head [b, c, q] inputs
        self.needs_pooler = any(branch.pooling == "pooler" for branch in self.branches)
        self.reads_padded_positions = reads_padded_positions
        self.label_names = loss.label_names
        self.config_fields = loss.config_fields
        self.problem_type: str | None = None  # mirrored from the config by the task model when config_fields has it

    def prepare_inputs(self, inputs: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        return flatten_choices(inputs) if self.choices else inputs

    def tie_weights(self, input_embeddings: nn.Embedding) -> None:
        for module in self.modules():
            tie_to = getattr(module, "tie_to", None)
            if tie_to is not None:
                tie_to(input_embeddings)

    def forward(
        self,
        output: ModelOutputWithPooling,
        labels: Mapping[str, torch.Tensor],
        batch_shape: tuple[int, ...],
        *,
        attention_mask: torch.Tensor | None,
    ) -> ModelOutput:
        if labels and len(labels) != len(self.label_names):
            needs = " and ".join(self.label_names)
            given = ", ".join(labels)
            raise InputError(
                f"the {self.name} loss needs {'both ' if len(self.label_names) == 2 else ''}{needs}; "
                f"only {given} was given"
            )
        values: dict[str, torch.Tensor] = {}
        for branch in self.branches:
            hidden = pool(output, attention_mask, "none" if branch.late else branch.pooling)
            if branch.sparse_ignore_index is not None and "labels" in labels:
                hidden, target = _labelled_positions(hidden, labels["labels"], branch.sparse_ignore_index)
                labels = {**labels, "labels": target}
            for name in branch.modules:
                hidden = self.get_submodule(name)(hidden)
            if branch.late:  # [b, q, n] → [b, n]
                hidden = pool(ModelOutputWithPooling(last_hidden_state=hidden), attention_mask, branch.pooling)
            if self.choices:
                hidden = hidden.view(batch_shape)  # [b·c, 1] → [b, c]
            if branch.split:
                parts = hidden.split(1, dim=-1)
                values.update((f, part.squeeze(-1).contiguous()) for f, part in zip(branch.fields, parts, strict=True))
            else:
                (single,) = branch.fields
                values[single] = hidden
        loss = None
        if labels:
            context = LossContext(attention_mask=attention_mask, problem_type=self.problem_type)
            loss = self.loss(values, labels, context)
            self.problem_type = context.problem_type  # what the loss inferred; the task model writes it back
        return self.output_type(loss=loss, **values)


def _labelled_positions(
    hidden: torch.Tensor, target: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden [b, q, H]`` and ``target [b, q]`` → the ``n`` positions whose label is not ``ignore_index``:
    ``[n, H]``, ``[n]``."""
    if not is_integer(target):
        raise InputError(f"labels must be an integer tensor of token ids; got dtype {target.dtype}")
    check_shape("labels", target, (tuple(hidden.shape[:-1]),), "token ids [batch, seq] or -100")
    flat = target.reshape(-1)
    keep = flat != ignore_index
    if torch.compiler.is_compiling():
        # the packing op's symbolic count (not boolean indexing, whose data-dependent size would break the graph
        # or recompile per count): one graph serves every number of labelled positions. It promises at least
        # one, so a batch without a label scores position 0 anyway; its target stays ignore_index, so the loss
        # is eager's (nan, as the dense loss), and the logits are [1, vocab] instead of [0, vocab]
        keep = torch.cat([keep[:1] | ~keep.any(), keep[1:]])
    index = real_token_index(keep)  # [n]
    return hidden.reshape(flat.shape[0], -1).index_select(0, index), flat.index_select(0, index)


def flatten_choices(inputs: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """Multiple choice: ``[b, c, q]`` inputs (``[b, c, q, H]`` embeddings) → ``[b·c, q]`` (``[b·c, q, H]``).

    Raises:
        ValueError: ``input_ids`` not 3-D, ``inputs_embeds`` not 4-D, or another input of another shape.
    """
    ids, embeds = inputs.get("input_ids"), inputs.get("inputs_embeds")
    if ids is not None and ids.dim() != 3:
        raise InputError(
            f"multiple choice input_ids must be 3-D [batch, num_choices, seq]; got shape {tuple(ids.shape)}"
        )
    if embeds is not None and embeds.dim() != 4:
        raise InputError(
            "multiple choice inputs_embeds must be 4-D [batch, num_choices, seq, hidden]; "
            f"got shape {tuple(embeds.shape)}"
        )
    lead = tuple(ids.shape) if ids is not None else tuple(embeds.shape[:3]) if embeds is not None else None
    out = dict(inputs)
    for name in CHOICE_INPUTS:
        tensor = inputs.get(name)
        if tensor is None:
            continue
        if lead is not None and tuple(tensor.shape) != lead:
            raise InputError(
                f"multiple choice {name} must have the input's shape {lead} [batch, num_choices, seq]; "
                f"got {tuple(tensor.shape)}"
            )
        out[name] = tensor.reshape(-1, tensor.shape[-1])  # [b·c, q]
    if embeds is not None:
        out["inputs_embeds"] = embeds.reshape(-1, *embeds.shape[-2:])  # [b·c, q, H]
    return out


# ------------------------------------------------------------------------------------------- registration
@dataclass(frozen=True)
class HeadArguments:
    """The keywords every head factory receives (``docs/plugins/hooks.md``, kind ``head``)."""

    hidden_size: int
    vocab_size: int
    num_labels: int
    layer_norm_eps: float
    activation: Callable[[], nn.Module]  # a factory of the config's hidden_act module
    classifier_dropout: float  # already resolved: classifier_dropout, else hidden_dropout_prob
    hidden_dropout_prob: float  # the config's, whatever classifier_dropout says (BigBird's QA feed-forward)
    intermediate_size: int  # the feed-forward width of the encoder's layers (a head with a feed-forward block)
    tie_word_embeddings: bool
    is_decoder: bool
    options: Any  # the head's options model (NoOptions for a head that takes none)


def head_component(
    name: str,
    build: Callable[[str, HeadArguments], Head],
    description: str,
    options: type[BaseModel] = NoOptions,
) -> Component:
    """The ``head`` component ``name``, built by ``build(name, arguments)``."""

    def factory(**kwargs: Any) -> Head:
        return build(name, HeadArguments(**kwargs))

    return Component("head", name, factory, options, description)
