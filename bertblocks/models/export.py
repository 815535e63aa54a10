"""Exporting a model to a graph: ``torch.export`` and ONNX (the dynamo exporter), batch and sequence dynamic.

Output types are pytree nodes (see :mod:`bertblocks.core.outputs`), so ``torch.export.export(model, …)``
works on a model as it is. For ONNX, :class:`ExportView` gives the graph named inputs and outputs
(``input_ids``, ``attention_mask``, ``token_type_ids`` and the family's own inputs → ``last_hidden_state``,
``pooler_output`` / ``logits`` / …). The family's own inputs (LayoutLM's ``bbox``, X-MOD's ``lang_ids``, Longformer's
``global_attention_mask``, a plugin's) come from the backbone's one list of them,
:meth:`~bertblocks.core.encoder.EncoderModel.extra_input_specs`, with their dtypes and dynamic axes: the exporter
names none of them. The attention mask is always an input of the graph and always applied: while tracing,
the model keeps the mask even when the example hides nothing (no branch on data under compilation), so an
export made from an unpadded example is still right on padded batches.

Example:
    >>> program = export_program(model)                      # torch.export.ExportedProgram
    >>> export_onnx(model, "model.onnx")                     # then onnxruntime.InferenceSession("model.onnx")
    >>> save_program(program, "model.pt2")                   # torch.export.load("model.pt2")

Both files are written atomically (:mod:`bertblocks.atomic`): an earlier file is never truncated.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..atomic import write_bytes, write_file
from ..core.encoder import EncoderModel
from ..core.interfaces import ExtraInput
from ..errors import InputError
from .quantize import is_quantized, onnx_translations

#: the inputs an exported encoder takes, in this order
DEFAULT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class ExportView(nn.Module):
    """A model seen as a function of positional tensors returning a tuple of named outputs (what ONNX wants).

    Args:
        model: a bertblocks backbone or task model.
        input_names: the keyword arguments to feed, in order.
        output_names: the output fields to return, in order (default: every field the model sets on an example).
    """

    def __init__(self, model: nn.Module, input_names: Sequence[str], output_names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.input_names, inputs, strict=True)))
        return tuple(out[name] for name in self.output_names)


def example_inputs(
    model: nn.Module, batch: int = 2, length: int | None = None, input_names: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """A padded example batch for tracing: random token ids, the second row's last half padded; the family's own
    inputs as the components that declare them make examples (:class:`~bertblocks.core.interfaces.ExtraInput`).

    ``length`` defaults to 8, rounded up to the backbone's
    :attr:`~bertblocks.core.encoder.EncoderModel.sequence_multiple`; ``input_names`` to the inputs the model takes
    (:func:`model_inputs`).

    Raises:
        InputError: a name the model does not take.
    """
    if input_names is None:
        input_names = model_inputs(model)
    if length is None:
        multiple = backbone_of(model).sequence_multiple
        length = -(-8 // multiple) * multiple
    config = model.config
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, config.vocab_size, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1:, length // 2 :] = 0
    available = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    specs = extra_input_specs(model)
    unknown = [name for name in input_names if name not in available and name not in specs]
    if unknown:
        raise InputError(f"cannot make example inputs {unknown}; exportable inputs are {[*available, *specs]}")
    device = next(model.parameters()).device
    return {
        name: (available[name] if name in available else specs[name].example_value(batch, length)).to(device)
        for name in input_names
    }


def backbone_of(model: nn.Module) -> EncoderModel:
    """The backbone of a backbone or task model (the model itself, or its ``bert``).

    Raises:
        InputError: ``model`` holds no bertblocks backbone.
    """
    if isinstance(model, EncoderModel):
        return model
    backbone = getattr(model, "bert", None)
    if not isinstance(backbone, EncoderModel):
        raise InputError(f"{type(model).__name__} is not a bertblocks backbone or task model (no backbone)")
    return backbone


def extra_input_specs(model: nn.Module) -> dict[str, ExtraInput]:
    """The inputs beyond BERT's that ``model`` takes, by name, as its backbone describes them
    (:meth:`~bertblocks.core.encoder.EncoderModel.extra_input_specs`: the list its ``forward`` checks against)."""
    return {spec.name: spec for spec in backbone_of(model).extra_input_specs()}


def model_inputs(model: nn.Module) -> tuple[str, ...]:
    """The inputs ``model`` takes: :data:`DEFAULT_INPUTS` without ``token_type_ids`` when the embedding has no
    token-type table (ModernBERT, DistilBERT, MPNet: ``embedding.token_types: false``), then the family's own
    (:func:`extra_input_specs`: LayoutLM's ``bbox``, X-MOD's ``lang_ids``, Longformer's ``global_attention_mask``)."""
    embedding = getattr(model.config, "embedding", None)
    options = embedding.options() if embedding is not None and hasattr(embedding, "options") else {}
    names = DEFAULT_INPUTS
    if not options.get("token_types", True):
        names = tuple(name for name in DEFAULT_INPUTS if name != "token_type_ids")
    return (*names, *extra_input_specs(model))


#: third-party messages an export prints that say nothing about the model: (logger, level) and warning filters
_QUIET_LOGGERS = ("torch.onnx._internal.exporter._registration",)  # "torchvision is not installed. Skipping …"
_QUIET_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    (r".*isinstance\(treespec, LeafSpec\)", FutureWarning),  # torch's own pytree deprecation, inside the exporter
    (r"# The axis name: .* will not be used", UserWarning),  # batch/sequence shared by every input: by design
)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's known noise (only those messages; anything else still shows)."""
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        for message, category in _QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def _dynamic_shapes(model: nn.Module, input_names: Sequence[str]) -> dict[str, dict[int, Any]]:
    """Every input's dynamic dimensions: BERT's are ``[batch, sequence]``; a family's own input's axes are its
    :class:`~bertblocks.core.interfaces.ExtraInput`'s (``bbox [batch, sequence, 4]``, ``lang_ids [batch]``). The
    sequence is a multiple of the backbone's :attr:`~bertblocks.core.encoder.EncoderModel.sequence_multiple`
    (Longformer's one-sided window; 1 for most)."""
    max_length = int(getattr(model.config, "max_position_embeddings", 512))
    multiple = backbone_of(model).sequence_multiple
    sequence: Any = torch.export.Dim("sequence", min=1, max=max_length)
    if multiple > 1:
        sequence = multiple * torch.export.Dim("blocks", min=1, max=max(max_length // multiple, 1))
    dims = {"batch": torch.export.Dim("batch", min=1, max=2**20), "sequence": sequence}
    named = _axis_names(model, input_names)
    return {name: {i: dims[axis] for i, axis in axes.items()} for name, axes in zip(input_names, named, strict=True)}


def _axis_names(model: nn.Module, input_names: Sequence[str]) -> list[dict[int, str]]:
    """Every input's dynamic dimensions by name (``{0: "batch", 1: "sequence"}``), as :func:`_dynamic_shapes`."""
    specs = extra_input_specs(model)
    return [
        {
            i: axis
            for i, axis in enumerate(specs[name].axes if name in specs else ("batch", "sequence"))
            if isinstance(axis, str)
        }
        for name in input_names
    ]


def _check_exportable(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "vocab_size"):
        raise InputError(f"{type(model).__name__} is not a bertblocks backbone or task model (no BERT config)")
    if getattr(config, "is_decoder", False):
        raise InputError("exporting a decoder (is_decoder: true, with its key/value cache) is not supported")
    head = getattr(config, "head", None)
    if head is not None and head.name == "multiple_choice":
        raise InputError("exporting multiple choice ([batch, choices, seq] inputs) is not supported")


@_quiet_exporter()
def export_program(
    model: nn.Module,
    example: Mapping[str, torch.Tensor] | None = None,
    input_names: Sequence[str] | None = None,
) -> torch.export.ExportedProgram:
    """``torch.export`` the model (in eval mode) with dynamic batch and sequence dimensions.

    The program takes the inputs as keyword arguments (``input_names``; default: those the model takes,
    :func:`model_inputs`) and returns the model's own output type.

    Raises:
        ValueError: a model that cannot be exported (a decoder, multiple choice), or unknown input names.
    """
    _check_exportable(model)
    model.eval()
    example = dict(example) if example is not None else example_inputs(model, input_names=input_names)
    shapes = _keyword_shapes(model, example)
    with torch.no_grad():
        return torch.export.export(model, args=(), kwargs=example, dynamic_shapes=shapes, strict=False)


def _keyword_shapes(model: nn.Module, example: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The dynamic shapes of ``example`` laid out as ``torch.export`` binds keyword arguments to ``model.forward``: an
    input its signature does not name (a family's own, taken by ``**extra_inputs``) sits under that ``**`` name."""
    shapes = _dynamic_shapes(model, list(example))
    parameters = inspect.signature(model.forward).parameters
    bound = inspect.signature(model.forward).bind(**example).arguments
    return {
        name: {key: shapes[key] for key in value}
        if parameters[name].kind is inspect.Parameter.VAR_KEYWORD
        else shapes[name]
        for name, value in bound.items()
    }


def save_program(program: torch.export.ExportedProgram, path: str | Path) -> Path:
    """Write an exported program (``.pt2``) atomically: a kill or a full disk never truncates an earlier file.

    Raises:
        WriteError: ``path`` is a directory or cannot be written (disk full, read-only folder).
    """
    return write_file(path, lambda f: torch.export.save(program, f))


def output_names_of(model: nn.Module, example: Mapping[str, torch.Tensor]) -> list[str]:
    """The output fields the model sets (``last_hidden_state``, ``pooler_output``; ``logits``; …)."""
    with torch.no_grad():
        out = model(**example)
    return [name for name in out if isinstance(out[name], torch.Tensor)]


@_quiet_exporter()
def export_onnx(
    model: nn.Module,
    path: str | Path,
    example: Mapping[str, torch.Tensor] | None = None,
    input_names: Sequence[str] | None = None,
    opset_version: int | None = None,
) -> Path:
    """Export to ONNX with the dynamo exporter: named inputs and outputs, dynamic ``batch`` and ``sequence``.

    Args:
        model: a bertblocks backbone or task model (put in eval mode).
        path: the ``.onnx`` file to write (weights inside it).
        example: inputs to trace with (default: :func:`example_inputs`).
        input_names: the graph's inputs, in order (default: those the model takes, :func:`model_inputs`).
        opset_version: the ONNX opset (default: the exporter's).

    Returns:
        ``path``.

    The file is replaced atomically (:func:`bertblocks.atomic.write_file`): a kill or a full disk never
    leaves a truncated file in place of an earlier good one.

    Raises:
        ValueError: a model that cannot be exported.
        WriteError: ``path`` is a directory or cannot be written (disk full, read-only folder).
    """
    _check_exportable(model)
    model.eval()
    example = dict(example) if example is not None else example_inputs(model, input_names=input_names)
    names = list(example)
    outputs = output_names_of(model, example)
    view = ExportView(model, names, outputs).eval()
    shapes = {"inputs": tuple(_dynamic_shapes(model, names).values())}
    with torch.no_grad():
        # torch.export first, as export_program does: a dynamic axis the model cannot keep is torch's error there
        # ("Constraints violated"), where the ONNX exporter on its own falls back to a graph fixed to the example's
        # sizes, which fails (or is wrong) on other lengths
        exported = torch.export.export(view, tuple(example.values()), dynamic_shapes=shapes, strict=False)
        program = torch.onnx.export(
            exported,
            tuple(example.values()),
            dynamo=True,
            input_names=names,
            output_names=outputs,
            # the axes' names ("batch", "sequence"): the program holds torch's symbols, the exporter renames them
            dynamic_shapes={"inputs": tuple(_axis_names(model, names))},
            opset_version=opset_version,
            external_data=False,
            verbose=False,
            custom_translation_table=onnx_translations() if is_quantized(model) else None,  # int8: MatMulInteger
        )
    # serialised here and written by Python: a full disk is an OSError naming the file, and the earlier
    # file stays whole until the new one replaces it
    data = program.model_proto.SerializeToString()
    path = write_bytes(path, data)
    return path


__all__ = [
    "DEFAULT_INPUTS",
    "ExportView",
    "backbone_of",
    "example_inputs",
    "export_onnx",
    "export_program",
    "extra_input_specs",
    "model_inputs",
    "output_names_of",
    "save_program",
]
