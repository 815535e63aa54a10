"""The plugin manager: built-in plugins plus third-party ones found through the ``bertblocks`` entry-point
group, and look-up of components by ``(kind, name)``.

Third-party entry points are loaded one at a time (pluggy's ``load_setuptools_entrypoints`` aborts on the
first broken plugin without saying which): a plugin that fails to import, or whose hook raises or returns
something other than components, is recorded as a :class:`PluginLoadError` with the entry point, the
distribution and the traceback. Other plugins keep working; ``strict=True`` raises instead (at
construction: the hooks of every plugin are then called at once). Setting
``BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points (built-ins still load).

What counts as a broken plugin: an entry point that does not import (or exits), a module pluggy refuses
(a hook implementation with arguments its spec lacks), a ``bertblocks_*`` function that is no hook (a
typo: reported with the closest hook name), an entry-point name two distributions both claim, and a hook
that raises or returns something other than the documented list.

A component (or preset) name that two plugins register is not a load failure: both are listed
(``components()``, ``bertblocks components``), every other name keeps working, and only *using* that name
raises :class:`DuplicateComponentError` naming both providers (``strict=True`` raises at construction).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache, partial
from types import ModuleType
from typing import Any, TypeVar

import pluggy
from pydantic import BaseModel

from bertblocks.core.component import KINDS, Command, Component, ComponentKind, Preset
from bertblocks.core.factories import CONTRACTS, KindContract

from ..errors import InputTypeError, did_you_mean
from .errors import (
    DuplicateCommandError,
    DuplicateComponentError,
    DuplicatePresetError,
    KindCollisionError,
    PluginLoadError,
    RegistryError,
    UnknownComponentError,
    UnknownPresetError,
)
from .hookspecs import PROJECT, BertBlocksHooks

ENTRY_POINT_GROUP = "bertblocks"
DISABLE_AUTOLOAD_ENV = "BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD"

T = TypeVar("T")


class _PluginManager(pluggy.PluginManager):
    """Takes unmarked ``bertblocks_*`` functions as hook implementations, as pytest does for ``pytest_*``."""

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(f"{PROJECT}_") and callable(getattr(plugin, name, None)):
            return {}
        return opts


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin, for listings (``bertblocks plugins``)."""

    name: str
    distribution: str
    version: str
    hooks: tuple[str, ...]


