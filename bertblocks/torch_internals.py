"""Every use of torch's private internals, in one place, behind a version gate, each with a plain fallback.

bertblocks reaches below torch's public API in a few places, for speed or for fewer compiled graphs, never for
correctness:

- :func:`in_optimized_module`: whether ``torch.compile(model)``'s wrapper is calling (a dynamo flag), so the model
  marks its inputs' batch and length dimensions dynamic before the compiler sees them
  (:class:`~bertblocks.models.compiling.CompileEntry`);
- :func:`run_frame_uncompiled`: the compiler's per-code-object frame strategy, so it runs that call eagerly and
  compiles the frames below it;
- :func:`is_marked` / :func:`unmark_dynamic`: the attributes ``maybe_mark_dynamic`` sets on a tensor, so the
  caller's tensors leave a compiled call as they came;
- :func:`module_compiled_call`, :func:`compiled_call`, :func:`set_compiled_call`: ``nn.Module.compile``'s slot
  (whether ``model.compile()`` set it; ``optimize_for_inference`` installs its call there);
- :func:`dynamic_output_size`: a data-dependent size made directly in the compiler's shape environment, for the
  packing op's fake kernel (:mod:`bertblocks.core.packing`), so packing stays in one graph whatever the
  process-wide compiler settings;
- :func:`parameters_on_meta`: parameters registered inside it land on the ``meta`` device (buffers stay real), by
  swapping ``nn.Module.register_parameter`` for the duration (process-wide: a module built by another thread
  meanwhile gets meta parameters too, so loading holds a lock around it).

Each internal is looked up when it is used (``getattr``: an attribute torch renamed or removed reads as missing),
and only on the torch versions it was checked on (:data:`CHECKED_TORCH`). Elsewhere, or when it is missing, the
plain fallback runs: still correct, possibly slower: the model is compiled as any module (a second sequence length
compiles a second, dynamic graph), and packing under the compiler breaks the graph at ``nonzero`` (unless
``torch._dynamo.config.capture_dynamic_output_shape_ops`` is on) instead of holding it. Tests simulate a missing
internal (``tests/test_torch_internals.py``) and check that no other module of bertblocks reaches ``torch._…``.
"""

from __future__ import annotations

import re
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

#: the torch versions (major, minor) the internals here were checked on (tests/test_compile_routes.py,
#: tests/test_packing_compile.py and tests/test_torch_internals.py green); elsewhere the fallbacks run.
#: Add a version after running those tests on it.
CHECKED_TORCH: tuple[tuple[int, int], ...] = ((2, 13),)

_META = torch.device("meta")
_DEFERRED = threading.RLock()


