"""What a plugin hands the registry: components it adds, named presets, and command-line commands.

Plugins describe components with :class:`Component` and return them from their
``bertblocks_register_components`` hook; named architectures (the zoo) are :class:`Preset` s returned from
``bertblocks_register_presets``; ``bertblocks`` subcommands are :class:`Command` s returned from
``bertblocks_register_commands``. This lives in ``core`` (not ``registry``) so that plugins, built-in
or third-party, depend on the interfaces only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

Kind = Literal["embedding", "position", "attention", "backend", "feedforward", "activation", "pooler", "head", "family"]
KINDS: tuple[str, ...] = get_args(Kind)


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
        architecture: heads only: the model class name a checkpoint's ``config.json`` lists under
            ``architectures`` for a model with this head (transformers' task-model class). Loading reads the
            head from it; saving writes it. ``""``: none (such a model is saved as a bare backbone's class).
    """

    kind: Kind
    name: str
    factory: Callable[..., Any]
    options: type[BaseModel] = NoOptions
    description: str = ""
    provider: str = ""
    architecture: str = ""


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