class Registry:
    """All components available to configs.

    Args:
        load_entry_points: discover third-party plugins (unless ``BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD`` is
            set). Tests pass ``False`` for a registry holding only the built-ins and what they register.
        strict: raise the first :class:`PluginLoadError` instead of recording it.
        builtins: register the built-in plugins (``False`` for a bare registry in tests).

    Example:
        >>> reg = Registry(load_entry_points=False)
        >>> reg.get("backend", "sdpa").name
        'sdpa'
    """

    def __init__(self, *, load_entry_points: bool = True, strict: bool = False, builtins: bool = True) -> None:
        self.strict = strict
        self._import_errors: list[PluginLoadError] = []
        # keyed by (plugin, hook): hooks are re-run whenever a registration invalidates the index, and the
        # same failure must be reported once, not once per re-run
        self._hook_errors: dict[tuple[str, str], PluginLoadError] = {}
        self._labels: dict[str, str] = {}  # plugin name → "entry = point.value" for entry-point plugins
        self._pm = _PluginManager(PROJECT)
        self._pm.add_hookspecs(BertBlocksHooks)
        self._origin: dict[str, tuple[str, str]] = {}  # plugin name → (distribution, version)
        self._index: dict[tuple[str, str], Component] | None = None
        self._preset_index: dict[str, Preset] | None = None
        self._kind_index: dict[str, ComponentKind] | None = None
        self._alias_index: dict[tuple[str, str], Component] = {}  # rebuilt with the component index
        # names two plugins registered: every provider, in registration order (filled with the indexes)
        self._clashes: dict[tuple[str, str], list[Component]] = {}
        self._preset_clashes: dict[str, list[Preset]] = {}
        self._command_index: dict[str, Command] | None = None
        if builtins:
            from bertblocks.families import FAMILY_PLUGINS
            from bertblocks.plugins import BUILTIN_PLUGINS

            version = _version("bertblocks")
            for module in (*BUILTIN_PLUGINS, *FAMILY_PLUGINS):
                self.register(
                    module,
                    name=module.__name__,
                    distribution="bertblocks",
                    version=version,
                )
        if load_entry_points and not os.environ.get(DISABLE_AUTOLOAD_ENV):
            self._load_entry_points()
        if strict:  # strict means: fail now, not at the first look-up
            self._kinds()
            self._components()
            self._presets()
            for (kind, name), clash in self._clashes.items():
                raise DuplicateComponentError(kind, name, clash[0].provider, clash[1].provider)
            for preset_name, preset_clash in self._preset_clashes.items():
                raise DuplicatePresetError(preset_name, preset_clash[0].provider, preset_clash[1].provider)

    @property
    def load_errors(self) -> list[PluginLoadError]:
        """Every plugin failure so far: entry points that did not load, hooks that raised or returned garbage.

        Hooks run on first use; reading this runs them, so that a broken hook is listed before any look-up.
        """
        self._components()
        self._presets()
        return [*self._import_errors, *self._hook_errors.values()]

    # ------------------------------------------------------------------------------------- registration
    def register(
        self,
        plugin: ModuleType | object,
        name: str | None = None,
        *,
        distribution: str = "(in-process)",
        version: str = "",
    ) -> None:
        """Add a plugin (a module or object with ``bertblocks_*`` hook functions) without packaging it."""
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        self._pm.register(plugin, name=name)
        self._origin[name] = (distribution, version)
        self._index = None
        self._preset_index = None
        self._kind_index = None
        self._command_index = None
        unknown = _unknown_hooks(plugin)
        if unknown:  # a misspelt hook would register nothing, silently
            where = f"{distribution} {version}".strip()
            self._record_import(PluginLoadError(self._labels.get(name, name), where, unknown))

    def _load_entry_points(self) -> None:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist is not None else "?"
            version = ep.dist.version if ep.dist is not None else ""
            label, where = f"{ep.name} = {ep.value}", f"{dist} {version}".strip()
            if self._pm.get_plugin(ep.name) is not None:
                other, other_version = self._origin.get(ep.name, ("?", ""))
                self._record_import(
                    PluginLoadError(
                        label,
                        where,
                        f"the plugin name {ep.name!r} is already taken by {f'{other} {other_version}'.strip()}; "
                        "one of the two distributions must rename its entry point",
                    )
                )
                continue
            try:
                plugin = ep.load()
            except (Exception, SystemExit):  # a plugin calling sys.exit() on import must not end the program
                self._record_import(PluginLoadError(label, where, traceback.format_exc()))
                continue
            self._labels[ep.name] = label
            try:
                # pluggy refuses a hook implementation whose arguments the spec does not have, or a module
                # that is already registered under another name
                self.register(plugin, name=ep.name, distribution=dist, version=version)
            except PluginLoadError:
                raise  # strict: a misspelt hook, reported by register
            except Exception:
                self._record_import(PluginLoadError(label, where, traceback.format_exc()))
                continue

    def _record_import(self, error: PluginLoadError) -> None:
        if self.strict:
            raise error
        self._import_errors.append(error)

    def _record(self, plugin_name: str, hook: str) -> None:
        """Record (or, strict, raise) the exception being handled as a failure of ``plugin_name``'s ``hook``."""
        dist, version = self._origin.get(plugin_name, ("?", ""))
        error = PluginLoadError(
            self._labels.get(plugin_name, plugin_name), f"{dist} {version}".strip(), traceback.format_exc()
        )
        if self.strict:
            raise error
        self._hook_errors[(plugin_name, hook)] = error

    def _collect(self, hook: str, check: Callable[[Any], list[T]]) -> list[tuple[str, list[T]]]:
        """Call every plugin's implementation of ``hook`` (``pm.hook.<hook>``'s, in registration order), each on
        its own: ``[(provider, checked items)]`` for those that worked.

        pluggy's own ``pm.hook.<hook>()`` would stop at the first implementation that raises, without saying
        whose it was; here a hook that raises, or returns what ``check`` refuses, is recorded against its
        plugin and distribution (strict: raised) and the other plugins' results are kept. A hook that works
        again (after a re-registration) clears its old error.
        """
        collected: list[tuple[str, list[T]]] = []
        for impl in getattr(self._pm.hook, hook).get_hookimpls():
            name = impl.plugin_name
            dist, _ = self._origin.get(name, ("?", ""))
            provider = name if dist in ("?", "(in-process)") else f"{name} ({dist})"
            try:
                items = check(impl.function())
            except Exception:
                self._record(name, hook)
                continue
            self._hook_errors.pop((name, hook), None)
            collected.append((provider, items))
        return collected

    # -------------------------------------------------------------------------------------------- look-up
    def _kinds(self) -> dict[str, ComponentKind]:
        """Kinds plugins declare (``bertblocks_register_kinds``), by name."""
        if self._kind_index is not None:
            return self._kind_index
        index: dict[str, ComponentKind] = {}
        for provider, kinds in self._collect("bertblocks_register_kinds", _check_kinds):
            for kind in kinds:
                if kind.name in KINDS:
                    raise KindCollisionError(kind.name, "bertblocks (built in)", provider)
                if kind.name in index:
                    raise KindCollisionError(kind.name, index[kind.name].provider, provider)
                index[kind.name] = replace(kind, provider=provider)
        self._kind_index = index
        return index

    def kinds(self) -> list[str]:
        """Every component kind: the built-in ones, then those plugins declare (sorted)."""
        return [*KINDS, *sorted(self._kinds())]

    def contract(self, kind: str) -> KindContract:
        """The contract of ``kind``: what its factories receive and must return. A built-in kind's is its row of
        the one table (:data:`bertblocks.core.factories.CONTRACTS`, the families' for ``family``); a plugin's
        kind's says what its :class:`~bertblocks.core.component.ComponentKind` declares.

        Raises:
            RegistryError: no such kind.
        """
        builtin = builtin_contracts().get(kind)
        if builtin is not None:
            return builtin
        declared = self._kinds().get(kind)
        if declared is not None:
            return KindContract(kind, declared.returns)
        raise RegistryError(f"unknown component kind {kind!r}; kinds: {', '.join(self.kinds())}")

    def _components(self) -> dict[tuple[str, str], Component]:
        if self._index is not None:
            return self._index
        kinds = set(self.kinds())
        index: dict[tuple[str, str], Component] = {}
        self._clashes = {}
        for provider, components in self._collect(
            "bertblocks_register_components", partial(_check_components, kinds=kinds)
        ):
            for component in components:
                key = (component.kind, component.name)
                if key in index:
                    # an error only where the name is used (get): one plugin clashing with another must not
                    # take every other component, and `bertblocks plugins`, down with it
                    self._clashes.setdefault(key, [index[key]]).append(replace(component, provider=provider))
                    continue
                index[key] = replace(component, provider=provider)
        aliases: dict[tuple[str, str], Component] = {}
        for component in index.values():
            for alias in component.aliases:
                key = (component.kind, alias)
                if key in index or key in aliases:  # an error where the name is used, as for names
                    first = index[key] if key in index else aliases[key]
                    self._clashes.setdefault(key, [first]).append(component)
                    continue
                aliases[key] = component
        self._alias_index = aliases
        self._index = index
        return index

    @property
    def conflicts(self) -> list[str]:
        """One line per component or preset name that two plugins registered (using it is an error)."""
        self._components()
        self._presets()
        lines = [
            f"{kind} {name!r} is registered by " + " and by ".join(c.provider for c in providers)
            for (kind, name), providers in self._clashes.items()
        ]
        lines += [
            f"preset {name!r} is registered by " + " and by ".join(p.provider for p in providers)
            for name, providers in self._preset_clashes.items()
        ]
        return lines

    def get(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``.

        Raises:
            UnknownComponentError: listing the names of that kind, the closest one, and broken plugins.
        """
        index = self._components()
        if kind not in KINDS and kind not in self._kinds():
            raise RegistryError(f"unknown component kind {kind!r}; kinds: {', '.join(self.kinds())}")
        clash = self._clashes.get((kind, name))
        if clash is not None:
            raise DuplicateComponentError(kind, name, clash[0].provider, " and by ".join(c.provider for c in clash[1:]))
        try:
            return index[(kind, name)] if (kind, name) in index else self._alias_index[(kind, name)]
        except KeyError:
            raise UnknownComponentError(
                kind, name, [n for k, n in index if k == kind], [e.summary() for e in self.load_errors]
            ) from None

    def components(self, kind: str | None = None) -> list[Component]:
        """Every component (of ``kind``), sorted by kind then name."""
        index = self._components()
        listed = list(index.values())
        # the second provider of a clashing name is listed too (an alias clash's second is listed already)
        every = [*listed, *(c for clash in self._clashes.values() for c in clash[1:] if c not in listed)]
        order = {k: i for i, k in enumerate(self.kinds())}
        return sorted(
            (c for c in every if kind is None or c.kind == kind),
            key=lambda c: (order.get(c.kind, len(order)), c.name),
        )

    def _presets(self) -> dict[str, Preset]:
        if self._preset_index is not None:
            return self._preset_index
        index: dict[str, Preset] = {}
        self._preset_clashes = {}
        for provider, presets in self._collect("bertblocks_register_presets", _check_presets):
            for preset in presets:
                if preset.name in index:  # an error only where the name is used (get_preset)
                    self._preset_clashes.setdefault(preset.name, [index[preset.name]]).append(
                        replace(preset, provider=provider)
                    )
                    continue
                index[preset.name] = replace(preset, provider=provider)
        self._preset_index = index
        return index

    def presets(self) -> list[Preset]:
        """Every registered preset, sorted by name (a name two plugins registered: both)."""
        index = self._presets()
        every = [*index.values(), *(p for clash in self._preset_clashes.values() for p in clash[1:])]
        return sorted(every, key=lambda p: p.name)

    def get_preset(self, name: str) -> Preset:
        """The preset called ``name``.

        Raises:
            UnknownPresetError: naming the closest presets, every available one, and broken plugins.
        """
        index = self._presets()
        clash = self._preset_clashes.get(name)
        if clash is not None:
            raise DuplicatePresetError(name, clash[0].provider, " and by ".join(p.provider for p in clash[1:]))
        try:
            return index[name]
        except KeyError:
            raise UnknownPresetError(name, index, [e.summary() for e in self.load_errors]) from None

    def _commands(self) -> dict[str, Command]:
        if self._command_index is not None:
            return self._command_index
        index: dict[str, Command] = {}
        for provider, commands in self._collect("bertblocks_register_commands", _check_commands):
            for command in commands:
                if command.name in index:
                    raise DuplicateCommandError(command.name, index[command.name].provider, provider)
                index[command.name] = replace(command, provider=provider)
        self._command_index = index
        return index

    def commands(self) -> dict[str, Command]:
        """Every registered ``bertblocks`` subcommand by name, in registration order.

        Raises:
            DuplicateCommandError: two plugins registered the same name (the message names both).
        """
        return dict(self._commands())

    def has_plugin(self, name: str) -> bool:
        """Whether a plugin of that name is registered."""
        return self._pm.get_plugin(name) is not None

    def plugins(self) -> list[PluginInfo]:
        """Every registered plugin with its distribution, version and implemented hooks."""
        out = []
        for name, plugin in self._pm.list_name_plugin():
            dist, version = self._origin.get(name, ("?", ""))
            hooks = tuple(sorted(h.name for h in self._pm.get_hookcallers(plugin) or []))
            out.append(PluginInfo(name, dist, version, hooks))
        return out


def _unknown_hooks(plugin: object) -> str:
    """A message naming the ``bertblocks_*`` functions of ``plugin`` that are no hook (typos), or ``""``."""
    known = [name for name in dir(BertBlocksHooks) if name.startswith(f"{PROJECT}_")]
    lines = []
    for name in sorted(dir(plugin)):
        if name.startswith(f"{PROJECT}_") and name not in known and callable(getattr(plugin, name, None)):
            lines.append(
                f"{name} is not a bertblocks hook{did_you_mean(name, known, cutoff=0.6)}; hooks: {', '.join(known)}"
            )
    return "\n".join(lines)


def _check_kinds(returned: Any) -> list[ComponentKind]:
    if not isinstance(returned, list | tuple):
        raise InputTypeError(f"bertblocks_register_kinds must return a list of ComponentKind, got {type(returned)}")
    for item in returned:
        if not isinstance(item, ComponentKind):
            raise InputTypeError(f"bertblocks_register_kinds returned {item!r}, not a ComponentKind")
        if not isinstance(item.name, str) or not item.name.isidentifier():
            raise InputTypeError(f"a component kind's name must be an identifier, got {item.name!r}")
    return list(returned)


def _check_components(returned: Any, kinds: set[str] | None = None) -> list[Component]:
    kinds = kinds if kinds is not None else set(KINDS)
    if not isinstance(returned, list | tuple):
        raise InputTypeError(f"bertblocks_register_components must return a list of Component, got {type(returned)}")
    for item in returned:
        if not isinstance(item, Component):
            raise InputTypeError(f"bertblocks_register_components returned {item!r}, not a Component")
        if item.kind not in kinds:
            raise InputTypeError(
                f"component {item.name!r} has unknown kind {item.kind!r}; kinds: {', '.join(sorted(kinds))} "
                "(a plugin declares a new kind with bertblocks_register_kinds)"
            )
        if not (isinstance(item.options, type) and issubclass(item.options, BaseModel)):
            raise InputTypeError(f"component {item.kind} {item.name!r}: options must be a pydantic model class")
    return list(returned)


def _check_presets(returned: Any) -> list[Preset]:
    if not isinstance(returned, list | tuple):
        raise InputTypeError(f"bertblocks_register_presets must return a list of Preset, got {type(returned)}")
    for item in returned:
        if not isinstance(item, Preset):
            raise InputTypeError(f"bertblocks_register_presets returned {item!r}, not a Preset")
        if not isinstance(item.name, str) or not item.name:
            raise InputTypeError(f"preset name must be a non-empty string, got {item.name!r}")
        if not isinstance(item.config, Mapping):
            raise InputTypeError(f"preset {item.name!r}: config must be a mapping, got {type(item.config).__name__}")
    return list(returned)


def _check_commands(returned: Any) -> list[Command]:
    if not isinstance(returned, list | tuple):
        raise InputTypeError(f"bertblocks_register_commands must return a list of Command, got {type(returned)}")
    for item in returned:
        if not isinstance(item, Command):
            raise InputTypeError(f"bertblocks_register_commands returned {item!r}, not a Command")
        if not isinstance(item.name, str) or not item.name or item.name.startswith("-"):
            raise InputTypeError(f"command name must be a non-empty string not starting with '-', got {item.name!r}")
    return list(returned)


@cache
def builtin_contracts() -> Mapping[str, KindContract]:
    """Every built-in kind's contract: the component kinds' table and the families' row (imported here, on
    first use, so that importing the registry does not import every family)."""
    from bertblocks.families.family import FAMILY_CONTRACT

    return {**CONTRACTS, FAMILY_CONTRACT.kind: FAMILY_CONTRACT}


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "0+unknown"


_default: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, built on first use (importing bertblocks has no side effects)."""
    global _default
    if _default is None:
        _default = Registry()
    return _default


def set_registry(registry: Registry | None) -> None:
    """Replace the process-wide registry (``None`` rebuilds it on next use); for tests and embedding apps."""
    global _default
    _default = registry
