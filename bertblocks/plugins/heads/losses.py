"""Head losses, each transformers' own, and the label checks that run before them.

A loss is called with the head's output tensors by field name (``logits``, ``start_logits`` …), the labels
given (every name in its ``label_names``: the head checks that first) and a per-call :class:`LossContext`.
Labels are checked before the loss, so that a wrong shape, dtype or class index is reported by name instead of
surfacing as an opaque error deep inside ``cross_entropy`` (or a device-side assert on a GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

import torch
import torch.nn.functional as F

from bertblocks.plugins.poolers import token_mask

from ...errors import InputError

IGNORE_INDEX = -100  # transformers' (and PyTorch's) default ignore index for cross-entropy


# ------------------------------------------------------------------------------------------ label checks
def is_integer(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds integers (not floats, complex numbers or booleans)."""
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def check_shape(name: str, labels: torch.Tensor, shapes: tuple[tuple[int, ...], ...], what: str) -> None:
    """Raise a clear ``ValueError`` unless ``labels`` has one of the allowed ``shapes``."""
    if tuple(labels.shape) not in shapes:
        allowed = " or ".join(str(s) for s in shapes)
        raise InputError(f"{name} must have shape {allowed} ({what}); got {tuple(labels.shape)}")


def check_class_labels(
    name: str, labels: torch.Tensor, shapes: tuple[tuple[int, ...], ...], num_classes: int, what: str
) -> None:
    """Raise a clear ``ValueError`` unless ``labels`` are integer class indices in ``[0, num_classes)`` (or the
    ignore index -100) of one of the allowed ``shapes``."""
    if not is_integer(labels):
        raise InputError(f"{name} must be an integer tensor of class indices ({what}); got dtype {labels.dtype}")
    check_shape(name, labels, shapes, what)
    if labels.numel() and not torch.compiler.is_compiling():  # a data-dependent check would break the graph
        bad = ((labels < 0) | (labels >= num_classes)) & (labels != IGNORE_INDEX)
        if bool(bad.any()):
            raise InputError(
                f"{name} hold {labels[bad][0].item()}, outside [0, {num_classes}) and not the ignore index "
                f"{IGNORE_INDEX} ({what})"
            )


def check_float_labels(name: str, labels: torch.Tensor, shapes: tuple[tuple[int, ...], ...], what: str) -> None:
    """Raise a clear ``ValueError`` unless ``labels`` are floating point and of one of the allowed ``shapes``."""
    if not labels.is_floating_point():
        raise InputError(f"{name} must be a floating-point tensor ({what}); got dtype {labels.dtype}")
    check_shape(name, labels, shapes, what)


# ------------------------------------------------------------------------------------------------ losses
@dataclass
class LossContext:
    """What a loss may read besides logits and labels, made afresh for every call (so a head keeps no per-call
    state): the attention mask the backbone was given, and the config's ``problem_type``, which a loss that
    infers it writes back here (the head passes it on to the config, as transformers does)."""

    attention_mask: torch.Tensor | None = None
    problem_type: str | None = None


class Loss(Protocol):
    """A head's loss: ``label_names`` it needs, ``config_fields`` it reads and may write (``problem_type``)."""

    label_names: tuple[str, ...]
    config_fields: tuple[str, ...]

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], labels: Mapping[str, torch.Tensor], context: LossContext
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class CrossEntropy:
    """Cross-entropy ignoring -100, over the last dimension of ``outputs[field]`` (transformers' masked-LM,
    token-classification, next-sentence, sentence-order and multiple-choice losses).

    Attributes:
        field: the output field holding the logits.
        label: the label name.
        what: the labels' meaning, for error messages.
        labels_per: ``position``: one label per position (the logits' leading shape); ``example``: one per
            example, ``[b]`` or ``[b, 1]``; ``choice``: the index of the right choice, ``[b]`` (logits ``[b, c]``).
        shift: predict token ``i + 1`` at position ``i`` (transformers' ``ForCausalLMLoss``: labels shifted
            left by one and padded with -100).
        upcast: compute in float32 (transformers 5's ``ForCausalLMLoss``, ``ForMaskedLMLoss``).
    """

    field: str = "logits"
    label: str = "labels"
    what: str = "token ids [batch, seq] or -100"
    labels_per: Literal["position", "example", "choice"] = "position"
    shift: bool = False
    upcast: bool = False
    config_fields: ClassVar[tuple[str, ...]] = ()

    @property
    def label_names(self) -> tuple[str, ...]:
        return (self.label,)

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], labels: Mapping[str, torch.Tensor], context: LossContext
    ) -> torch.Tensor:
        logits, target = outputs[self.field], labels[self.label]
        n, b = logits.shape[-1], logits.shape[0]
        shapes = {"position": (tuple(logits.shape[:-1]),), "example": ((b,), (b, 1)), "choice": ((b,),)}
        check_class_labels(self.label, target, shapes[self.labels_per], n, self.what)
        if self.shift:
            target = F.pad(target, (0, 1), value=IGNORE_INDEX)[..., 1:]  # [b, q]: token i+1 at position i
        if self.upcast:
            logits = logits.float()
        return F.cross_entropy(logits.reshape(-1, n), target.reshape(-1))


