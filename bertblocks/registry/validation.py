"""Whole-config validation: the schema (phase 1) and every named component with its own options (phase 2).

Every problem is collected and raised together as one :class:`~bertblocks.config.ConfigError`, each with
the dotted path of the field at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from bertblocks.config import (
    OVERRIDABLE,
    BertConfig,
    ComponentSpec,
    ConfigError,
    ConfigIssue,
    issues_from_validation_error,
    merge_spec,
)
from bertblocks.core.component import subcomponent_fields
from bertblocks.core.interfaces import PositionScheme

from .builder import model_dims, plugin_options
from .errors import UnknownComponentError
from .manager import Registry, get_registry


def validate_config(
    data: Mapping[str, Any] | BertConfig, registry: Registry | None = None, source: str | None = None
) -> BertConfig:
    """Validate a config dict (or re-validate a config) against the schema and the registered components.

    Returns a :class:`BertConfig` whose component options are filled in with the plugins' defaults, so that
    printing it shows every value.

    Raises:
        ConfigError: listing every problem, each as ``dotted.path: message``.
    """
    reg = registry or get_registry()
    raw = data.model_dump() if isinstance(data, BertConfig) else dict(data)
    try:
        config = BertConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(issues_from_validation_error(e, model=BertConfig), source) from None

    issues = config.consistency_issues()
    checker = _ComponentChecker(reg, issues)

    def apply(path: tuple[str, ...], options: dict[str, Any] | None) -> None:
        # the plugin's options, defaults filled in, become the spec's own keys: set on the validated spec, so the
        # config is validated once (its typed fields were; the plugin's options model validated the rest)
        if options is None:
            return
        spec: Any = config
        for part in path:
            spec = getattr(spec, part)
        extra = spec.__pydantic_extra__
        extra.update({key: value for key, value in options.items() if key not in type(spec).model_fields})

    enc = config.encoder
    apply(("embedding",), checker.check("embedding", config.embedding, "embedding"))
    apply(("position",), checker.check("position", config.position, "position"))
    apply(("encoder", "attention"), checker.check("attention", enc.attention, "encoder.attention"))
    apply(
        ("encoder", "attention", "backend"),
        checker.check("backend", enc.attention.backend, "encoder.attention.backend"),
    )
    apply(("encoder", "feedforward"), checker.check("feedforward", enc.feedforward, "encoder.feedforward"))
    checker.check_name("activation", enc.feedforward.activation, "encoder.feedforward.activation")
    apply(("encoder", "layer"), checker.check("layer", enc.layer, "encoder.layer"))
    apply(("encoder", "norm"), checker.check("norm", enc.norm, "encoder.norm"))
    if config.pooler is not None:
        apply(("pooler",), checker.check("pooler", config.pooler, "pooler"))

    for j, override in enumerate(enc.overrides):
        for part in OVERRIDABLE:
            changes = override.changes(part)
            if not changes:
                continue
            loc = f"encoder.overrides.{j}.{part}"
            base = config.position if part == "position" else getattr(enc, part)
            try:
                spec = merge_spec(base, changes)
            except ValidationError as e:
                issues.extend(issues_from_validation_error(e, loc))
                continue
            checker.check(part, spec, loc)
            if part == "attention":
                checker.check("backend", spec.backend, f"{loc}.backend")
            elif part == "feedforward":
                checker.check_name("activation", spec.activation, f"{loc}.activation")

    if not issues:
        issues.extend(_position_problems(config, reg))

    if config.head is not None:
        apply(("head",), checker.check("head", config.head, "head"))
    checker.check_name("family", config.family, "family")
    if config.add_cross_attention and not config.is_decoder:
        issues.append(ConfigIssue("add_cross_attention", "cross-attention needs is_decoder: true"))
    # Whole-config checks of the components (a combination one of them cannot work with), once every name is
    # known to exist: each component judges the config where it is used.
    if not issues:
        for kind, spec, loc in checker.used:
            issues.extend(_whole_config_issues(reg, config, kind, spec, loc))

    if issues:
        raise ConfigError(issues, source)
    result = config
    for loc, defaults in checker.defaults.items():
        spec: Any = result
        for part in loc.split("."):
            spec = getattr(spec, part, None)
        if isinstance(spec, ComponentSpec):
            spec._option_defaults = defaults
    return result


def _whole_config_issues(
    reg: Registry, config: BertConfig, kind: str, spec: ComponentSpec, loc: str
) -> list[ConfigIssue]:
    component = reg.get(kind, spec.name)
    if component.validate is None:
        return []
    try:
        found = list(component.validate(config, spec, loc))
    except Exception as e:  # a crashing check is the plugin's bug: say whose
        return [ConfigIssue(loc, f"the validate hook of {kind} {spec.name!r} from {component.provider} raised {e!r}")]
    return [item if isinstance(item, ConfigIssue) else ConfigIssue(loc, str(item)) for item in found]


def _position_problems(config: BertConfig, registry: Registry) -> list[ConfigIssue]:
    """Ask each layer's position scheme whether it fits that layer's heads (RoPE needs an even head dimension,
    a rotary width within it, …), so that such a config fails at ``validate`` and not at ``build``. Identical
    complaints of several layers are reported once, with the layers named.

    Layers without an override are alike, so they are asked once (a stack may be deep); overridden layers
    one by one (no more than the overrides name).
    """
    enc = config.encoder
    overridden = sorted({i for override in enc.overrides for i in override.layers if i < enc.num_layers})
    groups: list[tuple[list[int], Any, Any]] = []
    if len(overridden) < enc.num_layers:
        taken = set(overridden)
        plain = [i for i in range(enc.num_layers) if i not in taken] if overridden else []
        groups.append((plain, enc.attention, config.position))
    for i in overridden:
        try:
            attention, _ = enc.layer_specs(i)
            spec = enc.layer_position(i, config.position)
        except ValidationError:
            continue  # reported where the override is checked
        groups.append(([i], attention, spec))
    found: dict[tuple[str, str], list[int]] = {}
    schemes: dict[str, PositionScheme] = {}
    for layers, attention, spec in groups:
        key = spec.model_dump_json()
        if key not in schemes:
            component = registry.get("position", spec.name)
            options = component.options.model_validate(spec.options())
            made = component.factory(
                max_positions=config.max_position_embeddings, model=model_dims(config), options=options
            )
            if not isinstance(made, PositionScheme):
                continue  # the builder reports a factory returning the wrong type, naming its provider
            schemes[key] = made
        loc = "position" if spec == config.position else "encoder.overrides"
        for problem in schemes[key].problems(attention.num_heads, config.hidden_size // attention.num_heads):
            found.setdefault((loc, problem), []).extend(layers)
    issues = []
    for (loc, problem), layers in found.items():
        if not layers or len(layers) == enc.num_layers:
            where = "every layer"
        elif len(layers) > 16:
            where = f"{len(layers)} layers"
        else:
            where = f"layers {', '.join(map(str, sorted(layers)))}"
        issues.append(ConfigIssue(loc, f"{problem} ({where})"))
    return issues


class _ComponentChecker:
    """Looks components up and validates their options, recording problems instead of raising."""

    def __init__(self, registry: Registry, issues: list[ConfigIssue]) -> None:
        self.registry = registry
        self.issues = issues
        #: ``(kind, spec, loc)`` of every component that passed, for the whole-config checks
        self.used: list[tuple[str, ComponentSpec, str]] = []
        #: the option defaults of each component's options model, by the dotted path of its spec
        self.defaults: dict[str, dict[str, Any]] = {}

    def check_name(self, kind: str, name: str, loc: str) -> Any:
        if kind not in self.registry.kinds():
            self.issues.append(
                ConfigIssue(loc, f"unknown component kind {kind!r}; kinds: {', '.join(self.registry.kinds())}")
            )
            return None
        try:
            return self.registry.get(kind, name)
        except UnknownComponentError as e:
            self.issues.append(ConfigIssue(loc, str(e)))
            return None

    def check(self, kind: str, spec: ComponentSpec, loc: str) -> dict[str, Any] | None:
        """Validate ``spec``'s plugin options; return them with defaults filled in (``None`` on error)."""
        component = self.check_name(kind, spec.name, loc)
        if component is None:
            return None
        try:
            options = component.options.model_validate(plugin_options(component, spec))
        except ValidationError as e:
            known = [*type(spec).model_fields, *component.options.model_fields]
            self.issues.extend(issues_from_validation_error(e, loc, known_fields=known))
            return None
        dump = options.model_dump()
        ok = True
        for field, sub_kind in subcomponent_fields(component.options).items():
            sub = getattr(options, field)
            if isinstance(sub, ComponentSpec):
                filled = self.check(sub_kind, sub, f"{loc}.{field}")
                if filled is None:
                    ok = False
                else:  # the sub-component's defaults shown too
                    dump[field] = {**dump[field], **filled}
        if not ok:
            return None
        self.used.append((kind, spec, loc))
        self.defaults[loc] = {
            key: field.get_default(call_default_factory=True)
            for key, field in component.options.model_fields.items()
            if not field.is_required()
        }
        return dump
