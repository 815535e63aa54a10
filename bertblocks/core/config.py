"""The configuration schema: one pydantic model tree that names components and their options.

A component is chosen by name (``{name: NAME}``, or the shorthand ``NAME``), never by import path, so a
YAML file someone sends you cannot import arbitrary code. The fields every component of a kind shares
(``num_heads`` for attention, ``intermediate_size`` for feed-forward, …) are typed here; any further keys
are the plugin's own options, validated by the options model the plugin declares (see
:func:`bertblocks.registry.validate_config`), so a third-party option gets the same errors as a built-in.

Structural validation (this module) and component validation (the registry) are two phases of the one
:func:`bertblocks.load_config`; both report every problem at once, each with its dotted location.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from .config_surface import FlatConfigView
from .limits import MAX_LAYERS_ENV, max_layers

Probability = Annotated[float, Field(ge=0.0, le=1.0)]


# ------------------------------------------------------------------------------------------------ errors
@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config: where (dotted path) and what."""

    loc: str
    msg: str

    def __str__(self) -> str:
        return f"{self.loc}: {self.msg}" if self.loc else self.msg


class ConfigError(ValueError):
    """A config that cannot be built. ``issues`` lists every problem found, each with its dotted path."""

    def __init__(self, issues: Iterable[ConfigIssue], source: str | None = None) -> None:
        self.issues = list(issues)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  {issue}" for issue in self.issues)
        n = len(self.issues)
        super().__init__(f"invalid config{where} ({n} error{'s' if n != 1 else ''}):\n{lines}")


class FieldError(ValueError):
    """Raised by a cross-field validator to blame one field: pydantic gives such errors no location."""

    def __init__(self, loc: str, msg: str) -> None:
        super().__init__(msg)
        self.loc = loc


def join_loc(*parts: Any) -> str:
    return ".".join(str(p) for p in parts if p != "")


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``name`` (for "did you mean" hints), or ``None`` if none is close."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return matches[0] if matches else None


