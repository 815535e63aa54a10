"""Loading weights without the work they replace.

``from_pretrained`` builds the model with its parameters on the ``meta`` device (shapes only: no memory, no
random initialisation), then *assigns* the checkpoint's tensors as the parameters (no second copy), and
finally initialises, HF's way, only the parameters the checkpoint did not provide (a new head, say).
Buffers are created normally: they are small and some (``position_ids``) must hold real values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from ..errors import InputTypeError
from ..hf.weights import tied_parameters
from ..torch_internals import parameters_on_meta
from .weight_init import init_module


@contextmanager
def deferred_init() -> Iterator[None]:
    """Inside, every parameter a module registers lands on the ``meta`` device (buffers stay real).

    The swap of ``nn.Module.register_parameter`` this takes is process-wide, so it lives with torch's other
    internals, under a lock: :func:`bertblocks.torch_internals.parameters_on_meta`.
    """
    with parameters_on_meta():
        yield


def load_into(model: nn.Module, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> None:
    """Load matched checkpoint tensors into ``model``.

    Parameters still on ``meta`` take the checkpoint tensor itself instead of a copy, cast once: floating-point
    tensors to ``dtype`` when given (the dtype the model is loaded in: a float64 checkpoint loaded in float64
    never passes through float32), else to the parameter's dtype. Tied parameters (a masked-LM decoder and the
    token embeddings) are tied again after.
    """
    tied = tied_parameters(model)  # second name → first name, recorded before parameters are replaced
    deferred = any(p.is_meta for p in model.parameters())
    if deferred:
        current = model.state_dict(keep_vars=True)

        def target(key: str, tensor: torch.Tensor) -> torch.dtype:
            own = current[key].dtype
            return dtype if dtype is not None and own.is_floating_point and tensor.is_floating_point() else own

        tensors = {k: v.to(target(k, v)) if k in current else v for k, v in tensors.items()}
    model.load_state_dict(tensors, strict=False, assign=deferred)
    _tie_again(model, tied)


def non_finite(tensors: Mapping[str, torch.Tensor], chunk: int = 1 << 24) -> dict[str, int]:
    """Tensor name → how many of its values are NaN or infinite, for the floating-point tensors that hold any.

    One sum per tensor screens them (a NaN or inf makes the sum non-finite; one pass, no scratch memory);
    only a tensor whose sum is not finite is counted, in chunks of ``chunk`` values (a sum that merely
    overflows counts zero and is not reported).
    """
    found = {}
    for name, tensor in tensors.items():
        if not tensor.is_floating_point() or tensor.is_meta or not tensor.numel():
            continue
        if bool(torch.isfinite(tensor.sum())):
            continue
        bad = sum(int(part.numel() - torch.isfinite(part).sum()) for part in tensor.reshape(-1).split(chunk))
        if bad:
            found[name] = bad
    return found


def materialize(model: nn.Module, std: float) -> list[str]:
    """Give every parameter still on ``meta`` real memory and HF's initialisation; return their names."""
    names = [name for name, p in model.named_parameters() if p.is_meta]
    if not names:
        return []
    tied = tied_parameters(model)
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        if any(p.is_meta for p in own.values()):
            # e.g. a loaded weight whose bias was missing: to_empty swaps every parameter's data, so the
            # loaded tensors are kept aside and put back after the module's initialisation
            loaded = {name: p.data for name, p in own.items() if not p.is_meta}
            module.to_empty(device="cpu", recurse=False)
            if not init_module(module, std):
                missing = [name for name, p in own.items() if p.is_meta]
                raise InputTypeError(
                    f"{type(module).__module__}.{type(module).__qualname__} owns parameters {missing} that the "
                    "checkpoint lacks, and bertblocks does not know how to initialise them: define "
                    "reset_parameters_like_hf(std) on the module (see the writing-a-plugin guide)"
                )
            for name, data in loaded.items():
                getattr(module, name).data = data
    _tie_again(model, tied)  # to_empty made new tensors for both names
    return names


def _tie_again(model: nn.Module, tied: Mapping[str, str]) -> None:
    """Point every second name of a tied parameter (``second → first``) at the first name's parameter."""
    for second, first in tied.items():
        owner, _, leaf = second.rpartition(".")
        setattr(model.get_submodule(owner), leaf, model.get_parameter(first))
