"""What a plugin hands the registry: components it adds, kinds it declares, named presets, and command-line
commands.

Plugins describe components with :class:`Component` and return them from their
``bertblocks_register_components`` hook; kinds of their own are :class:`ComponentKind` s returned from
``bertblocks_register_kinds``; named architectures (the zoo) are :class:`Preset` s returned from
``bertblocks_register_presets``; ``bertblocks`` subcommands are :class:`Command` s returned from
``bertblocks_register_commands``. This lives in ``core`` (not ``registry``) so that plugins, built-in
or third-party, depend on the interfaces only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from ..config import ComponentSpec

if TYPE_CHECKING:
    from ..config import BertConfig, ConfigIssue

Kind = Literal[
    "embedding",
    "position",
    "attention",
    "backend",
    "feedforward",
    "activation",
    "norm",
    "layer",
    "pooler",
    "head",
    "family",
]
#: the built-in kinds; plugins may declare more (:class:`ComponentKind`), never one of these
KINDS: tuple[str, ...] = get_args(Kind)

#: ``validate(config, spec, loc)``: problems a component sees in the whole config, each a message (placed at
#: ``loc``, the dotted path of the component's spec) or a :class:`~bertblocks.config.ConfigIssue`
ConfigCheck = Callable[["BertConfig", "ComponentSpec", str], "Iterable[str | ConfigIssue]"]


class NoOptions(BaseModel):
    """Options model of a component that takes none: any key is an error."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Component:
    """One named component of one kind.

    Attributes:
        kind: which interface it implements (``attention``, ``backend``, ``position``, …).
        name: the name configs use; unique within its kind.
        factory: builds the component; called with keyword arguments documented per kind in
            ``docs/plugins/hooks.md``, always including ``options`` (an instance of ``options``).
        options: pydantic model of the component's own options; give it ``extra="forbid"`` so typos are
            errors.
        description: one line for listings.
        provider: filled in by the registry: the plugin (and distribution) that registered it.
        validate: optional whole-config check, called by :func:`bertblocks.registry.validate_config` for every
            place the component is used (``validate(config, spec, loc)``, see :data:`ConfigCheck`), so that a
            combination it cannot work with fails at ``validate``, not at ``build``.
        aliases: other names configs may use for this component (``swiglu`` for the activation of a SwiGLU
            gate); not listed as components of their own, unique within the kind like names.
    """

    kind: str
    name: str
    factory: Callable[..., Any]
    options: type[BaseModel] = NoOptions
    description: str = ""
    provider: str = ""
    validate: ConfigCheck | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class ComponentKind:
    """A component kind a plugin declares, for sub-components its own components build through the registry.

    A component's options model names a sub-component with :func:`subcomponent` (``gate: ComponentSpec =
    subcomponent("gate", "constant")``); the registry then validates that nested spec against the components
    of this kind (unknown names and options reported with their dotted path, as for built-in kinds), and the
    component's factory builds it with the ``build`` argument it receives (``build(options.gate, **kwargs)``).

    Attributes:
        name: the kind's name; must differ from every built-in kind (:data:`KINDS`) and other plugins' kinds.
        returns: what factories of this kind must return (checked when built); ``object`` checks nothing.
        description: one line for listings.
        provider: filled in by the registry.
    """

    name: str
    returns: type = object
    description: str = ""
    provider: str = ""


#: key in a field's ``json_schema_extra`` that marks it a sub-component of the named kind
SUBCOMPONENT_KEY = "bertblocks_kind"


def subcomponent(kind: str, default: str | None = None, description: str = "") -> Any:
    """A field of an options model holding a sub-component spec of ``kind`` (``{name: ..., **options}``).

    Args:
        kind: a built-in kind or one a plugin declares with :class:`ComponentKind`.
        default: the component name used when the config omits the field (``None``: the field is required).
        description: for the component reference.
    """
    extra = {SUBCOMPONENT_KEY: kind}
    if default is None:
        return Field(..., description=description, json_schema_extra=extra)
    return Field(default_factory=lambda: ComponentSpec(name=default), description=description, json_schema_extra=extra)


def subcomponent_fields(options: type[BaseModel]) -> dict[str, str]:
    """``{field name: kind}`` of the :func:`subcomponent` fields of an options model."""
    out = {}
    for name, info in options.model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and isinstance(extra.get(SUBCOMPONENT_KEY), str):
            out[name] = str(extra[SUBCOMPONENT_KEY])
    return out


@dataclass(frozen=True)
class Preset:
    """A named architecture: a raw config that :func:`bertblocks.load_config` validates when it is used.

    Attributes:
        name: what users type (``bert-base-uncased``); unique across all plugins.
        config: the config as a nested mapping (the YAML format), validated only when the preset is used,
            so that one broken preset cannot break the listing of the others.
        description: one line for listings.
        provider: filled in by the registry: the plugin (and distribution) that registered it.
    """

    name: str
    config: Mapping[str, Any]
    description: str = ""
    provider: str = ""


@dataclass(frozen=True)
class Command:
    """One ``bertblocks`` subcommand.

    ``configure`` and ``run`` may be given as ``"module:function"`` strings, imported only when the command is
    used, so that listing the commands (``bertblocks --help``) imports nothing of the plugin but this object.

    Attributes:
        name: what users type (``bertblocks NAME``); unique across all plugins.
        help: one line for ``bertblocks --help``.
        configure: adds the command's arguments: ``(parser: argparse.ArgumentParser) -> None``.
        run: does the work and returns the exit code: ``(args: argparse.Namespace) -> int``.
        description: longer text for ``bertblocks NAME --help`` (defaults to ``help``).
        provider: filled in by the registry: the plugin (and distribution) that registered it.
    """

    name: str
    help: str
    configure: Callable[..., Any] | str
    run: Callable[..., Any] | str
    description: str = ""
    provider: str = ""