def issues_from_validation_error(
    error: ValidationError,
    prefix: str = "",
    model: type[BaseModel] | None = None,
    known_fields: Iterable[str] | None = None,
) -> list[ConfigIssue]:
    """Turn pydantic's errors into located issues; unknown keys get the allowed ones and a "did you mean".

    ``known_fields`` replaces the field names looked up in ``model`` (for plugin options, whose allowed keys
    are the spec's typed fields plus the plugin's own).
    """
    issues = []
    for err in error.errors(include_url=False):
        loc = list(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            loc, msg = [*loc, cause.loc], str(cause)
        if err["type"] == "extra_forbidden" and (model is not None or known_fields is not None):
            allowed = list(known_fields) if known_fields is not None else _fields_at(model, loc[:-1])  # type: ignore[arg-type]
            hint = closest(str(loc[-1]), allowed)
            msg = f"unknown field; allowed fields: {', '.join(sorted(allowed))}"
            if hint:
                msg += f" (did you mean {hint!r}?)"
        issues.append(ConfigIssue(join_loc(prefix, *loc), msg))
    return issues


def _fields_at(model: type[BaseModel], loc: list[Any]) -> list[str]:
    """Field names of the (nested) model found at ``loc`` inside ``model``; best effort."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        candidates = [annotation, *args]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


# -------------------------------------------------------------------------------------------- components
class ComponentSpec(BaseModel):
    """A component chosen by name; keys other than the typed fields are the plugin's own options."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    name: str
    #: the plugin's option defaults, recorded when the registry fills them in (``validate``), so that
    #: :meth:`BertConfig.to_hf` writes only options that differ from them
    _option_defaults: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        # equal specs name the same component with the same values, whether or not the registry has told
        # them their defaults yet (pydantic would compare that private record too)
        if not isinstance(other, ComponentSpec):
            return NotImplemented
        return (
            type(self) is type(other)
            and self.__dict__ == other.__dict__
            and self.__pydantic_extra__ == other.__pydantic_extra__
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like every pydantic model

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # `backend: eager` is short for `backend: {name: eager}`.
        return {"name": data} if isinstance(data, str) else data

    def options(self) -> dict[str, Any]:
        """The plugin-specific options (everything that is not a typed field of this spec)."""
        return dict(self.__pydantic_extra__ or {})

    def changed_options(self) -> dict[str, Any]:
        """The plugin options that differ from the plugin's defaults (all of them before ``validate`` has
        recorded the defaults)."""
        defaults = self._option_defaults
        return {k: v for k, v in self.options().items() if k not in defaults or defaults[k] != v}


#: The component of each kind a config gets when it names none: BERT's. These are the only component names
#: the schema knows (the registry checks that they exist; ``bertblocks components`` lists the others), and
#: ``tests/test_layering.py`` checks that no other built-in component name appears in ``core/``.
DEFAULT_COMPONENTS: dict[str, str] = {
    "embedding": "bert",
    "position": "absolute",
    "attention": "bert",
    "backend": "sdpa",
    "feedforward": "bert",
    "activation": "gelu",
    "norm": "layernorm",
    "layer": "post_ln",
    "pooler": "first_token",
    "family": "bert",
}


class EmbeddingSpec(ComponentSpec):
    """Embedding component (``bertblocks components embedding`` lists them)."""

    name: str = DEFAULT_COMPONENTS["embedding"]


class PositionSpec(ComponentSpec):
    """Position scheme (``bertblocks components position`` lists them)."""

    name: str = DEFAULT_COMPONENTS["position"]


class BackendSpec(ComponentSpec):
    """Attention kernel (``bertblocks components backend`` lists them); chosen once, at build time."""

    name: str = DEFAULT_COMPONENTS["backend"]


class AttentionSpec(ComponentSpec):
    """Multi-head attention (``bertblocks components attention`` lists them)."""

    name: str = DEFAULT_COMPONENTS["attention"]
    num_heads: PositiveInt = Field(12, description="attention heads; must divide hidden_size")
    dropout: Probability = Field(
        0.1, description="dropout on attention probabilities (HF attention_probs_dropout_prob)"
    )
    backend: BackendSpec = Field(default_factory=BackendSpec, description="attention kernel, chosen at build time")


class FeedForwardSpec(ComponentSpec):
    """Position-wise feed-forward block (``bertblocks components feedforward`` lists them)."""

    name: str = DEFAULT_COMPONENTS["feedforward"]
    intermediate_size: PositiveInt = Field(3072, description="inner width (HF intermediate_size)")
    activation: str = Field(
        DEFAULT_COMPONENTS["activation"],
        description="activation by name (HF hidden_act); the default gelu is the exact erf form. A gated "
        "feed-forward applies it to its gate; the activations geglu, swiglu and reglu name that gate for it",
    )


class NormSpec(ComponentSpec):
    """Normalisation inside the layers and after the stack (``bertblocks components norm`` lists them).

    The epsilon is the config's ``layer_norm_eps``.
    """

    name: str = DEFAULT_COMPONENTS["norm"]


class LayerSpec(ComponentSpec):
    """How a layer composes its sub-layers, norms and residuals (``bertblocks components layer`` lists them)."""

    name: str = DEFAULT_COMPONENTS["layer"]
    final_norm: bool | None = Field(
        None,
        description="a norm after the last layer; null = the layer kind's default (pre-LN and parallel kinds: "
        "yes, BERT's post-LN: no, and true is an error there: its layers already end with a norm)",
    )


class HeadSpec(ComponentSpec):
    """Task head (``bertblocks components head`` lists them)."""

    name: str


class PoolerSpec(ComponentSpec):
    """Pooler (``bertblocks components pooler`` lists them)."""

    name: str = DEFAULT_COMPONENTS["pooler"]


# ----------------------------------------------------------------------------------------------- encoder
def _layer_ranges(value: str) -> list[tuple[int, int, int]]:
    """``"0-3,6,0-21/3"`` → ``[(0, 3, 1), (6, 6, 1), (0, 21, 3)]`` (start, stop, step), read without expanding a
    range into its indices."""
    ranges = []
    for part in value.replace(" ", "").split(","):
        span, slash, every = part.partition("/")
        lo, sep, hi = span.partition("-")
        try:
            start, stop, step = int(lo), int(hi if sep else lo), int(every) if slash else 1
        except ValueError:
            raise ValueError(
                f"cannot read layer range {value!r}; write e.g. '6-11', '0,2,4' or '0-21/3' (every third)"
            ) from None
        if stop < start:
            raise ValueError(f"layer range {part!r} is empty (end before start)")
        if step < 1:
            raise ValueError(f"layer range {part!r}: the step after '/' must be at least 1")
        ranges.append((start, stop, step))
    return ranges


def _parse_layers(value: Any) -> list[int]:
    """``3``, ``"6-11"``, ``"0,2,4"``, ``"0-21/3"`` (every third: 0, 3, …, 21) or ``[0, 2]`` → a sorted list of
    layer indices.

    A range is expanded only once it is known to fit under the layer limit (:mod:`.limits`): no stack is
    deeper, and ``"0-10000000"`` would otherwise take a gigabyte to expand before it could be refused.
    """
    if isinstance(value, bool):
        raise ValueError("layers must be an index, a range like '6-11', or a list of indices")
    if isinstance(value, int):
        return [value]
    if isinstance(value, str):
        ranges = _layer_ranges(value)
        deepest = max_layers()
        highest = max(stop for _, stop, _ in ranges)
        if deepest is not None and highest >= deepest:
            raise ValueError(
                f"layer range {value!r} reaches layer {highest}, but no stack may have more than {deepest} "
                f"layers ({MAX_LAYERS_ENV})"
            )
        out: set[int] = set()
        for start, stop, step in ranges:
            out.update(range(start, stop + 1, step))
        return sorted(out)
    if isinstance(value, list | tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return sorted(set(value))
    raise ValueError("layers must be an index, a range like '6-11', or a list of indices")


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
                hint = closest(str(key), OVERRIDABLE)
                raise FieldError(
                    str(key),
                    f"unknown field; allowed fields: layers, {', '.join(OVERRIDABLE)}"
                    + (f" (did you mean {hint!r}?)" if hint else ""),
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

    num_layers: PositiveInt = Field(12, description="number of layers (HF num_hidden_layers)")
    attention: AttentionSpec = Field(default_factory=AttentionSpec)
    feedforward: FeedForwardSpec = Field(default_factory=FeedForwardSpec)
    chunk_size_feed_forward: NonNegativeInt = Field(
        0, description="run the feed-forward block over chunks of this many positions (0 = all at once)"
    )
    layer: LayerSpec = Field(default_factory=LayerSpec, description="layer composition (post_ln, pre_ln, parallel)")
    norm: NormSpec = Field(default_factory=NormSpec, description="the norm inside the layers and after the stack")
    num_layer_groups: PositiveInt | None = Field(
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
    packing_threshold: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        0.2, description="share of padding from which `auto` packs"
    )

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
        for j, override in enumerate(data["overrides"]):
            layers = override.get("layers") if isinstance(override, Mapping) else None
            if not isinstance(layers, str):
                continue
            try:
                ranges = _layer_ranges(layers)
            except ValueError:
                continue  # reported by LayerOverride
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
            raise FieldError(f"overrides.{j}.layers", f"layers {shown} do not exist (num_layers is {num_layers})")
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
    data = _deep_merge(data, changes)
    merged = type(base).model_validate(data)
    if merged.name == base.name:  # the same plugin: its option defaults still apply
        merged._option_defaults = dict(base._option_defaults)
    return merged


def _deep_merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            sub = dict(value)
            if "name" in sub and "name" in out[key] and sub["name"] != out[key]["name"]:
                out[key] = sub  # another component: its options start afresh
            else:
                out[key] = _deep_merge(out[key], sub)
        elif isinstance(value, str) and isinstance(out.get(key), dict) and "name" in out[key]:
            out[key] = {"name": value} if value != out[key]["name"] else out[key]
        else:
            out[key] = copy.deepcopy(value)
    return out


# ---------------------------------------------------------------------------------------------- the root
class BertConfig(FlatConfigView, BaseModel):
    """A whole BERT: vocabulary and sizes, the components and their options.

    Field names shared with HF's ``BertConfig`` keep HF's names (``vocab_size``, ``layer_norm_eps``, …);
    the components are nested. :meth:`from_hf` / :meth:`to_hf` convert to and from HF ``config.json``.
    transformers' flat names (``num_hidden_layers``, ``to_dict()``, ``get()``, ``model_type``) read and write
    the same fields (:class:`~bertblocks.core.config_surface.FlatConfigView`).
    """

    # inf and NaN are never meaningful sizes, rates or epsilons (`layer_norm_eps: .inf` would give NaN outputs)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    vocab_size: PositiveInt = Field(30522, description="token vocabulary size")
    hidden_size: PositiveInt = Field(768, description="width of every hidden state")
    max_position_embeddings: PositiveInt = Field(512, description="longest sequence (positions 0..n-1)")
    type_vocab_size: PositiveInt = Field(2, description="token types (segments)")
    pad_token_id: NonNegativeInt | None = Field(0, description="padding token; its embedding starts at zero")
    layer_norm_eps: Annotated[float, Field(gt=0)] = Field(1e-12, description="LayerNorm epsilon")
    hidden_dropout_prob: Probability = Field(0.1, description="dropout on embeddings and sub-layer outputs")
    initializer_range: Annotated[float, Field(gt=0)] = Field(0.02, description="std of the normal initialiser")
    embedding: EmbeddingSpec = Field(default_factory=EmbeddingSpec)
    position: PositionSpec = Field(default_factory=PositionSpec)
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    pooler: PoolerSpec | None = Field(default_factory=PoolerSpec, description="null for no pooler")
    is_decoder: bool = Field(False, description="causal self-attention (a decoder, as HF's is_decoder)")
    add_cross_attention: bool = Field(False, description="decoder layers also attend to encoder states")
    use_cache: bool = Field(True, description="decoders return a key/value cache by default")
    tie_word_embeddings: bool = Field(True, description="LM decoder weight is the token embedding table")
    head: HeadSpec | None = Field(None, description="task head by name (null: a bare backbone)")
    num_labels: PositiveInt = Field(2, description="classifier outputs; derived from id2label when that is given")
    id2label: dict[int, str] | None = Field(None, description="label names; default LABEL_0..LABEL_{n-1}")
    label2id: dict[str, int] | None = Field(None, description="inverse of id2label; derived when omitted")
    problem_type: Literal["regression", "single_label_classification", "multi_label_classification"] | None = Field(
        None, description="sequence-classification loss; inferred from labels when unset, as HF does"
    )
    classifier_dropout: Probability | None = Field(
        None, description="dropout before classifier heads; hidden_dropout_prob when null"
    )
    pruned_heads: dict[int, list[int]] = Field(
        default_factory=dict, description="heads removed per layer; re-applied before weights are loaded"
    )
    family: str = Field(
        DEFAULT_COMPONENTS["family"],
        description="the model family (HF model_type) whose config.json and checkpoint format this model "
        "loads and saves; bertblocks-hybrid for a model no transformers class describes",
    )
    hf: dict[str, Any] = Field(
        default_factory=dict,
        description="fields of an HF config.json that bertblocks does not model, kept for the round trip",
    )

    @field_validator("id2label", mode="before")
    @classmethod
    def _label_keys(cls, value: Any) -> Any:
        if isinstance(value, Mapping):  # JSON keys are strings
            return {int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k: v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _labels(self) -> BertConfig:
        # HF derives num_labels from id2label; both given and disagreeing is an error, not a silent pick.
        if self.id2label is None:
            object.__setattr__(self, "id2label", {i: f"LABEL_{i}" for i in range(self.num_labels)})
        elif "num_labels" in self.model_fields_set and len(self.id2label) != self.num_labels:
            raise FieldError("num_labels", f"is {self.num_labels} but id2label names {len(self.id2label)} labels")
        else:
            object.__setattr__(self, "num_labels", len(self.id2label))
        assert self.id2label is not None
        if sorted(self.id2label) != list(range(len(self.id2label))):
            raise FieldError("id2label", f"keys must be 0..{len(self.id2label) - 1}; got {sorted(self.id2label)}")
        inverse = {name: i for i, name in self.id2label.items()}
        if self.label2id is None:
            object.__setattr__(self, "label2id", inverse)
        elif self.label2id != inverse:
            raise FieldError("label2id", "is not the inverse of id2label")
        return self

    @field_validator("pruned_heads", mode="before")
    @classmethod
    def _int_keys(cls, value: Any) -> Any:
        # JSON object keys are strings; HF casts them back to int the same way.
        if isinstance(value, Mapping):
            return {int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k: v for k, v in value.items()}
        return value

    # ---------------------------------------------------------------------------- cross-field checks
    def consistency_issues(self) -> list[ConfigIssue]:
        """Problems no single field shows: head counts, layer ranges, pruned heads."""
        issues: list[ConfigIssue] = []
        enc = self.encoder
        if self.hidden_size % enc.attention.num_heads:
            issues.append(ConfigIssue("encoder.attention.num_heads", f"must divide hidden_size {self.hidden_size}"))
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            issues.append(ConfigIssue("pad_token_id", f"must be below vocab_size {self.vocab_size}"))
        for j, override in enumerate(enc.overrides):
            outside = [i for i in override.layers if not 0 <= i < enc.num_layers]
            if outside:
                issues.append(
                    ConfigIssue(
                        f"encoder.overrides.{j}.layers",
                        f"layers {outside} do not exist (num_layers is {enc.num_layers})",
                    )
                )
            heads = (override.attention or {}).get("num_heads")
            if isinstance(heads, int) and heads > 0 and self.hidden_size % heads:
                issues.append(
                    ConfigIssue(
                        f"encoder.overrides.{j}.attention.num_heads",
                        f"must divide hidden_size {self.hidden_size}",
                    )
                )
        issues.extend(self._sharing_issues())
        for layer, heads in self.pruned_heads.items():
            loc = f"pruned_heads.{layer}"
            if not 0 <= layer < enc.num_layers:
                issues.append(ConfigIssue(loc, f"layer {layer} does not exist (num_layers is {enc.num_layers})"))
                continue
            try:
                n = enc.layer_specs(layer)[0].num_heads
            except ValidationError:
                continue  # reported where the override is checked
            bad = [h for h in heads if not 0 <= h < n]
            if bad:
                issues.append(ConfigIssue(loc, f"heads {bad} do not exist (the layer has {n} heads)"))
            elif len(set(heads)) >= n:
                issues.append(ConfigIssue(loc, f"cannot prune all {n} heads of a layer"))
        return issues

    def _sharing_issues(self) -> list[ConfigIssue]:
        """Layers that share weights must be built the same way: one module serves them all."""
        enc = self.encoder
        groups = enc.num_layer_groups
        if groups is None:
            return []
        if groups > enc.num_layers:
            return [ConfigIssue("encoder.num_layer_groups", f"is {groups}, more than num_layers {enc.num_layers}")]
        first_of: dict[int, int] = {}
        for index in range(enc.num_layers):
            group = enc.layer_group(index)
            first = first_of.setdefault(group, index)
            if first == index:
                continue
            for key in OVERRIDABLE:
                base = self.position if key == "position" else None
                try:
                    ours, theirs = enc.layer_spec(index, key, base), enc.layer_spec(first, key, base)
                except ValidationError:
                    continue  # reported where the override is checked
                if ours != theirs:
                    culprit = next(
                        j
                        for j, o in enumerate(enc.overrides)
                        if o.changes(key) and (index in o.layers) != (first in o.layers)
                    )
                    return [
                        ConfigIssue(
                            f"encoder.overrides.{culprit}",
                            f"changes {key} of layer {index} but not of layer {first}, yet both share the weights of "
                            f"group {group} (num_layer_groups: {groups}); shared layers must be built alike",
                        )
                    ]
        return []

    # ------------------------------------------------------------------------ checkpoint config.json
    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> BertConfig:
        """Read a checkpoint's ``config.json`` dict (see :func:`bertblocks.hf.config_json.config_from_hf`).

        Raises:
            ConfigError: a config.json this installation cannot read (every problem, with its field).
        """
        return _checkpoint_format().from_hf(hf)

    def to_hf(self) -> dict[str, Any]:
        """This config as a checkpoint's ``config.json`` dict (see :func:`bertblocks.hf.config_json.config_to_hf`)."""
        return _checkpoint_format().to_hf(self)


class CheckpointConfigFormat(Protocol):
    """Translates a config to and from a checkpoint's ``config.json``.

    The schema does not know any checkpoint format: the package that does (``bertblocks.hf``) installs itself
    with :func:`set_checkpoint_format` when it is imported, which importing ``bertblocks`` always does.
    """

    def from_hf(self, data: Mapping[str, Any]) -> BertConfig: ...

    def to_hf(self, config: BertConfig) -> dict[str, Any]: ...


_format: CheckpointConfigFormat | None = None


def set_checkpoint_format(translator: CheckpointConfigFormat) -> None:
    """Install the ``config.json`` translation behind :meth:`BertConfig.from_hf` / :meth:`BertConfig.to_hf`."""
    global _format
    _format = translator


def _checkpoint_format() -> CheckpointConfigFormat:
    if _format is None:  # only when bertblocks.core is used without the bertblocks package around it
        raise RuntimeError("no config.json translation installed: import bertblocks (or bertblocks.hf.config_json)")
    return _format
