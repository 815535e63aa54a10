"""Whole-config validation: the schema (phase 1) and every named component with its own options (phase 2).

Every problem is collected and raised together as one :class:`~bertblocks.core.config.ConfigError`, each with
the dotted path of the field at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from bertblocks.core.config import (
    BertConfig,
    ComponentSpec,
    ConfigError,
    ConfigIssue,
    issues_from_validation_error,
    merge_spec,
)

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
    normalized = config.model_dump()
    checker = _ComponentChecker(reg, issues)

    def apply(path: tuple[str, ...], options: dict[str, Any] | None) -> None:
        if options is None:
            return
        node = normalized
        for part in path:
            node = node[part]
        node.update(options)

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
    if config.pooler is not None:
        apply(("pooler",), checker.check("pooler", config.pooler, "pooler"))

    for j, override in enumerate(enc.overrides):
        for part, base in (("attention", enc.attention), ("feedforward", enc.feedforward)):
            changes = getattr(override, part)
            if not changes:
                continue
            loc = f"encoder.overrides.{j}.{part}"
            try:
                spec = merge_spec(base, changes)
            except ValidationError as e:
                issues.extend(issues_from_validation_error(e, loc))
                continue
            checker.check(part, spec, loc)
            if part == "attention":
                checker.check("backend", spec.backend, f"{loc}.backend")
            else:
                checker.check_name("activation", spec.activation, f"{loc}.activation")

    if config.head is not None:
        apply(("head",), checker.check("head", config.head, "head"))
    checker.check_name("family", config.family, "family")
    if config.add_cross_attention and not config.is_decoder:
        issues.append(ConfigIssue("add_cross_attention", "cross-attention needs is_decoder: true"))

    if issues:
        raise ConfigError(issues, source)
    return BertConfig.model_validate(normalized)


class _ComponentChecker:
    """Looks components up and validates their options, recording problems instead of raising."""

    def __init__(self, registry: Registry, issues: list[ConfigIssue]) -> None:
        self.registry = registry
        self.issues = issues

    def check_name(self, kind: str, name: str, loc: str) -> Any:
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
            options = component.options.model_validate(spec.options())
        except ValidationError as e:
            known = [*type(spec).model_fields, *component.options.model_fields]
            self.issues.extend(issues_from_validation_error(e, loc, known_fields=known))
            return None
        return options.model_dump()
