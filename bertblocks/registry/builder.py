"""Turns a validated config into modules: looks every component up once and injects flat, typed arguments
(an attention module receives ``num_heads``, a backend and a position scheme, never the whole config)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from bertblocks.config import BertConfig, ComponentSpec
from bertblocks.config.limits import LimitError, check_allocation, check_size, max_parameters
from bertblocks.core.capabilities import attention_capabilities
from bertblocks.core.component import Component, subcomponent_fields
from bertblocks.core.encoder import Encoder
from bertblocks.core.factories import KindContract
from bertblocks.core.interfaces import (
    Attention,
    AttentionBackend,
    Embedding,
    FeedForward,
    Head,
    Layer,
    ModelDims,
    Pooler,
    PositionScheme,
    SharedPositionBias,
)

from .errors import RegistryError
from .manager import Registry, get_registry


class BuildError(RegistryError, ValueError):
    """A valid config whose components cannot work together (e.g. a backend lacking a needed capability)."""


@dataclass
class Assembled:
    """The parts of a backbone, as built from a config."""

    embeddings: Embedding
    encoder: Encoder
    pooler: Pooler | None
    position: PositionScheme


def build_components(config: BertConfig, registry: Registry | None = None) -> Assembled:
    """Assemble the embeddings, the encoder stack and the pooler of a validated ``config``.

    Raises:
        LimitError: the model would exceed a resource limit (:mod:`bertblocks.config.limits`).
        BuildError: a component refused the job (capability missing, factory returned the wrong type).
    """
    check_size(config)  # before anything is allocated: a config is data, but data that says how much memory
    reg = registry or get_registry()
    measure_allocation(config, reg)  # ... and what the assembled model would hold, measured on the meta device
    with allocation_guarded():
        return _assemble(config, reg)


def _assemble(config: BertConfig, reg: Registry) -> Assembled:
    dims = model_dims(config)
    position = _make_position(reg, config.position, "position", "position", dims)
    embeddings: Embedding = _make(
        reg,
        "embedding",
        config.embedding,
        "embedding",
        "embedding",
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        type_vocab_size=config.type_vocab_size,
        pad_token_id=config.pad_token_id,
        layer_norm_eps=config.layer_norm_eps,
        dropout=config.hidden_dropout_prob,
        position=position,
    )
    enc = config.encoder
    shared_bias = position.shared_bias(enc.attention.num_heads)
    shared_terms = position.shared_terms(dims)
    layers: dict[int, Layer] = {}  # by weight group: layers that share weights are built once
    for i in range(enc.num_layers):
        group = enc.layer_group(i)
        if group not in layers:
            layers[group] = _build_layer(reg, config, i, position, shared_bias, dims)
    groups = [enc.layer_group(i) for i in range(enc.num_layers)] if enc.num_layer_groups is not None else None
    final = enc.layer.final_norm
    if final is None:  # the kind of the last layer decides: the stack ends with it
        final = type(layers[enc.layer_group(enc.num_layers - 1)]).final_norm_default
    final_norm = _norm_factory(reg, config, enc.norm, "encoder final norm", "encoder.norm")() if final else None
    encoder = Encoder([layers[g] for g in sorted(layers)], groups, final_norm, shared_bias, shared_terms)
    pooler: Pooler | None = (
        _make(reg, "pooler", config.pooler, "pooler", "pooler", hidden_size=config.hidden_size)
        if config.pooler is not None
        else None
    )
    return Assembled(embeddings, encoder, pooler, position)


def _build_layer(
    reg: Registry,
    config: BertConfig,
    index: int,
    position: PositionScheme,
    shared_bias: SharedPositionBias | None,
    dims: ModelDims | None = None,
) -> Layer:
    """Layer ``index``: its backend, attention (and cross-attention), feed-forward and norms, composed by its
    layer kind."""
    enc = config.encoder
    attention_spec, ff_spec = enc.layer_specs(index)
    layer_spec, norm_spec = enc.layer_spec(index, "layer"), enc.layer_spec(index, "norm")
    where = f"encoder layer {index}"
    position_spec = enc.layer_position(index, config.position)
    if position_spec != config.position:
        # a per-layer scheme acts inside this layer's attention (a bias, another rotary base); the embeddings
        # and a bias shared by all layers keep the model-wide one
        position = _make_position(
            reg, position_spec, f"{where} position", _layer_loc(config, index, "position"), dims or model_dims(config)
        )
    attention_loc = _layer_loc(config, index, "attention")
    backend: AttentionBackend = _make(
        reg, "backend", attention_spec.backend, f"{where} backend", f"{attention_loc}.backend"
    )
    head_dim = config.hidden_size // attention_spec.num_heads
    if not getattr(_measuring, "active", False):  # the measure on the meta device has no values to judge
        _probe_backend(
            reg.get("backend", attention_spec.backend.name), backend, attention_spec.num_heads, head_dim, where
        )
    if shared_bias is not None and attention_spec.num_heads != enc.attention.num_heads:
        raise BuildError(
            f"{where}: the {config.position.name!r} position scheme shares one bias over "
            f"{enc.attention.num_heads} heads by all layers, but this layer has {attention_spec.num_heads}"
        )
    if (position.adds_score_bias or shared_bias is not None) and not backend.capabilities.additive_mask:
        raise BuildError(
            f"{where}: backend {attention_spec.backend.name!r} cannot take an additive score bias, which "
            f"the {position_spec.name!r} position scheme needs; choose a backend that can (eager, sdpa)"
        )
    if config.is_decoder and not backend.capabilities.causal:
        raise BuildError(
            f"{where}: backend {attention_spec.backend.name!r} cannot do causal attention, which a decoder "
            "(is_decoder: true) needs; choose a backend that can (eager, sdpa)"
        )
    norm = _norm_factory(reg, config, norm_spec, f"{where} norm", _layer_loc(config, index, "norm"))

    def make_attention(what: str, scheme: PositionScheme) -> Callable[[Callable[[], nn.Module] | None], Attention]:
        def make(sublayer_norm: Callable[[], nn.Module] | None, hidden_size: int | None = None) -> Attention:
            return _make(  # type: ignore[no-any-return]
                reg,
                "attention",
                attention_spec,
                f"{where} {what}",
                attention_loc,
                hidden_size=hidden_size or config.hidden_size,
                num_heads=attention_spec.num_heads,
                dropout=attention_spec.dropout,
                hidden_dropout=config.hidden_dropout_prob,
                layer_norm_eps=config.layer_norm_eps,
                backend=backend,
                position=scheme,
                layer_index=index,
                norm=sublayer_norm,
            )

        return make

    feedforward_loc = _layer_loc(config, index, "feedforward")
    activation = _activation_factory(reg, ff_spec.activation, f"{where} activation", f"{feedforward_loc}.activation")

    def make_feedforward(sublayer_norm: Callable[[], nn.Module] | None, hidden_size: int | None = None) -> FeedForward:
        return _make(  # type: ignore[no-any-return]
            reg,
            "feedforward",
            ff_spec,
            f"{where} feedforward",
            feedforward_loc,
            hidden_size=hidden_size or config.hidden_size,
            intermediate_size=ff_spec.intermediate_size,
            activation=activation,
            dropout=config.hidden_dropout_prob,
            layer_norm_eps=config.layer_norm_eps,
            norm=sublayer_norm,
        )

    layer: Layer = _make(
        reg,
        "layer",
        layer_spec,
        f"{where} layer",
        _layer_loc(config, index, "layer"),
        attention=make_attention("attention", position),
        # Cross-attention never carries a position bias (HF builds it with absolute positions).
        crossattention=make_attention("cross-attention", PositionScheme(config.max_position_embeddings))
        if config.add_cross_attention
        else None,
        feedforward=make_feedforward,
        norm=norm,
        hidden_size=config.hidden_size,
        chunk_size_feed_forward=enc.chunk_size_feed_forward,
        layer_index=index,
        num_layers=enc.num_layers,
    )
    _check_attention_capabilities(config, index, layer.attention, attention_spec.name)
    return layer


def _check_attention_capabilities(config: BertConfig, index: int, attention: Attention, name: str) -> None:
    """Refuse a config that needs what layer ``index``'s attention declares it cannot do (its
    :class:`~bertblocks.core.capabilities.AttentionCapabilities`): pruned heads, or decoding through a cache."""
    declared = attention_capabilities(attention)
    where = f"encoder layer {index}: attention {name!r} ({type(attention).__name__})"
    if index in {int(k) for k in config.pruned_heads} and not declared.pruning:
        raise BuildError(
            f"pruned_heads.{index}: {where} " + declared.refusal("declares that its heads cannot be pruned")
        )
    if config.is_decoder and config.use_cache and not declared.cache:
        raise BuildError(
            f"use_cache: {where} "
            + declared.refusal("declares that it cannot decode through a KV cache")
            + "; set use_cache: false"
        )


def build_head(config: BertConfig, registry: Registry | None = None) -> Head:
    """Build the head ``config.head`` names, with flat keyword arguments (see ``docs/how-to/task-heads.md``).

    Raises:
        BuildError: the config names no head, the head refused the config (e.g. question answering with
            ``num_labels`` other than 2), or the plugin returned something that is not a :class:`Head`.
    """
    if config.head is None:
        raise BuildError("the config names no head (set head: masked_lm, sequence_classification, …)")
    reg = registry or get_registry()
    measure_allocation(config, reg)  # the head is built before the backbone: the whole model is measured first
    with allocation_guarded():
        return _make_head(config, config.head, reg)


def _make_head(config: BertConfig, spec: ComponentSpec, reg: Registry) -> Head:
    dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    activation = config.encoder.feedforward.activation
    return _make(  # type: ignore[no-any-return]
        reg,
        "head",
        spec,
        "head",
        "head",
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        num_labels=config.num_labels,
        layer_norm_eps=config.layer_norm_eps,
        activation=_activation_factory(reg, activation, "head activation", "encoder.feedforward.activation"),
        classifier_dropout=dropout,
        hidden_dropout_prob=config.hidden_dropout_prob,
        intermediate_size=config.encoder.feedforward.intermediate_size,
        tie_word_embeddings=config.tie_word_embeddings,
        is_decoder=config.is_decoder,
    )


_measuring = threading.local()


def measure_allocation(config: BertConfig, registry: Registry | None = None) -> int:
    """Build the model ``config`` describes on the ``meta`` device (shapes only: nothing allocated) and refuse it,
    before anything real is built, when its parameters and buffers exceed the parameter limit.

    The size comes from the model, not from a formula: every component counts with what it really registers, a
    third party's included, and so do tables sized by buckets, kernels or positions (DeBERTa's relative table, a
    convolution's kernel). Factories run under ``torch.device("meta")``, so a tensor made without an explicit
    device (``torch.zeros(n)``, ``nn.Parameter(torch.empty(...))``) holds no memory while it is measured. The
    result is remembered for the last config measured (a task model builds its head, then its backbone, without the
    pooler its head does not use: that config is remembered with it).

    Returns:
        The number of elements the model would hold (parameters and buffers; a tied weight once).

    Raises:
        LimitError: the model would hold more than :func:`~bertblocks.config.limits.max_parameters`, naming the
            size, its largest tensors and the environment variable that raises the limit.
    """
    if getattr(_measuring, "active", False):
        return 0  # the meta build itself
    key = config.model_dump_json()
    memo: dict[str, tuple[int, int, list[tuple[str, torch.Tensor]]]] = getattr(_measuring, "last", {})
    if key in memo:
        check_allocation(*memo[key])  # the limit may have changed since (it is read at every check)
        return memo[key][0]
    reg = registry or get_registry()
    _measuring.active = True
    try:
        with torch.device("meta"):
            parts = build_components(config, reg)
            modules: list[nn.Module] = [parts.embeddings, parts.encoder, parts.position]
            modules += [parts.pooler] if parts.pooler is not None else []
            if config.head is not None:
                head = build_head(config, reg)
                head.tie_weights(parts.embeddings.input_embeddings())  # a tied decoder is the embeddings' table
                modules.append(head)
                if (
                    not head.needs_pooler
                    and config.pooler is not None
                    and parts.pooler is not None
                    and not config.pooler.always
                ):
                    modules.remove(parts.pooler)  # a task model builds its backbone without one (as transformers)
    except (BuildError, NotImplementedError, RuntimeError) as e:
        if not _needs_data(e):
            raise
        # a component that reads values back while it is built (``slopes.tolist()``) cannot be built on the meta
        # device: the real build that follows is then guarded tensor by tensor instead (see AllocationGuard)
        _measuring.last = {}
        _measuring.guard = True
        return 0
    finally:
        _measuring.active = False
    tensors: dict[int, tuple[str, torch.Tensor]] = {}
    for module in modules:
        if not isinstance(module, nn.Module):
            continue
        for name, tensor in (*module.named_parameters(), *module.named_buffers()):
            tensors.setdefault(id(tensor), (f"{type(module).__name__}.{name}", tensor))
    elements = sum(t.numel() for _, t in tensors.values())
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors.values())
    largest = sorted(tensors.values(), key=lambda item: item[1].numel(), reverse=True)[:3]
    _measuring.last = {key: (elements, nbytes, largest)}
    if config.head is not None and config.pooler is not None and parts.pooler not in modules:
        # the backbone the task model builds next (without the pooler its head does not use) is measured already
        _measuring.last[config.model_copy(update={"pooler": None}).model_dump_json()] = (elements, nbytes, largest)
    check_allocation(elements, nbytes, largest)
    return elements


def _needs_data(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a meta tensor's having no values to read."""
    seen: BaseException | None = error
    while seen is not None:
        if "meta" in str(seen) and isinstance(seen, NotImplementedError | RuntimeError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class AllocationGuard(TorchFunctionMode):
    """Inside, every tensor a factory function makes (``torch.empty``, ``zeros``, ``arange``, ``tensor`` …) is sized
    on the meta device first and refused, before it is allocated, once the values made so far would pass the
    parameter limit: the bound for a model whose components cannot be built on the meta device. It counts every
    tensor made (temporaries too), so it errs on the side of refusing."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0
        self.largest: list[tuple[str, torch.Tensor]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _device_constructors() and str(kwargs.get("device", "")) != "meta":
            shape = func(*args, **{**kwargs, "device": "meta"})
            self.elements += shape.numel()
            self.largest = sorted([*self.largest, (func.__name__, shape)], key=lambda x: -x[1].numel())[:3]
            limit = max_parameters()
            if limit is not None and self.elements > limit:
                check_allocation(self.elements, self.elements * shape.element_size(), self.largest)
        return func(*args, **kwargs)


@contextmanager
def allocation_guarded() -> Iterator[None]:
    """Guard the build that follows a measure that could not be made on the meta device (see
    :class:`AllocationGuard`); otherwise nothing."""
    if not getattr(_measuring, "guard", False):
        yield
        return
    _measuring.guard = False
    with AllocationGuard():
        yield


def model_dims(config: BertConfig) -> ModelDims:
    """The model-wide sizes a position factory that names ``model`` is told."""
    enc = config.encoder
    return ModelDims(
        hidden_size=config.hidden_size,
        num_heads=enc.attention.num_heads,
        num_layers=enc.num_layers,
        layer_norm_eps=config.layer_norm_eps,
        hidden_dropout=config.hidden_dropout_prob,
        max_positions=config.max_position_embeddings,
    )


def _make_position(reg: Registry, spec: ComponentSpec, where: str, loc: str, dims: ModelDims) -> PositionScheme:
    """A position scheme, told the model's sizes (``model``) as its contract says."""
    return _make(reg, "position", spec, where, loc, max_positions=dims.max_positions, model=dims)  # type: ignore[no-any-return]


def _norm_factory(
    reg: Registry, config: BertConfig, spec: ComponentSpec, where: str, loc: str
) -> Callable[[], nn.Module]:
    """A no-argument factory of fresh norm modules (each place a norm sits gets its own parameters)."""
    return partial(_make, reg, "norm", spec, where, loc, hidden_size=config.hidden_size, eps=config.layer_norm_eps)


def _activation_factory(reg: Registry, name: str, where: str, loc: str) -> Callable[[], nn.Module]:
    """A no-argument factory of fresh modules of the activation ``name`` (a feed-forward's, a head's)."""
    return partial(_make, reg, "activation", ComponentSpec(name=name), where, loc)


def _layer_loc(config: BertConfig, index: int, key: str) -> str:
    """The config path that sets layer ``index``'s ``key`` (``attention``, ``norm``, ``position``, …): the last
    override of that layer changing it, else the encoder-wide field (the model-wide one for ``position``)."""
    enc = config.encoder
    for number in reversed(range(len(enc.overrides))):
        override = enc.overrides[number]
        if index in override.layers and override.changes(key):
            return f"encoder.overrides.{number}.{key}"
    return key if key == "position" else f"encoder.{key}"


def _probe_backend(component: Component, backend: AttentionBackend, heads: int, head_dim: int, where: str) -> None:
    """Call the backend once on tiny tensors and check its output shape and dtype, so that a backend returning
    ``[b, q, h, d]`` (transposed) or a wrong shape fails here, naming it, not deep inside a forward pass.

    The probe uses more queries than heads so that a transposition shows in the shape. A backend that cannot
    run the probe (e.g. one that needs a GPU) is not judged here.
    """
    b, q = 1, heads + 1
    probe = torch.zeros(b, heads, q, head_dim)
    kwargs: dict[str, Any] = {"mask": None, "scale": head_dim**-0.5, "dropout_p": 0.0, "is_causal": False}
    try:
        # a shallow copy: whatever state the backend keeps (counters, caches) is not touched by the probe
        with torch.no_grad():
            out = copy.copy(backend)(probe, probe, probe, need_weights=False, **kwargs)[0]
    except Exception:
        return
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (b, heads, q, head_dim) or out.dtype != probe.dtype:
        got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        transposed = isinstance(out, torch.Tensor) and tuple(out.shape) == (b, q, heads, head_dim)
        hint = " (transposed? it must be [b, h, q, d])" if transposed else ""
        raise BuildError(
            f"{where}: backend {component.name!r} from {component.provider} returned {got} for query/key/value "
            f"[b, h, q, d] = {[b, heads, q, head_dim]} float32; expected the query's shape and dtype{hint}"
        )


def plugin_options(component: Component, spec: ComponentSpec) -> dict[str, Any]:
    """The options given to ``component``: the spec's plugin keys, plus the spec's typed fields whose names the
    component's options model also declares (a plugin taking ``intermediate_size`` gets the config's value,
    not its own default)."""
    shared = {
        key: getattr(spec, key)
        for key in component.options.model_fields
        if key != "name" and key in type(spec).model_fields
    }
    return {**shared, **spec.options()}


def build_component(
    kind: str, spec: ComponentSpec, *, where: str, loc: str, registry: Registry | None = None, **kwargs: Any
) -> Any:
    """Build one component outside a model (a family, to read or write a ``config.json``) by the mechanism that
    builds a model's: the arguments and the returned type checked against ``kind``'s contract, errors naming
    ``where``, the component, the kind and the config path ``loc``.

    Raises:
        BuildError: the factory failed, was given other arguments than its contract's, or returned the wrong type.
    """
    return _make(registry or get_registry(), kind, spec, where, loc, **kwargs)


def _options(component: Component, given: dict[str, Any]) -> BaseModel:
    return component.options.model_validate(given)


def _make(reg: Registry, kind: str, spec: ComponentSpec, where: str, loc: str, **kwargs: Any) -> Any:
    """Build the component ``spec`` names, of ``kind``, with ``kwargs`` and its validated options: the one way
    every component is built (the builder's own and the sub-components a plugin builds with ``build``).

    ``where`` says which part of the model is being built (``encoder layer 3 feedforward``), ``loc`` the config
    path of the spec (``encoder.feedforward``); both are in every error.
    """
    component = reg.get(kind, spec.name)
    options = _options(component, plugin_options(component, spec))
    sub = subcomponent_fields(component.options)
    if sub:  # the options name sub-components: the factory builds them through the registry
        kwargs["build"] = partial(_build_sub, reg, where, loc, options, sub)
    return _call(component, reg.contract(kind), where, loc, options=options, **kwargs)


def _build_sub(
    reg: Registry,
    where: str,
    loc: str,
    options: BaseModel,
    fields: dict[str, str],
    kind: str,
    spec: ComponentSpec,
    **kwargs: Any,
) -> Any:
    """What a factory's ``build`` argument does: ``build(kind, spec, **kwargs)`` builds the sub-component
    ``spec`` (a :func:`~bertblocks.core.component.subcomponent` field of its options) of ``kind`` through the
    registry, passing ``kwargs`` to its factory, and checks it against ``kind``'s contract, as every component."""
    field = next((name for name in fields if getattr(options, name, None) is spec), None)
    sub_loc = f"{loc}.{field}" if field is not None else loc
    return _make(reg, kind, spec, f"{where} {kind} {spec.name!r}", sub_loc, **kwargs)


def _call(component: Component, contract: KindContract, where: str, loc: str, **kwargs: Any) -> Any:
    """Call ``component``'s factory with ``kwargs`` and check both against ``contract``: the arguments are the
    contract's (``build`` aside), and what comes back is an instance of ``contract.returns``."""
    given = set(kwargs) - {"build"}
    if contract.arguments is not None and given != contract.arguments:
        missing, extra = sorted(contract.arguments - given), sorted(given - contract.arguments)
        raise BuildError(
            f"{where}: {component.kind} {component.name!r} from {component.provider} would be called with "
            f"{', '.join(sorted(given))}; a {contract.kind} factory takes {', '.join(sorted(contract.arguments))}"
            + (f" (missing: {', '.join(missing)})" if missing else "")
            + (f" (not in its contract: {', '.join(extra)})" if extra else "")
            + f" (config: {loc})"
        )
    try:
        made = component.factory(**kwargs)
    except (BuildError, LimitError):  # a limit refuses the model, not the component (AllocationGuard)
        raise
    except Exception as e:
        # a plugin's bug (or a refusal) must say which layer, component and distribution it came from
        raise BuildError(
            f"{where}: {component.kind} {component.name!r} from {component.provider} failed to build: "
            f"{type(e).__name__}: {e} (config: {loc})"
        ) from e
    if not isinstance(made, contract.returns):
        raise BuildError(
            f"{where}: {component.kind} {component.name!r} from {component.provider} returned "
            f"{type(made).__name__}, not a {contract.returns.__name__} as the {contract.kind} contract requires "
            f"(config: {loc})"
        )
    return made
