"""The model's own call as ``torch.compile``'s entry: one graph for every batch size and sequence length.

``torch.compile`` specialises a graph on the sizes of its first inputs and recompiles when a size changes (its
default ``dynamic=None`` then makes that size symbolic: a second graph). Training and evaluation loops pad each
batch to its longest row, so every batch has a new length. :class:`CompileEntry`, a base of every bertblocks model
class, marks the batch and length dimensions of the call's tensor arguments dynamic
(``maybe_mark_dynamic``) *before* the compiler sees them, when, and only when, the call is the
entry of a compiled model:

- ``torch.compile(model)`` (an ``OptimizedModule``; transformers' ``Trainer(torch_compile=True)`` compiles this
  way): the compiler is asked to skip the frame of :meth:`CompileEntry.__call__` itself (a per-code-object
  setting, the one dynamo's ``skip`` makes, without the flag that would make the function a graph break when
  it is *inlined*; :func:`bertblocks.torch_internals.run_frame_uncompiled`), so the marks are made eagerly and
  the compiler starts at ``nn.Module.__call__`` below;
- ``model.compile()``: ``nn.Module.__call__`` calls the compiled ``_call_impl``, so this method runs eagerly
  anyway.

Inside a graph (the model called from a compiled wrapper of the user's) it marks nothing and is traced through,
with no graph break: the wrapper's inputs are the compiler's, and the user's to mark. No compiler setting is read
or changed; the marks sit on the call's tensors while it runs (``maybe_mark_dynamic`` is a hint: a dimension the
graph needs static, such as a size of 1, stays static) and go again when it returns, so the caller's tensors leave
as they came (a tensor the caller marked itself is left alone).

Packing inside the graph needs no setting either: see :func:`bertblocks.core.packing.real_token_index`.

The torch internals this needs live in :mod:`bertblocks.torch_internals`, behind its version gate: on a torch
where one is missing, the call is a plain module's (correct; a second sequence length compiles a second graph).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import torch_internals

#: how many leading dimensions of each tensor argument are marked dynamic: batch and sequence length
DYNAMIC_DIMS = 2


class CompileEntry(nn.Module):
    """``nn.Module`` whose call marks its inputs' batch and length dimensions dynamic when it enters a compiled
    graph (see the module)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The compiler skips this frame but compiles the frames it calls: what runs here is torch's (which it leaves
        # alone) or bertblocks.torch_internals (skipped the same way, below). is_compiling() is a constant True while
        # the compiler traces this call from a wrapper's graph: the branch is then gone, and nothing here is a graph
        # break. Where the internals are missing (another torch), in_optimized_module() is False and
        # module_compiled_call() too: the call is a plain module's, and the compiler makes a second length dynamic.
        if (
            torch.compiler.is_compiling()
            # neither torch.compile(model)'s wrapper is calling nor model.compile() (or optimize_for_inference) set
            # the call: an eager call
            or not (torch_internals.in_optimized_module() or torch_internals.module_compiled_call(self))
        ):
            return super().__call__(*args, **kwargs)
        # the caller's tensors, unless the caller marked them: the marks go again after the call, so that the
        # same tensors given to another compiled function find it as they left it (a mark present at one call
        # and absent at the next recompiles a graph)
        # (plain loops: a comprehension is a frame of its own before Python 3.12, which the compiler would compile)
        marked: list[torch.Tensor] = []
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.ndim and not torch_internals.is_marked(value):
                torch_internals.mark_dynamic(value, list(range(min(value.ndim, DYNAMIC_DIMS))))
                marked.append(value)  # once: a tensor given twice is marked the first time
        try:
            return super().__call__(*args, **kwargs)
        finally:
            for value in marked:
                torch_internals.unmark_dynamic(value)


# the compiler runs CompileEntry.__call__ and the helpers it calls eagerly (their marks must be made before the
# compiler sees the inputs), and compiles the frames below as usual
torch_internals.run_frame_uncompiled(CompileEntry.__call__.__code__)

__all__ = ["DYNAMIC_DIMS", "CompileEntry"]