def torch_version(version: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``version`` (default: the running torch's; ``"2.13.0+cpu"`` → ``(2, 13)``)."""
    found = re.match(r"(\d+)\.(\d+)", version or torch.__version__)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def internals_enabled() -> bool:
    """Whether the running torch is one the internals were checked on (:data:`CHECKED_TORCH`)."""
    return torch_version() in CHECKED_TORCH


def _internal(owner: Any, *names: str) -> Any:
    """``owner.names[0].names[1]…`` on a checked torch, else ``None`` (also when any step is missing)."""
    if not internals_enabled():
        return None
    for name in names:
        owner = getattr(owner, name, None)
        if owner is None:
            return None
    return owner


# ------------------------------------------------------------------------------------------- compiling
def in_optimized_module() -> bool:
    """Whether ``torch.compile(model)``'s wrapper is calling now; ``False`` where that cannot be known (the model
    then marks nothing, and the compiler treats it as any module)."""
    dynamo = sys.modules.get("torch._dynamo")  # not loaded: nothing was compiled in this process
    check = _internal(dynamo, "eval_frame", "_is_in_optimized_module") if dynamo is not None else None
    return bool(check()) if check is not None else False


def module_compiled_call(module: nn.Module) -> bool:
    """Whether ``module.compile()`` set the module's compiled call (``False`` where that cannot be known)."""
    if not internals_enabled():
        return False
    return compiled_call(module) is not None


def compiled_call(module: nn.Module) -> Any:
    """The call ``nn.Module.compile`` installed on ``module`` (its ``_compiled_call_impl`` slot), or ``None``."""
    return getattr(module, "_compiled_call_impl", None)


def set_compiled_call(module: nn.Module, call: Any) -> None:
    """Install ``call`` in ``nn.Module.compile``'s slot (``None``: eager again), so ``module(...)`` goes through it
    with hooks and module names untouched. On a torch without the slot the attribute is read by nobody: the module
    runs eagerly (correct, slower)."""
    module._compiled_call_impl = call


def mark_dynamic(tensor: torch.Tensor, dims: list[int]) -> None:
    """Hint the compiler that ``dims`` of ``tensor`` vary (``torch._dynamo.maybe_mark_dynamic``)."""
    import torch._dynamo  # loaded already when a compiled call gets here

    torch._dynamo.maybe_mark_dynamic(tensor, dims)


def is_marked(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` carries dynamic-dimension marks (its caller's, or ours)."""
    return hasattr(tensor, "_has_dynamo_dim_marking")


def unmark_dynamic(tensor: torch.Tensor) -> None:
    """Take the marks :func:`mark_dynamic` set off ``tensor`` again (where torch keeps them where we know)."""
    for name in ("_dynamo_weak_dynamic_indices", "_has_dynamo_dim_marking"):
        if hasattr(tensor, name):
            delattr(tensor, name)


def run_frame_uncompiled(code: types.CodeType) -> bool:
    """Have the compiler run the frames of ``code`` as plain Python and compile the frames they call as usual (a
    code object's strategy, read by the compiler's frame hook only: a call *inlined* while tracing a wrapper is
    traced as any other). The helpers of this module such a frame calls run the same way (compiled, a helper's
    frame would fail on ``maybe_mark_dynamic``). Returns whether it could; without it, the compiler starts at the
    function itself (and, for ``CompileEntry.__call__``, nothing is marked: a second length recompiles once)."""
    setter = _internal(torch._C, "_dynamo", "eval_frame", "set_code_exec_strategy")
    strategy = _internal(torch._C, "_dynamo", "eval_frame", "_FrameExecStrategy")
    action = _internal(torch._C, "_dynamo", "eval_frame", "_FrameAction")
    if setter is None or strategy is None or action is None:
        return False
    for each in (code, *(helper.__code__ for helper in _CALLED_FROM_UNCOMPILED_FRAMES)):
        setter(each, strategy(action.SKIP, action.DEFAULT))
    return True


def dynamic_output_size(op: Any) -> Any:
    """A data-dependent output size in a fake kernel (``torch.library.register_fake``): an unbacked symbol made
    directly in the compiler's shape environment, as ``nonzero`` gets under
    ``capture_dynamic_output_shape_ops``, without that process-wide flag.

    Fallback: the public ``torch.library.get_ctx().new_dynamic_size()``, which the compiler refuses unless that
    flag is on (it then breaks the graph at the op and runs it eagerly: correct, slower).

    Raises:
        DynamicOutputShapeException: a fake mode without symbolic shapes (the caller runs the op eagerly).
    """
    ctx = torch.library.get_ctx()
    allocate = _internal(torch, "_library", "fake_impl", "allocate_size")
    if allocate is None or not hasattr(ctx, "_shape_env"):
        return ctx.new_dynamic_size()
    if ctx._shape_env is None:  # a fake mode without symbolic shapes cannot hold a data-dependent size
        raise torch._subclasses.fake_tensor.DynamicOutputShapeException(op)
    return allocate(ctx._shape_env, 1)


#: the helpers CompileEntry.__call__ calls: they run as plain Python under the compiler, as it does
_CALLED_FROM_UNCOMPILED_FRAMES = (
    in_optimized_module,
    module_compiled_call,
    mark_dynamic,
    is_marked,
    unmark_dynamic,
    _internal,
    internals_enabled,
    torch_version,
)


# ------------------------------------------------------------------------------------------ meta device
@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside, every parameter a module registers lands on the ``meta`` device (buffers stay real).

    ``nn.Module.register_parameter`` is swapped for the duration; a re-entrant lock keeps two loads from
    interleaving their swaps (a thread building a module outside any load meanwhile still gets meta parameters:
    the swap is process-wide).
    """
    with _DEFERRED:
        original = nn.Module.register_parameter

        def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
            original(module, name, param)
            if param is not None and not param.is_meta:
                module._parameters[name] = nn.Parameter(param.to(_META), requires_grad=param.requires_grad)

        nn.Module.register_parameter = register  # type: ignore[method-assign]
        try:
            yield
        finally:
            nn.Module.register_parameter = original  # type: ignore[method-assign]


__all__ = [
    "CHECKED_TORCH",
    "compiled_call",
    "dynamic_output_size",
    "in_optimized_module",
    "internals_enabled",
    "is_marked",
    "mark_dynamic",
    "module_compiled_call",
    "parameters_on_meta",
    "run_frame_uncompiled",
    "set_compiled_call",
    "torch_version",
    "unmark_dynamic",
]
