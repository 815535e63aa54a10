"""torch's private internals live in one module (bertblocks/torch_internals.py), behind a version gate, each
with a plain fallback: a torch without one (simulated here by taking it away) still runs the model correctly and
still compiles it (possibly into more graphs); and no other module of bertblocks reaches ``torch._…``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import bertblocks
from bertblocks import torch_internals
from tests.conftest import TINY
from tests.tolerances import assert_close

PACKAGE = Path(bertblocks.__file__).parent

#: ``torch._…`` names that are public by convention (documented entry points), allowed anywhere, each with why
ALLOWED = {
    "torch._check": "documented (torch._check): a size assertion the compiler reads",
    "torch._dynamo": "the compiler's documented entry points (reset, config, maybe_mark_dynamic)",
    "torch._dynamo.reset": "documented: clears compiled graphs (the conformance suite's compile check)",
    "torch._inductor": "the inductor config, documented for torch.compile's options",
    "torch._inductor.config": "documented inductor settings (the inference fast path patches them for its call)",
    "torch._inductor.config.patch": "documented context manager of the inductor config",
    # the int8 kernels of models/quantize.py (chosen by CPU capability there, each with its own fallback to fp32
    # when the CPU has no int8 kernel that beats it): the public alternatives are slower or absent
    "torch._int_mm": "int8 GEMM on VNNI/AMX CPUs (models/quantize.py's INT_MM kernel)",
    "torch._make_per_tensor_quantized_tensor": "wraps int8 weights for fbgemm's prepack (the AVX2 kernel)",
}
#: private names of torch objects reached as attributes of something other than ``torch`` itself
PRIVATE_ATTRIBUTES = {
    "_is_in_optimized_module",
    "_compiled_call_impl",
    "_shape_env",
    "allocate_size",
    "set_code_exec_strategy",
    "_FrameExecStrategy",
    "_FrameAction",
    "_has_dynamo_dim_marking",
    "_dynamo_weak_dynamic_indices",
    "register_parameter",  # assigning nn.Module.register_parameter is the process-wide swap
}


def private_torch_uses(source: str) -> list[str]:
    """The ``torch._…`` names (attribute chains and imports) and known private torch attributes in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("torch._") and a.name not in ALLOWED]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch._"):
            found.append(f"from {node.module} import …")
        elif isinstance(node, ast.Attribute):
            parts, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if node.attr in PRIVATE_ATTRIBUTES and not (
                isinstance(node.ctx, ast.Load) and node.attr == "register_parameter"
            ):
                found.append(node.attr)
            if isinstance(inner, ast.Name) and inner.id == "torch":
                dotted = ".".join(["torch", *reversed(parts)])
                if (
                    parts[-1].startswith("_")
                    and not parts[-1].startswith("__")
                    and not any(dotted == a or dotted.startswith(a + ".") for a in ALLOWED)
                ):
                    found.append(dotted)
    return found


def test_the_scan_finds_private_uses():
    planted = "import torch._foo\nx = torch._C._dynamo.eval_frame\ny = mod.eval_frame._is_in_optimized_module()\n"
    planted += "nn.Module.register_parameter = f\nz = torch._check(True)\nv = torch.__version__\n"
    assert set(private_torch_uses(planted)) == {
        "torch._foo",
        "torch._C._dynamo.eval_frame",
        "torch._C._dynamo",
        "torch._C",
        "_is_in_optimized_module",
        "register_parameter",
    }


def test_no_module_outside_torch_internals_uses_private_torch():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "torch_internals.py" and path.parent == PACKAGE:
            continue
        found = private_torch_uses(path.read_text())
        if found:
            offenders[str(path.relative_to(PACKAGE))] = sorted(set(found))
    assert not offenders, f"private torch internals outside bertblocks/torch_internals.py: {offenders}"


def test_the_version_gate_reads_torch_versions():
    assert torch_internals.torch_version("2.13.0+cpu") == (2, 13)
    assert torch_internals.torch_version("2.4.1") == (2, 4)
    assert torch_internals.internals_enabled() == (torch_internals.torch_version() in torch_internals.CHECKED_TORCH)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    overrides = {"encoder.packing": "always", "hidden_dropout_prob": 0.0, "encoder.attention.dropout": 0.0}
    return bertblocks.create_model({**TINY, "initializer_range": 0.2}, overrides).eval()


def _batch(length: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(length)
    lengths = torch.tensor([length, max(1, length - 3), 2])
    return {
        "input_ids": torch.randint(1, TINY["vocab_size"], (3, length), generator=g),
        "attention_mask": (torch.arange(length)[None, :] < lengths[:, None]).long(),
    }


class _Counting:
    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _compiled_equals_eager() -> int:
    import torch._dynamo

    torch._dynamo.reset()
    model = _model()
    backend = _Counting()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for length in (7, 9, 11):
            batch = _batch(length)
            real = batch["attention_mask"].bool()
            expected = model(**batch).last_hidden_state
            got = compiled(**batch).last_hidden_state
            assert_close(got[real], expected[real])
    torch._dynamo.reset()
    return backend.graphs


@pytest.mark.compile
@pytest.mark.parametrize(
    "missing", ["_is_in_optimized_module", "allocate_size", "set_code_exec_strategy", "version gate"]
)
def test_without_an_internal_the_model_runs_and_compiles_correctly(monkeypatch, missing):
    model = _model()
    with torch.no_grad():
        before = model(**_batch(9)).last_hidden_state
    if missing == "version gate":  # a torch the internals were not checked on: every fallback at once
        monkeypatch.setattr(torch_internals, "CHECKED_TORCH", ())
        assert not torch_internals.internals_enabled()
    else:
        # the internal as torch_internals looks it up reads as missing (taking it out of torch itself would break
        # torch, whose own code refers to it)
        lookup = torch_internals._internal
        monkeypatch.setattr(
            torch_internals, "_internal", lambda owner, *names: None if names[-1] == missing else lookup(owner, *names)
        )
        if missing == "set_code_exec_strategy":
            assert not torch_internals.run_frame_uncompiled(_model.__code__)
    if missing in ("_is_in_optimized_module", "version gate"):
        assert not torch_internals.in_optimized_module()
    with torch.no_grad():  # the eager model is the same computation: the same kernels on the same data
        assert torch.equal(model(**_batch(9)).last_hidden_state, before)
    assert _compiled_equals_eager() >= 1
