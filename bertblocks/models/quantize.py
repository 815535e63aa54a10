"""Int8 inference: int8 weights and dynamic int8 activations for every projection of a model, opt-in.

:func:`quantize` replaces each projection of an eval-mode fp32 model (backbone and heads) with an
:class:`Int8Linear`: every ``nn.Linear``, and every grouped projection
(:class:`~bertblocks.core.interfaces.GroupedProjection`: ConvBERT's grouped feed-forward, SqueezeBERT's grouped
pointwise convolutions), which keeps its groups (each group one int8 product of its input slice):

- **weights**: int8, symmetric, one scale per output channel (``weight`` ``[out, in]``, ``[out, in/groups]`` for a
  grouped projection, next to a ``weight_scale`` ``[out]`` buffer); the bias stays fp32;
- **activations**: quantized per call, symmetric, one scale per token (row), then an int8 × int8 → int32
  kernel multiplies them and the result is scaled back to fp32 (``acc · s_token · s_channel + bias``).

**The kernel is chosen by what the CPU has** (:func:`choose_kernel`, once per :func:`quantize` call, recorded on
the model and in ``quantization.json``):

- ``"int_mm"``: ``torch._int_mm``. PyTorch sends it to oneDNN only on a CPU with AVX-512 VNNI (AMX CPUs have it
  too); elsewhere it runs a plain C++ loop, 20-70x *slower* than fp32. So: CPUs with AVX-512 VNNI.
- ``"fbgemm"``: fbgemm's u8 × s8 GEMM through ``torch.ops.quantized`` (weights pre-packed once, a cache of the
  int8 ``weight`` buffer). Without VNNI, fbgemm multiplies with ``vpmaddubsw``, which adds two u8 · s8 products
  in int16 and saturates past 32767; weights therefore keep 7 bits (``|q| ≤ 63``: 255 · 63 · 2 < 32768), so
  the sums stay exact, while activations keep their 8 bits (per-token, as on VNNI; a 7-bit activation loses
  more accuracy than a 7-bit weight). So: AVX2 CPUs without AVX-512 VNNI.
- neither (no x86 vector ISA, no fbgemm: e.g. ARM): no int8 kernel is known to beat fp32, so :func:`quantize`
  warns (:class:`QuantizationWarning`) and leaves the model in fp32, unless ``force=True``.

The layers stay plain tensors, which is why this module does not use PyTorch's
``torch.ao.quantization.quantize_dynamic`` (fbgemm's ``quantized::linear_dynamic``): that op keeps its weights
in an opaque packed object, which ``torch.compile`` cannot trace (so no packing in the graph and no fast
path), ``state_dict`` cannot hold as tensors, and no ONNX exporter translates. The ``"fbgemm"`` kernel keeps
the packed object out of the module's state: the ``weight`` buffer is the truth, the packed copy a cache
checked at every call, and the call is a custom op that ``torch.compile`` and ``torch.export`` see as one node
(an export writes ``_int_mm``, which runs anywhere). The model stays traceable:
:func:`bertblocks.optimize_for_inference` compiles a quantized model into one graph (Inductor fuses
the activation quantization into the preceding kernel and the rescale into the matmul's epilogue), packing
works as in fp32 (the layers see ``[tokens, hidden]`` rows), ``state_dict`` holds int8 tensors
(:func:`save_quantized` / :func:`load_quantized`), and :func:`bertblocks.models.export.export_onnx` writes
``MatMulInteger`` nodes (:func:`onnx_translations`). Per-token activation scales are also more accurate than
``quantize_dynamic``'s one scale per tensor. Measured figures: docs/explanation/performance.md.

What is not quantized: embeddings, LayerNorms, attention's two products (softmax(QKᵀ)V runs in fp32), and
the convolutions of ConvBERT's attention, and every projection whose qualified name matches a pattern in ``skip``.

Example:
    >>> import bertblocks
    >>> model = bertblocks.from_pretrained("path/to/bert").eval()
    >>> bertblocks.quantize(model)                 # in place; returns model
    >>> bertblocks.optimize_for_inference(model)   # optional: the compiled fast path, int8 inside
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from ..atomic import reads_folder
from ..core.interfaces import GroupedProjection
from ..errors import BertBlocksError
from ..hf.weight_files import WeightFileError, read_safetensors
from ..readers import ReadError, read_json
from .inference import is_optimized

M = TypeVar("M", bound=nn.Module)

#: the layers :func:`quantize` converts to :class:`Int8Linear` (every check and the conversion read this one tuple)
PROJECTIONS = (nn.Linear, GroupedProjection)

#: symmetric int8 range; -128 is left out so that a value and its negation quantize alike
QMAX = 127
#: smallest scale: an all-zero row (padded positions hold zeros) quantizes to zeros instead of dividing by 0
EPS = 1e-12
#: the files :func:`save_quantized` writes
CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.int8.safetensors"
MANIFEST_FILE = "quantization.json"


class QuantizationError(BertBlocksError, ValueError):
    """A model that :func:`quantize` cannot quantize, or a saved quantized model that cannot be loaded."""


class QuantizationWarning(UserWarning):
    """:func:`quantize` kept a model in fp32: no int8 kernel on this CPU is known to beat fp32."""


# ------------------------------------------------------------------------------------------------ the kernels
#: ``torch._int_mm`` (oneDNN's VNNI/AMX int8 GEMM): weights use all 8 bits
INT_MM = "int_mm"
#: fbgemm's u8 × s8 GEMM (``torch.ops.quantized``): weights keep 7 bits so that AVX2's int16 pair sums cannot
#: saturate
FBGEMM = "fbgemm"
#: the int8 kernels, the one list every check and declaration derives from (``Kernel``, the CLI's choices)
KERNELS = (INT_MM, FBGEMM)
#: one of :data:`KERNELS` as a type (``Literal["int_mm", "fbgemm"]``, built from the tuple so it cannot drift)
Kernel = Literal[KERNELS]
#: the largest weight magnitude each kernel multiplies exactly
WEIGHT_QMAX = {INT_MM: QMAX, FBGEMM: 63}


@dataclass(frozen=True)
class CpuFeatures:
    """What :func:`choose_kernel` decides by (see :func:`cpu_features`).

    Attributes:
        capability: ``torch.backends.cpu.get_cpu_capability()``: the vector ISA ATen runs (``"AVX512"``,
            ``"AVX2"``, ``"DEFAULT"``, ...); ``ATEN_CPU_CAPABILITY=avx2`` lowers it on an AVX-512 CPU.
        avx512_vnni: the CPU has AVX-512 VNNI (the flag ``torch._int_mm`` checks before it uses oneDNN).
        avx_vnni: the CPU has the 256-bit AVX-VNNI (not enough for ``torch._int_mm``'s oneDNN path).
        amx: the CPU has AMX int8 tiles.
        mkldnn: oneDNN is enabled (``torch.backends.mkldnn.enabled``; off, ``_int_mm`` takes its slow loop).
        engines: ``torch.backends.quantized.supported_engines``.
    """

    capability: str
    avx512_vnni: bool
    avx_vnni: bool
    amx: bool
    mkldnn: bool
    engines: tuple[str, ...]

    def describe(self) -> str:
        """One line for warnings and reports: ``"AVX2 (no AVX-512 VNNI, no AMX)"``."""
        flags = [f"{'' if have else 'no '}{name}" for name, have in self._flags()]
        return f"{self.capability} ({', '.join(flags)})"

    def _flags(self) -> list[tuple[str, bool]]:
        return [("AVX-512 VNNI", self.avx512_vnni), ("AVX-VNNI", self.avx_vnni), ("AMX", self.amx)]


def _cpuinfo_flags() -> dict[str, bool]:
    """The CPU flags as PyTorch's cpuinfo reads them (``torch.cpu.get_capabilities``; /proc/cpuinfo before 2.5)."""
    read = getattr(torch.cpu, "get_capabilities", None)
    if read is not None:
        found = read()
        return {
            "avx512_vnni": bool(found.get("avx512_vnni")),
            "avx_vnni": bool(found.get("avx_vnni")),
            "amx": bool(found.get("amx_int8")),
        }
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return {"avx512_vnni": "avx512_vnni" in flags, "avx_vnni": "avx_vnni" in flags, "amx": "amx_int8" in flags}


def cpu_features() -> CpuFeatures:
    """This process's CPU, as the kernels see it (monkeypatch this function to test another CPU)."""
    return CpuFeatures(
        capability=torch.backends.cpu.get_cpu_capability(),
        mkldnn=torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
        engines=tuple(torch.backends.quantized.supported_engines),
        **_cpuinfo_flags(),
    )


def choose_kernel(features: CpuFeatures) -> str | None:
    """The int8 kernel that beats fp32 on a CPU with ``features``, or ``None`` when none is known to.

    - AVX-512 VNNI (or AMX), ATen running AVX-512, oneDNN on: ``"int_mm"`` (``torch._int_mm`` checks the same
      flag and runs oneDNN's VNNI kernel; without it, a plain loop 20-70x slower than fp32).
    - otherwise AVX2 or AVX-512 with fbgemm built in: ``"fbgemm"`` (0.4x of fp32 per layer on AVX2, measured in
      docs/explanation/performance.md). An ATen capability lowered to AVX2 (``ATEN_CPU_CAPABILITY=avx2``) counts
      as an AVX2 CPU.
    - otherwise ``None``.
    """
    if features.capability == "AVX512" and (features.avx512_vnni or features.amx) and features.mkldnn:
        return INT_MM
    if features.capability in ("AVX2", "AVX512") and FBGEMM in features.engines:
        return FBGEMM
    return None


def quantize_weight(weight: torch.Tensor, qmax: int = QMAX) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: ``(q [out, in] int8, scale [out] fp32)`` with ``weight ≈ q · scale``
    and ``|q| ≤ qmax`` (127, or a kernel's :data:`WEIGHT_QMAX`)."""
    scale = weight.abs().amax(dim=1).clamp(min=EPS) / qmax
    q = torch.round(weight / scale[:, None]).clamp(-qmax, qmax).to(torch.int8)
    return q, scale.to(torch.float32)


class _Packed:
    """fbgemm's packed copy of one int8 weight, with what it was packed from (to tell when it is stale)."""

    def __init__(self, weight: torch.Tensor) -> None:
        # Holding the source keeps its memory alive, so no other tensor can take its address: the same
        # data pointer and version counter mean the same values. (An inference tensor has no version counter,
        # and can only be changed in place under inference_mode; Int8Linear's own buffers never are one.)
        self.source = weight
        self.version = _version(weight)
        qmax = WEIGHT_QMAX[FBGEMM]
        peak = int(weight.abs().max().item()) if weight.numel() else 0
        ratio = 1.0
        if peak > qmax:  # weights saved by the 8-bit kernel: 7 bits here, or AVX2's int16 pair sums saturate
            ratio = peak / qmax
            weight = torch.round(weight.float() / ratio).clamp(-qmax, qmax).to(torch.int8)
        previous = torch.backends.quantized.engine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTorch's deprecation notice on quantized tensor creation
            try:
                torch.backends.quantized.engine = FBGEMM
                qweight = torch._make_per_tensor_quantized_tensor(weight.contiguous(), ratio, 0)
                self.packed = torch.ops.quantized.linear_prepack(qweight, None)
            finally:
                torch.backends.quantized.engine = previous

    def fits(self, weight: torch.Tensor) -> bool:
        return (
            self.source.data_ptr() == weight.data_ptr()
            and self.source.shape == weight.shape
            and _version(self.source) == self.version == _version(weight)
        )


def _version(tensor: torch.Tensor) -> int:
    """The tensor's version counter (bumped by every in-place change); -1 for an inference tensor (none kept)."""
    return -1 if tensor.is_inference() else tensor._version


#: packed weights by the handle of their :class:`Int8Linear` (freed with it)
_PACKED: dict[int, _Packed] = {}
_HANDLES = itertools.count()


@torch.library.custom_op("bertblocks::fbgemm_int8_mm", mutates_args=())
def fbgemm_int8_mm(rows: torch.Tensor, weight: torch.Tensor, handle: int) -> torch.Tensor:
    """``round(127 · rows) @ weightᵀ / 127`` with fbgemm, for rows already divided by their max abs value.

    ``rows`` ``[n, in]`` fp32 in [-1, 1]; ``weight`` ``[out, in]`` int8; ``handle`` names the cache slot of its
    packed copy (repacked whenever ``weight`` is not the tensor it was packed from, or was changed in place).
    """
    packed = _PACKED.get(handle)
    if packed is None or not packed.fits(weight):
        packed = _PACKED[handle] = _Packed(weight)
    # u8 = round(127 · x) + 128: the same integers as the symmetric per-token int8, offset for fbgemm's u8 input
    return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(rows, 1.0 / QMAX, 128, packed.packed)


@fbgemm_int8_mm.register_fake
def _(rows: torch.Tensor, weight: torch.Tensor, handle: int) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], weight.shape[0])


