"""The registry: pluggy hook specs, the plugin manager, config validation and the builder."""

from __future__ import annotations

from .builder import BuildError, build_components, build_head
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
from .hookspecs import hookimpl, hookspec
from .manager import DISABLE_AUTOLOAD_ENV, ENTRY_POINT_GROUP, PluginInfo, Registry, get_registry, set_registry
from .validation import validate_config

__all__ = [
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "BuildError",
    "DuplicateCommandError",
    "DuplicateComponentError",
    "DuplicatePresetError",
    "KindCollisionError",
    "PluginInfo",
    "PluginLoadError",
    "Registry",
    "RegistryError",
    "UnknownComponentError",
    "UnknownPresetError",
    "build_components",
    "build_head",
    "get_registry",
    "hookimpl",
    "hookspec",
    "set_registry",
    "validate_config",
]
