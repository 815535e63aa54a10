"""The inference fast path: one call that turns a loaded model into a compiled, packed, frozen inference model.

:func:`optimize_for_inference` keeps the model a plain PyTorch module (same object, same module names, same
``state_dict`` keys, same forward arguments and outputs) and compiles its ``__call__`` with Inductor:

- **packing in the graph** — padded batches run their dense layers on the real tokens only, in one graph
  whose token count is symbolic (no recompilation per batch, no host sync; see :mod:`bertblocks.core.packing`);
- **dynamic shapes** — batch size and length are symbolic from the first call, so varied batches reuse one
  graph;
- **freezing** — weights become constants of the graph, and Inductor folds what depends on weights only;
- **per-sequence attention** — the SDPA backend runs packed sequences one unmasked call each (inside one custom
  op, see :mod:`bertblocks.plugins.varlen.sdpa`) instead of a re-padded, masked call;
- **fused epilogues** — Inductor fuses bias + GELU into the matmul and residual + LayerNorm into one kernel.

Example:
    >>> import bertblocks, torch
    >>> model = bertblocks.from_pretrained("path/to/bert")
    >>> fast = bertblocks.optimize_for_inference(model)   # the same object, compiled on its first call
    >>> out = fast(input_ids=ids, attention_mask=mask)    # runs in inference mode; no gradients
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch import nn

from ..errors import InputError
from ..progress import stage
from ..torch_internals import compiled_call, set_compiled_call

M = TypeVar("M", bound=nn.Module)

#: Inductor's modes this path accepts; ``None`` is Inductor's default.
MODES = (None, "default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")
#: the progress line of the first call, which compiles (10 s to minutes; later calls reuse the graph)
COMPILING = "compiling for inference (first call, once per shape bucket)"


class FastCall:
    """A model's compiled ``__call__``: applies the Inductor settings the fast path needs around each call
    (they are read when a graph is compiled; scoping them here leaves other compiled code in the process
    untouched) and runs the call in inference mode. Packing needs no setting (see
    :func:`bertblocks.core.packing.real_token_index`). The first call, which compiles, says so on a terminal
    (:func:`bertblocks.progress.stage`: a line, then how long it took)."""

    def __init__(self, compiled: Callable[..., Any], freeze: bool, weight_prepack: bool = False) -> None:
        self.compiled = compiled
        self.freeze = freeze
        self.weight_prepack = weight_prepack
        self.compiled_once = False  # set after the first call that returns (a failed one compiles again)

    @contextlib.contextmanager
    def _settings(self) -> Iterator[None]:
        # imported where used: the compiler's modules cost about a second, which `import bertblocks` must not pay
        import torch._inductor.config

        with (
            torch._inductor.config.patch({"freezing": self.freeze, "cpp.weight_prepack": self.weight_prepack}),
            torch.inference_mode(),
        ):
            yield

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._settings():
            if self.compiled_once:
                return self.compiled(*args, **kwargs)
            with stage(COMPILING):
                out = self.compiled(*args, **kwargs)
            self.compiled_once = True
            return out


def optimize_for_inference(
    model: M,
    *,
    mode: str | None = None,
    freeze: bool = True,
    dynamic: bool = True,
    fullgraph: bool = True,
    weight_prepack: bool = False,
) -> M:
    """Compile ``model`` for inference: packed, dynamic-shape, frozen weights, fused kernels (see the module).

    The model is switched to ``eval()`` and changed in place (its ``__call__`` is compiled on the first call,
    as :meth:`torch.nn.Module.compile` does); module names, parameters and ``state_dict`` keys stay as they
    are. Calls then run under :func:`torch.inference_mode`.

    Frozen weights are read when a graph is compiled: apply adapters (PEFT), pruning or hooks *before* this
    call; to change weights afterwards, call :func:`restore_eager` (or pass ``freeze=False``, which keeps the
    weights as graph inputs at some cost in speed).

    Args:
        model: a bertblocks backbone or task model (any ``nn.Module`` works; packing is bertblocks').
        mode: Inductor's ``mode`` (``None``: its default; ``"max-autotune-no-cudagraphs"`` also tries GEMM
            templates with fused epilogues, at a much longer first call).
        freeze: freeze the weights into the graph (constant folding; pre-packing only with ``weight_prepack``).
        dynamic: symbolic batch size and length from the first call.
        fullgraph: fail if the forward pass does not compile in one graph (bertblocks' does).
        weight_prepack: let Inductor re-lay frozen weights for oneDNN's matmul. Off by default: with a symbolic
            token count (every packed batch) Inductor then calls oneDNN's ``_linear_pointwise`` instead of
            MKL's GEMM, which took about 1.5x as long on an AVX2 CPU (docs/explanation/performance.md);
            try it on CPUs with AVX-512 or AMX, where oneDNN has its fastest kernels.

    Returns:
        ``model`` itself.

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in MODES:
        raise InputError(f"optimize_for_inference: mode must be one of {MODES}, got {mode!r}")
    model.eval()
    compiled = torch.compile(model._call_impl, mode=mode, dynamic=dynamic, fullgraph=fullgraph)
    # nn.Module.compile's own slot: __call__ goes through it, so hooks and module names are untouched.
    set_compiled_call(model, FastCall(compiled, freeze, weight_prepack))
    return model


def restore_eager(model: M) -> M:
    """Undo :func:`optimize_for_inference`: ``model`` runs eagerly again (still in ``eval()`` mode)."""
    set_compiled_call(model, None)
    return model


def is_optimized(model: nn.Module) -> bool:
    """Whether :func:`optimize_for_inference` compiled ``model``."""
    return isinstance(compiled_call(model), FastCall)


__all__ = ["FastCall", "is_optimized", "optimize_for_inference", "restore_eager"]
