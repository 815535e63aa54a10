"""What a plugin hands the registry for each component it adds.

Plugins describe components with :class:`Component` and return them from their
``bertblocks_register_components`` hook. This lives in ``core`` (not ``registry``) so that plugins, built-in
or third-party, depend on the interfaces only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

Kind = Literal["embedding", "position", "attention", "backend", "feedforward", "activation", "pooler", "head"]
KINDS: tuple[str, ...] = get_args(Kind)


class NoOptions(BaseModel):
    """Options model of a component that takes none: any key is an error."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Component:
    """One named component of one kind.

    Attributes:
        kind: which interface it implements (``attention``, ``backend``, ``position``, …).
        name: the name configs use (``sdpa``, ``relative_key``, …); unique within its kind.
        factory: builds the component; called with keyword arguments documented per kind in
            ``docs/plugins/hooks.md``, always including ``options`` (an instance of ``options``).
        options: pydantic model of the component's own options; give it ``extra="forbid"`` so typos are
            errors.
        description: one line for listings.
        provider: filled in by the registry: the plugin (and distribution) that registered it.
    """

    kind: Kind
    name: str
    factory: Callable[..., Any]
    options: type[BaseModel] = NoOptions
    description: str = ""
    provider: str = ""
