"""The encoder stack and its per-layer overrides: layer ranges (``0-5``, ``6-11:2``) and merged specs."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import InputError, did_you_mean
from .errors import FieldError
from .limits import MAX_LAYERS_ENV, max_layers
from .specs import (
    AttentionSpec,
    ComponentSpec,
    Count,
    FeedForwardSpec,
    LayerSpec,
    NonNegativeCount,
    NormSpec,
    PositionSpec,
    Probability,
)


# ----------------------------------------------------------------------------------------------- encoder
def _layer_ranges(value: str, num_layers: int | None = None) -> list[tuple[int, int, int]]:
    """``"0-3,6,0-21/3"`` → ``[(0, 3, 1), (6, 6, 1), (0, 21, 3)]`` (start, stop, step), read without expanding a
    range into its indices.

    A range without an end (``"1-/3"``: from layer 1 to the last, every third) ends at the last of ``num_layers``
    layers: a pattern by rule, which keeps holding when the stack is made shallower or deeper.
    """
    ranges = []
    for part in value.replace(" ", "").split(","):
        span, slash, every = part.partition("/")
        lo, sep, hi = span.partition("-")
        if sep and not hi:
            if num_layers is None:
                raise InputError(f"layer range {part!r} has no end; it needs the encoder's num_layers")
            if lo.isdigit() and int(lo) >= num_layers:
                continue  # a rule that holds for no layer of this stack
            hi = str(num_layers - 1)
        try:
            start, stop, step = int(lo), int(hi if sep else lo), int(every) if slash else 1
        except ValueError:
            raise InputError(
                f"cannot read layer range {value!r}; write e.g. '6-11', '6-' (6 to the last), '0,2,4' or "
                "'0-21/3' (every third)"
            ) from None
        if stop < start:
            raise InputError(f"layer range {part!r} is empty (end before start)")
        if step < 1:
            raise InputError(f"layer range {part!r}: the step after '/' must be at least 1")
        ranges.append((start, stop, step))
    return ranges


def _parse_layers(value: Any) -> list[int]:
    """``3``, ``"6-11"``, ``"0,2,4"``, ``"0-21/3"`` (every third: 0, 3, …, 21) or ``[0, 2]`` → a sorted list of
    layer indices.

    A range is expanded only once it is known to fit under the layer limit (:mod:`.limits`): no stack is
    deeper, and ``"0-10000000"`` would otherwise take a gigabyte to expand before it could be refused.
    """
    if isinstance(value, bool):
        raise InputError("layers must be an index, a range like '6-11', or a list of indices")
    if isinstance(value, int):
        return [value]
    if isinstance(value, str):
        ranges = _layer_ranges(value)
        deepest = max_layers()
        highest = max(stop for _, stop, _ in ranges)
        if deepest is not None and highest >= deepest:
            raise InputError(
                f"layer range {value!r} reaches layer {highest}, but no stack may have more than {deepest} "
                f"layers ({MAX_LAYERS_ENV})"
            )
        out: set[int] = set()
        for start, stop, step in ranges:
            out.update(range(start, stop + 1, step))
        return sorted(out)
    if isinstance(value, list | tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return sorted(set(value))
    raise InputError("layers must be an index, a range like '6-11', or a list of indices")


#: component keys a per-layer override may change: the encoder's own (``encoder.<key>``) and the model's
#: ``position`` scheme (``position``); each resolved by :meth:`EncoderConfig.layer_spec`
OVERRIDABLE: tuple[str, ...] = ("attention", "feedforward", "layer", "norm", "position")


class LayerOverride(BaseModel):
    """Other components or options for some layers, e.g. ``{layers: 6-11, attention: {backend: eager}}``.

    Any key of :data:`OVERRIDABLE` may be given (``attention``, ``feedforward``, ``layer``, ``norm``,
    ``position``); its value is merged over the encoder-wide spec. Choosing another ``name`` drops the
    encoder-wide plugin options (they belong to the other plugin) but keeps the shared typed fields.
    """

    model_config = ConfigDict(extra="allow")

    layers: list[int]

    @field_validator("layers", mode="before")
    @classmethod
    def _layers(cls, value: Any) -> list[int]:
        return _parse_layers(value)

    @model_validator(mode="before")
    @classmethod
    def _components(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        for key, value in data.items():
            if key == "layers":
                continue
            if key not in OVERRIDABLE:
                raise FieldError(
                    str(key),
                    f"unknown field; allowed fields: layers, {', '.join(OVERRIDABLE)}"
                    + did_you_mean(str(key), OVERRIDABLE),
                )
            if isinstance(value, str):
                out[key] = {"name": value}  # `attention: bert` is short for `attention: {name: bert}`
            elif value is not None and not isinstance(value, Mapping):
                raise FieldError(str(key), "must be a component name or a mapping of its fields")
        return out

    def changes(self, key: str) -> dict[str, Any] | None:
        """What this override changes in component ``key`` (``None``: nothing)."""
        value = (self.__pydantic_extra__ or {}).get(key)
        return dict(value) if value else None

    @property
    def attention(self) -> dict[str, Any] | None:
        return self.changes("attention")

    @property
    def feedforward(self) -> dict[str, Any] | None:
        return self.changes("feedforward")

    @property
    def position(self) -> dict[str, Any] | None:
        return self.changes("position")


class EncoderConfig(BaseModel):
    """The layer stack."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    num_layers: Count = Field(12, description="number of layers (HF num_hidden_layers)")
    attention: AttentionSpec = Field(default_factory=AttentionSpec)
    feedforward: FeedForwardSpec = Field(default_factory=FeedForwardSpec)
    chunk_size_feed_forward: NonNegativeCount = Field(
        0, description="run the feed-forward block over chunks of this many positions (0 = all at once)"
    )
    layer: LayerSpec = Field(default_factory=LayerSpec, description="layer composition (post_ln, pre_ln, parallel)")
    norm: NormSpec = Field(default_factory=NormSpec, description="the norm inside the layers and after the stack")
    num_layer_groups: Count | None = Field(
        None,
        description="cross-layer weight sharing (ALBERT's num_hidden_groups): layer i uses the weights of group "
        "i·groups // num_layers, held once at encoder.layer.<group>; null = every layer has its own",
    )
    overrides: list[LayerOverride] = Field(default_factory=list, description="per-layer component changes")
    packing: Literal["auto", "always", "never"] = Field(
        "auto",
        description="run dense layers on real tokens only (padded batches): auto = in inference when the "
        "padding share reaches packing_threshold; outputs then hold zeros at padded positions",
    )
    packing_threshold: Probability = Field(0.2, description="share of padding from which `auto` packs")

    @model_validator(mode="before")
    @classmethod
    def _ranges_within_the_stack(cls, data: Any) -> Any:
        # Checked on the written ranges, before they are expanded into indices: `layers: "0-10000000"` gets
        # a short error at once instead of a list of ten million indices (and an error message naming them).
        if not isinstance(data, Mapping) or not isinstance(data.get("overrides"), list):
            return data
        num_layers = data.get("num_layers", cls.model_fields["num_layers"].default)
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
            return data  # reported by the field's own validation
        data = {**data, "overrides": list(data["overrides"])}
        for j, override in enumerate(data["overrides"]):
            layers = override.get("layers") if isinstance(override, Mapping) else None
            if not isinstance(layers, str):
                continue
            try:
                ranges = _layer_ranges(layers, num_layers)
            except ValueError:
                continue  # reported by LayerOverride
            if any(part.partition("/")[0].endswith("-") for part in layers.replace(" ", "").split(",")):
                # an open range ends at this stack's last layer: written closed for LayerOverride
                closed = ",".join(f"{lo}-{hi}/{step}" for lo, hi, step in ranges)
                data["overrides"][j] = {**override, "layers": closed or []}
            # (first, last, step) of the indices past the stack; a stepped range ends at its last index
            outside = []
            for lo, hi, step in ranges:
                last = lo + (hi - lo) // step * step
                if last >= num_layers:
                    first = lo if lo >= num_layers else lo + ((num_layers - lo + step - 1) // step) * step
                    outside.append((first, last, step))
            if not outside:
                continue
            count = sum((hi - lo) // step + 1 for lo, hi, step in outside)
            shown = (
                str(sorted({i for lo, hi, step in outside for i in range(lo, hi + 1, step)}))
                if count <= 16
                else ", ".join(
                    (f"{lo}-{hi}" + (f"/{step}" if step > 1 else "")) if hi > lo else str(lo)
                    for lo, hi, step in outside
                )
            )
            raise FieldError(
                f"overrides.{j}.layers",
                f"layers {shown} do not exist (num_layers is {num_layers}); end the range at layer {num_layers - 1}, "
                "or leave its end open ('1-/3': to the last layer) so that it follows num_layers",
            )
        return data

    def layer_specs(self, index: int) -> tuple[AttentionSpec, FeedForwardSpec]:
        """The attention and feed-forward specs of layer ``index`` after applying every override (later wins).

        Raises:
            ValidationError: when an override makes a spec invalid (reported by the registry with its path).
        """
        return self.layer_spec(index, "attention"), self.layer_spec(index, "feedforward")

    def layer_spec(self, index: int, key: str, base: ComponentSpec | None = None) -> Any:
        """The spec of component ``key`` (any of :data:`OVERRIDABLE`) for layer ``index``: ``base`` (default:
        the encoder's own field ``key``) with every override of that layer merged over it, later ones winning.

        Raises:
            ValidationError: when an override makes a spec invalid (reported by the registry with its path).
        """
        spec = base if base is not None else getattr(self, key)
        for override in self.overrides:
            changes = override.changes(key)
            if index in override.layers and changes:
                spec = merge_spec(spec, changes)
        return spec

    def layer_group(self, index: int) -> int:
        """The weight group of layer ``index``: itself without sharing, ``index · groups // num_layers`` with."""
        if self.num_layer_groups is None:
            return index
        return index * self.num_layer_groups // self.num_layers

    def layer_position(self, index: int, position: PositionSpec) -> PositionSpec:
        """The position spec of layer ``index``'s self-attention: ``position`` (the model's) after every
        override's ``position`` changes (later wins)."""
        return self.layer_spec(index, "position", base=position)


def merge_spec(base: ComponentSpec, changes: Mapping[str, Any]) -> Any:
    data = base.model_dump()
    if "name" in changes and changes["name"] != base.name:
        for key in base.options():
            data.pop(key, None)
    data = deep_merge(data, changes)
    merged = type(base).model_validate(data)
    if merged.name == base.name:  # the same plugin: its option defaults still apply
        merged._option_defaults = dict(base._option_defaults)
    return merged


def deep_merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            sub = dict(value)
            if "name" in sub and "name" in out[key] and sub["name"] != out[key]["name"]:
                out[key] = sub  # another component: its options start afresh
            else:
                out[key] = deep_merge(out[key], sub)
        elif isinstance(value, str) and isinstance(out.get(key), dict) and "name" in out[key]:
            out[key] = {"name": value} if value != out[key]["name"] else out[key]
        else:
            out[key] = copy.deepcopy(value)
    return out