class Int8Linear(nn.Module):
    """``nn.Linear`` (or a grouped projection) with int8 weights (per output channel) and dynamic int8 activations
    (per token).

    Buffers (all in ``state_dict``): ``weight`` int8 ``[out, in/groups]``, ``weight_scale`` fp32 ``[out]``, ``bias``
    fp32 ``[out]`` or ``None``. Inputs ``[..., in]`` fp32, output ``[..., out]`` fp32. ``kernel`` (one of
    :data:`KERNELS`) multiplies; the products are the same integers for both (as long as ``|weight| ≤ 63``).

    With ``groups`` > 1 (a :class:`~bertblocks.core.interfaces.GroupedProjection`: ConvBERT's grouped
    feed-forward, SqueezeBERT's grouped convolutions), output rows ``[g·out/groups, (g+1)·out/groups)`` read input
    slice ``g`` alone: each token is quantized once, over its whole row (the same per-token scale as a dense
    layer), and each group is one int8 product of its slice and its rows.
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, kernel: str = INT_MM, groups: int = 1
    ) -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise QuantizationError(f"Int8Linear: kernel must be one of {KERNELS}, got {kernel!r}")
        if in_features % groups or out_features % groups:
            raise QuantizationError(
                f"Int8Linear: groups {groups} must divide in_features {in_features} and out_features {out_features}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.groups = groups
        self.kernel = kernel
        with torch.inference_mode(False):  # tensors with version counters, even when built under inference_mode
            self.register_buffer("weight", torch.zeros(out_features, in_features // groups, dtype=torch.int8))
            self.register_buffer("weight_scale", torch.ones(out_features))
            self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        if kernel == FBGEMM:  # one packed copy per group (each group's rows are their own GEMM)
            self.handles = [next(_HANDLES) for _ in range(groups)]
            for handle in self.handles:
                weakref.finalize(self, _PACKED.pop, handle, None)

    @classmethod
    def from_float(cls, linear: nn.Linear | GroupedProjection, kernel: str = INT_MM) -> Int8Linear:
        """Quantize a float ``nn.Linear`` or :class:`~bertblocks.core.interfaces.GroupedProjection` for ``kernel``
        (its weights are read once; the result holds no reference to it)."""
        grouped = isinstance(linear, GroupedProjection)
        weight = linear.rows() if grouped else linear.weight  # [out, in/groups]: one output channel a row
        module = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            kernel=kernel,
            groups=linear.groups if grouped else 1,
        )
        with torch.inference_mode(False), torch.no_grad():  # not inference tensors: see __init__
            q, scale = quantize_weight(weight.detach().float(), WEIGHT_QMAX[kernel])
            module.weight = q
            module.weight_scale = scale
            if linear.bias is not None:
                module.bias = linear.bias.detach().float().clone()
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # packed [T, in] or padded [b·s, in]
        peak = rows.abs().amax(dim=1, keepdim=True).clamp(min=EPS)  # [n, 1], one per token
        if self.kernel == FBGEMM and not torch.compiler.is_exporting():  # an export writes _int_mm (runs anywhere)
            unit = rows / peak
            parts = [
                fbgemm_int8_mm(part, weight, handle)
                for part, weight, handle in zip(self._slices(unit), self._weights(), self.handles, strict=True)
            ]
            out = self._join(parts) * (peak * self.weight_scale)
        else:
            scale = peak / QMAX
            q = torch.round(rows / scale).clamp(-QMAX, QMAX).to(torch.int8)
            products = [torch._int_mm(part, w.t()) for part, w in zip(self._slices(q), self._weights(), strict=True)]
            acc = self._join(products)  # [n, out] int32: exact, |acc| <= 127² · in
            out = acc.to(rows.dtype) * (scale * self.weight_scale)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def _slices(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """``rows [n, in]`` as each group's contiguous ``[n, in/groups]`` input."""
        if self.groups == 1:
            return [rows]
        return list(rows.view(rows.shape[0], self.groups, -1).transpose(0, 1).contiguous().unbind(0))

    def _weights(self) -> list[torch.Tensor]:
        """Each group's int8 rows ``[out/groups, in/groups]`` (views of ``weight``)."""
        return list(self.weight.chunk(self.groups, dim=0))

    def _join(self, parts: list[torch.Tensor]) -> torch.Tensor:
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def dequantized_weight(self) -> torch.Tensor:
        """The fp32 weight this layer computes with (``q · scale``), ``[out, in/groups]``."""
        return self.weight.float() * self.weight_scale[:, None]

    def extra_repr(self) -> str:
        groups = f", groups={self.groups}" if self.groups > 1 else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
            f"{groups}, kernel={self.kernel}"
        )


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` holds an :class:`Int8Linear` (that is, :func:`quantize` ran on it)."""
    return any(isinstance(module, Int8Linear) for module in model.modules())


def _check(model: nn.Module) -> None:
    name = type(model).__name__
    if is_quantized(model):
        raise QuantizationError(f"quantize: {name} is already quantized (it holds Int8Linear layers)")
    if is_optimized(model):
        raise QuantizationError(
            f"quantize: {name} was compiled by optimize_for_inference, whose graph holds the fp32 weights; "
            "quantize first, then call optimize_for_inference (or call "
            "bertblocks.models.inference.restore_eager(model) first)"
        )
    training = [n or "(the model)" for n, m in model.named_modules() if m.training]
    if training:
        raise QuantizationError(
            f"quantize: {name} is in training mode ({training[0]} and {len(training) - 1} more modules); int8 "
            "layers are for inference only: call model.eval() first"
        )
    for module_name, module in model.named_modules():
        if not isinstance(module, PROJECTIONS):
            continue
        weight = module.weight
        if weight.dtype != torch.float32:
            raise QuantizationError(
                f"quantize: {module_name}.weight is {weight.dtype}; int8 quantization starts from an fp32 model "
                "(call model.float() first)"
            )
        if weight.device.type != "cpu":
            raise QuantizationError(
                f"quantize: {module_name}.weight is on {weight.device}; the int8 path runs on CPU (model.cpu())"
            )


def _check_fused_parts(model: nn.Module, targets: set[int]) -> None:
    """Refuse a fused query/key/value projection (``Wqkv``) that its layer reads in parts.

    Cross-attention projects queries from the decoder and keys/values from the encoder, and a position term that
    declares ``reads_projections`` (DeBERTa's shared-key disentangled attention) projects the relative table with
    the query or key part alone: both call ``F.linear`` on row slices of ``Wqkv.weight``, which an
    :class:`Int8Linear` holds as int8 (the product would fail at the first call with a dtype error). Self-
    attention calls the whole layer, which quantizes as any other.
    """
    for name, module in model.named_modules():
        wqkv = getattr(module, "Wqkv", None) if getattr(module, "fused", False) else None
        if not isinstance(wqkv, nn.Linear) or id(wqkv) not in targets:
            continue
        bias = getattr(module, "position_bias", None)
        if "crossattention" in name.split("."):  # transformers' (and the checkpoint's) name for the sub-layer
            why = "cross-attention, which projects the query and the key/value from different inputs,"
        elif getattr(bias, "reads_projections", False):
            why = f"the position term {type(bias).__name__}, which projects its table with the query or key part,"
        else:
            continue
        raise QuantizationError(
            f"quantize: {name}.Wqkv is a fused query/key/value projection that {why} reads in parts (row "
            "slices of its weight), which an int8 layer cannot serve: build the model with "
            f"encoder.attention.fused_qkv: false, or keep the layer in fp32 with skip=['*.{name.split('.')[-2]}"
            ".self.Wqkv'] (or its full name)"
        )


def _roots(model: nn.Module) -> list[nn.Module]:
    """``model`` and every module held as a plain attribute by one of its modules (a task model's ``head``)."""
    roots = [model]
    seen = {id(model)}
    index = 0
    while index < len(roots):
        for module in roots[index].modules():
            for value in vars(module).values():
                if isinstance(value, nn.Module) and id(value) not in seen:
                    seen.add(id(value))
                    roots.append(value)
            seen.add(id(module))
        index += 1
    return roots


def quantize(model: M, *, skip: Sequence[str] = (), kernel: str = "auto", force: bool = False) -> M:
    """Quantize every projection of ``model`` (backbone and heads: each ``nn.Linear`` and grouped projection,
    :data:`PROJECTIONS`) to :class:`Int8Linear`, in place.

    Compose with the rest of the inference stack: packing works unchanged, and
    :func:`bertblocks.optimize_for_inference` compiles the quantized model (call it *after* this function).
    Weights tied to the word embeddings (a masked-LM decoder) get their own int8 copy; the embedding table
    stays fp32.

    The int8 kernel is chosen by what this CPU has (:func:`choose_kernel`); which one ran is recorded
    (:func:`quantization_kernel`, ``quantization.json``). Where no int8 kernel is known to beat fp32, the model
    stays in fp32 with a :class:`QuantizationWarning` (``force=True`` quantizes anyway, with ``"int_mm"``).

    Args:
        model: an fp32 bertblocks backbone or task model on CPU, in ``eval()`` mode (any ``nn.Module`` works).
        skip: ``fnmatch`` patterns of qualified module names to keep in fp32 (``["cls.*"]`` keeps a masked-LM
            head; ``["*.classifier"]`` a classifier).
        kernel: ``"auto"`` (by this CPU), or one of :data:`KERNELS` to override the choice.
        force: quantize even where no int8 kernel is known to beat fp32 on this CPU.

    Returns:
        ``model`` itself (still fp32 if no kernel beats fp32 and ``force`` is off).

    Raises:
        QuantizationError: a model in training mode, with non-fp32 or non-CPU linear weights, already
            quantized, already compiled by ``optimize_for_inference``, with no projection to quantize, or
            with a fused ``Wqkv`` that cross-attention or a position term reads in parts (name it in ``skip``);
            an unknown ``kernel``, or ``"fbgemm"`` on a PyTorch built without it.
    """
    _check(model)
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, PROJECTIONS) and not any(fnmatch.fnmatchcase(name, p) for p in skip)
    ]
    if not targets:
        raise QuantizationError(
            f"quantize: {type(model).__name__} has no nn.Linear or grouped projection to quantize (skip={list(skip)!r})"
        )
    _check_fused_parts(model, {id(module) for _, module in targets})
    chosen = _resolve_kernel(kernel, force)
    if chosen is None:
        model._bertblocks_quantization = {"scheme": None, "skip": list(skip), "kernel": None}
        return model
    converted: dict[int, Int8Linear] = {}  # a layer shared by several names (ALBERT) stays shared
    for _, module in targets:
        if id(module) not in converted:
            converted[id(module)] = Int8Linear.from_float(module, kernel=chosen)
    # Replace by identity wherever the layer is a child: a task model's head object holds the same modules
    # as the model (which registers them under HF's names) without being a registered submodule itself.
    for root in _roots(model):
        for parent in root.modules():
            for child_name, child in parent._modules.items():
                if child is not None and id(child) in converted:
                    parent._modules[child_name] = converted[id(child)]
    # read by save_quantized (quantization.json) and quantization_kernel
    model._bertblocks_quantization = {"scheme": "int8-dynamic", "skip": list(skip), "kernel": chosen}
    return model


def _resolve_kernel(kernel: str, force: bool) -> str | None:
    """The kernel :func:`quantize` uses: the one asked for, or this CPU's (``None``: stay in fp32, warned)."""
    if kernel != "auto" and kernel not in KERNELS:
        raise QuantizationError(f"quantize: kernel must be 'auto' or one of {KERNELS}, got {kernel!r}")
    features = cpu_features()
    if kernel == FBGEMM and FBGEMM not in features.engines:
        raise QuantizationError(
            f"quantize: kernel='fbgemm' needs PyTorch's fbgemm engine, which this build lacks (it has "
            f"{list(features.engines)}); use kernel='auto'"
        )
    if kernel != "auto":
        return kernel
    chosen = choose_kernel(features)
    if chosen is None and not force:
        warnings.warn(
            f"quantize: no int8 kernel is known to beat fp32 on this CPU ({features.describe()}; torch._int_mm "
            "needs AVX-512 VNNI, fbgemm AVX2): the model stays in fp32. Pass force=True to quantize anyway.",
            QuantizationWarning,
            stacklevel=3,
        )
    return INT_MM if chosen is None and force else chosen


def quantization_kernel(model: nn.Module) -> str | None:
    """The int8 kernel :func:`quantize` chose for ``model`` (``None``: it kept fp32, or never ran)."""
    return (getattr(model, "_bertblocks_quantization", None) or {}).get("kernel")


# ------------------------------------------------------------------------------------------------ save / load
def save_quantized(model: nn.Module, directory: str | Path) -> Path:
    """Write a quantized bertblocks model: its config (YAML), its int8 ``state_dict`` (safetensors) and a small
    manifest (model class, ``skip``) that :func:`load_quantized` rebuilds it from.

    ``save_pretrained`` writes Hugging Face checkpoints, which have no int8 layout: keep the fp32 checkpoint
    for that, and this directory for the int8 model.

    The three files replace those the folder held as one (:func:`bertblocks.atomic.replace_files`): a kill at
    any moment leaves the earlier quantized model or the new one, whole; other files in the folder stay.

    Raises:
        QuantizationError: the model is not quantized, or has no bertblocks config.
        WriteError: the folder cannot be written (read-only, disk full): one line; the earlier folder is unchanged.
    """
    from safetensors.torch import _remove_duplicate_names
    from safetensors.torch import save as safetensors_bytes

    from ..atomic import replace_files
    from ..config_files import dump_yaml

    settings = getattr(model, "_bertblocks_quantization", None)
    if settings is None or not is_quantized(model):
        raise QuantizationError(f"save_quantized: {type(model).__name__} is not quantized; call quantize first")
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "model_dump"):
        raise QuantizationError(f"save_quantized: {type(model).__name__} has no bertblocks config to save")
    directory = Path(directory)
    config_text = dump_yaml(config).encode("utf-8")
    manifest = {"class": type(model).__name__, **settings}
    manifest_text = (json.dumps(manifest, indent=2) + "\n").encode("utf-8")
    # as safetensors' save_model: shared tensors (ALBERT's layers) stored once, the others' names in the metadata
    state = model.state_dict()
    metadata: dict[str, str] = {}
    for kept, removed in _remove_duplicate_names(state).items():
        for name in removed:
            metadata[name] = kept
            del state[name]
    weights = {k: v.contiguous() for k, v in state.items()}
    files = {
        CONFIG_FILE: lambda f: f.write(config_text),
        MANIFEST_FILE: lambda f: f.write(manifest_text),
        WEIGHTS_FILE: lambda f: f.write(safetensors_bytes(weights, metadata or None)),
    }
    replace_files(directory, files, commit=WEIGHTS_FILE, entry_points=(WEIGHTS_FILE,))
    return directory


#: the schemes :func:`load_quantized` reads (``quantization.json``'s ``scheme``)
SCHEMES = ("int8-dynamic",)


class QuantizationManifest(BaseModel):
    """``quantization.json``: what :func:`load_quantized` rebuilds the model from (strict types, no other key).

    Attributes:
        model_class: the bertblocks model class (``class`` in the file).
        scheme: how the weights are quantized; one of :data:`SCHEMES`.
        skip: the ``fnmatch`` patterns of the layers kept in fp32.
        kernel: the int8 kernel of the saving machine (one of :data:`KERNELS`).
    """

    # protected_namespaces=(): pydantic before 2.10 warns that `model_class` shadows its `model_` namespace
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True, protected_namespaces=())

    model_class: str = Field(alias="class")
    scheme: str
    skip: list[str] = Field(default_factory=list)
    #: the kernel that ran when it was saved (informational: a load picks this CPU's, the weights fit both)
    kernel: Kernel | None = None


def read_manifest(path: Path) -> QuantizationManifest:
    """``quantization.json`` read by the bounded JSON reader and validated as :class:`QuantizationManifest`.

    Raises:
        QuantizationError: not UTF-8, not JSON, not an object, a field missing or of the wrong type, an unknown
            key, or an unknown ``scheme`` (naming it), with the file.
    """
    try:
        data = read_json(path, limit=2**20)  # a manifest is a few hundred bytes
    except ReadError as e:
        raise QuantizationError(f"load_quantized: {e}") from None
    if not isinstance(data, dict):
        raise QuantizationError(f"load_quantized: {path} holds a JSON {type(data).__name__}, not an object")
    try:
        manifest = QuantizationManifest.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc'])) or '(top)'}: {error['msg']} (got {error.get('input')!r})"
            for error in e.errors()
        )
        raise QuantizationError(f"load_quantized: {path}: {problems}") from None
    if manifest.scheme not in SCHEMES:
        raise QuantizationError(
            f"load_quantized: {path} names the scheme {manifest.scheme!r}, which this bertblocks cannot read "
            f"(it reads {', '.join(map(repr, SCHEMES))})"
        )
    return manifest


@reads_folder  # every file of one generation of the folder; reads only
def load_quantized(directory: str | Path) -> nn.Module:
    """Rebuild a model written by :func:`save_quantized`: build the class from the config, quantize it the same
    way, then load the int8 tensors (strict: every key must match). Returns the model in ``eval()`` mode.

    Nothing is cast or trusted: ``quantization.json`` is validated (:func:`read_manifest`), the weight file's
    header by the project's safetensors checks (:func:`bertblocks.hf.weight_files.read_safetensors`), and every
    tensor must have the dtype the model holds (int8 ``weight``, fp32 ``weight_scale``) and, for scales, finite
    values.

    Raises:
        QuantizationError: a missing file, a malformed manifest, an unknown scheme or model class, a damaged
            weight file, a tensor of the wrong dtype or with non-finite scales (naming it), or weights that do
            not fit the config.
    """
    from . import backbone, task_models

    directory = Path(directory)
    missing = [f for f in (CONFIG_FILE, MANIFEST_FILE, WEIGHTS_FILE) if not (directory / f).is_file()]
    if missing:
        raise QuantizationError(f"load_quantized: {directory} lacks {missing} (written by save_quantized)")
    manifest = read_manifest(directory / MANIFEST_FILE)
    name = manifest.model_class
    cls = getattr(task_models, name, None) or getattr(backbone, name, None)
    if not (isinstance(cls, type) and hasattr(cls, "_from_config")):
        raise QuantizationError(f"load_quantized: {directory / MANIFEST_FILE} names an unknown class {name!r}")
    try:
        tensors = read_safetensors(directory / WEIGHTS_FILE)
    except WeightFileError as e:
        raise QuantizationError(f"load_quantized: {e}") from None
    model = cls._from_config(directory / CONFIG_FILE).eval()
    # this CPU's kernel (the saved weights fit both); forced: the int8 weights are all there is to run
    quantize(model, skip=manifest.skip, force=True)
    _load_checked(model, tensors, directory / WEIGHTS_FILE)
    return model


def _load_checked(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Load ``tensors`` into ``model`` without a cast: each of the model's dtype, scales finite; a tensor the
    model holds under several names (ALBERT's shared layer) may be stored under one of them."""
    expected = model.state_dict()
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise QuantizationError(f"load_quantized: {path} does not fit its config: unexpected tensors {unexpected}")
    for key, tensor in tensors.items():
        if tensor.dtype != expected[key].dtype:
            raise QuantizationError(
                f"load_quantized: {path}: tensor {key!r} is {tensor.dtype}, but the model holds "
                f"{expected[key].dtype} there (refused, not cast)"
            )
        if tensor.is_floating_point() and key.endswith("weight_scale") and not bool(torch.isfinite(tensor).all()):
            raise QuantizationError(
                f"load_quantized: {path}: tensor {key!r} holds non-finite scales (NaN or inf): every output "
                "would be NaN"
            )

    # the names that share one tensor: the file holds one of them (save_model stores a shared tensor once)
    def where(value: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
        return (value.data_ptr(), value.nbytes, tuple(value.shape)) if value.numel() else (id(value), 0, ())

    shared: dict[tuple[int, int, tuple[int, ...]], set[str]] = {}
    for key, value in expected.items():
        shared.setdefault(where(value), set()).add(key)
    missing = sorted(k for k in expected if k not in tensors and not shared[where(expected[k])] & set(tensors))
    if missing:
        raise QuantizationError(f"load_quantized: {path} does not fit its config: missing tensors {missing}")
    try:
        model.load_state_dict(tensors, strict=False)
    except RuntimeError as error:
        raise QuantizationError(f"load_quantized: {path} does not fit its config: {error}") from None


# ------------------------------------------------------------------------------------------------------- ONNX
def _int_mm_onnx(a: Any, b: Any) -> Any:
    """``aten::_int_mm`` as ONNX ``MatMulInteger`` (int8 × int8 → int32, zero points 0)."""
    from onnxscript import opset18 as op

    return op.MatMulInteger(a, b)


def onnx_translations() -> dict[Any, Any]:
    """The dynamo exporter's ``custom_translation_table`` entries a quantized model needs."""
    return {torch.ops.aten._int_mm.default: _int_mm_onnx}


__all__ = [
    "FBGEMM",
    "INT_MM",
    "KERNELS",
    "PROJECTIONS",
    "CpuFeatures",
    "Int8Linear",
    "Kernel",
    "QuantizationError",
    "QuantizationManifest",
    "QuantizationWarning",
    "choose_kernel",
    "cpu_features",
    "is_quantized",
    "load_quantized",
    "onnx_translations",
    "quantization_kernel",
    "quantize",
    "quantize_weight",
    "read_manifest",
    "save_quantized",
]