def infer_problem_type(num_labels: int, labels_dtype: torch.dtype) -> str:
    """transformers' rule for an unset ``problem_type``, from what a graph may depend on without a side effect:
    one label → ``regression``; ``int64``/``int32`` labels → ``single_label_classification``; anything else →
    ``multi_label_classification``.

    Args:
        num_labels: the classifier's outputs per example.
        labels_dtype: the labels' dtype.

    Returns:
        The problem type.
    """
    if num_labels == 1:
        return "regression"
    if labels_dtype in (torch.long, torch.int):
        return "single_label_classification"
    return "multi_label_classification"


@dataclass(frozen=True)
class ProblemTypeLoss:
    """Sequence classification or regression, by ``problem_type`` (transformers' rule).

    Unset, it is inferred on the first call with labels, as HF does, and written back into the context (the
    task model then writes it into the config, so a saved config records it): one label → ``regression``
    (MSE), integer labels → ``single_label_classification`` (cross-entropy), anything else →
    ``multi_label_classification`` (BCE with logits).
    """

    field: str = "logits"
    label_names: tuple[str, ...] = ("labels",)
    config_fields: tuple[str, ...] = ("problem_type",)
    #: the rule for an unset ``problem_type``; the task model also applies it before a compiled call, so that the
    #: graph reads a set one (no write to the config inside it)
    infer_problem_type = staticmethod(infer_problem_type)

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], labels: Mapping[str, torch.Tensor], context: LossContext
    ) -> torch.Tensor:
        logits, target = outputs[self.field], labels["labels"]
        b, n = logits.shape
        if context.problem_type is None:
            context.problem_type = infer_problem_type(n, target.dtype)
        if context.problem_type == "regression":
            if n == 1:
                check_float_labels("labels", target, ((b,), (b, 1)), "regression targets, one per example")
                return F.mse_loss(logits.squeeze(), target.squeeze())
            check_float_labels("labels", target, ((b, n),), f"regression targets, {n} per example")
            return F.mse_loss(logits, target)
        if context.problem_type == "single_label_classification":
            check_class_labels("labels", target, ((b,), (b, 1)), n, "one class index per example")
            return F.cross_entropy(logits.view(-1, n), target.view(-1))
        check_float_labels("labels", target, ((b, n),), "multi-label targets: 0/1 per class as floats")
        return F.binary_cross_entropy_with_logits(logits, target)


@dataclass(frozen=True)
class SpanLoss:
    """Extractive QA: the mean of the start and end cross-entropies. As HF, positions outside the input are
    clamped to ``seq_len``, which is also the ignore index, so such examples add nothing."""

    label_names: tuple[str, ...] = ("start_positions", "end_positions")
    fields: tuple[str, ...] = ("start_logits", "end_logits")
    config_fields: tuple[str, ...] = ()

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], labels: Mapping[str, torch.Tensor], context: LossContext
    ) -> torch.Tensor:
        losses = []
        for field, name in zip(self.fields, self.label_names, strict=True):
            logits, target = outputs[field], labels[name]
            b, length = logits.shape
            if not is_integer(target):
                raise InputError(f"{name} must be an integer tensor of token positions; got dtype {target.dtype}")
            if tuple(target.shape) not in ((b,), (b, 1)):
                raise InputError(
                    f"{name} must have shape ({b},) or ({b}, 1): one position per example; got {tuple(target.shape)}"
                )
            position = target.reshape(b).clamp(0, length)  # out of range → `length`, ignored below
            losses.append(F.cross_entropy(logits, position, ignore_index=length))
        start, end = losses
        return (start + end) / 2


@dataclass(frozen=True)
class MaskedBinaryLoss:
    """ELECTRA's replaced-token detection: BCE with logits over the tokens the attention mask keeps (every token
    without a mask); labels 1 = replaced."""

    field: str = "logits"
    label_names: tuple[str, ...] = ("labels",)
    config_fields: tuple[str, ...] = ()

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], labels: Mapping[str, torch.Tensor], context: LossContext
    ) -> torch.Tensor:
        logits, target = outputs[self.field], labels["labels"]  # [b, q]
        check_class_labels("labels", target, (tuple(logits.shape),), 2, "1 = replaced token, 0 = original")
        if context.attention_mask is None:
            return F.binary_cross_entropy_with_logits(logits, target.float())
        active = token_mask(context.attention_mask, logits.shape[1]) == 1  # [b, q]
        return F.binary_cross_entropy_with_logits(logits[active], target[active].float())


@dataclass(frozen=True)
class SumOfLosses:
    """Pre-training: the sum of several losses (masked LM plus next-sentence or sentence-order prediction)."""

    parts: tuple[Loss, ...]
    config_fields: tuple[str, ...] = ()

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(name for part in self.parts for name in part.label_names)

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], labels: Mapping[str, torch.Tensor], context: LossContext
    ) -> torch.Tensor:
        first, *rest = (part(outputs, labels, context) for part in self.parts)
        return sum(rest, first)
