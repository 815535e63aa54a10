"""Errors the registry raises, each saying what is wrong and what would be right."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import BertBlocksError, close_matches, did_you_mean


class RegistryError(BertBlocksError):
    """Base of registry errors.

    Picklable although the subclasses' constructors take other arguments than their message (pickle would call
    ``cls(*args)``): an error raised in a worker process (an ablation run) reaches the parent as itself.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(self.__dict__)))


def _restore(cls: type[RegistryError], args: tuple[Any, ...], state: dict[str, Any]) -> RegistryError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


def _broken_plugins(broken: Iterable[str]) -> str:
    """The suffix naming the plugins that failed to load (an unknown name may be one of theirs), or ``""``."""
    broken = list(broken)
    return "; plugins that failed to load (it may come from one of them): " + "; ".join(broken) if broken else ""


class UnknownComponentError(RegistryError, LookupError):
    """A config named a component no plugin registered."""

    def __init__(self, kind: str, name: str, available: Iterable[str], broken: Iterable[str] = ()) -> None:
        self.kind, self.name = kind, name
        self.available = sorted(available)
        msg = f"unknown {kind} {name!r}; available: {', '.join(self.available) or '(none)'}" + did_you_mean(
            name, self.available
        )
        super().__init__(msg + _broken_plugins(broken))

    def __str__(self) -> str:  # LookupError would repr() the message
        return str(self.args[0])


class DuplicateComponentError(RegistryError):
    """Two plugins registered the same ``(kind, name)``."""

    def __init__(self, kind: str, name: str, first: str, second: str) -> None:
        super().__init__(f"{kind} {name!r} is registered twice: by {first} and by {second}")


class KindCollisionError(RegistryError):
    """A plugin declared a component kind that is built in or that another plugin declared."""

    def __init__(self, kind: str, first: str, second: str) -> None:
        super().__init__(
            f"component kind {kind!r} is declared twice: by {first} and by {second}; "
            "a plugin's kind needs a name of its own"
        )


class PluginLoadError(RegistryError):
    """A plugin failed to import or its hook raised; carries the entry point, distribution and traceback."""

    def __init__(self, plugin: str, distribution: str, detail: str) -> None:
        self.plugin, self.distribution, self.detail = plugin, distribution, detail
        super().__init__(f'Error loading plugin "{plugin}" (from {distribution}):\n{detail}')

    def summary(self) -> str:
        last = self.detail.strip().splitlines()[-1] if self.detail.strip() else ""
        return f"{self.plugin} ({self.distribution}): {last}"


class UnknownPresetError(RegistryError, LookupError):
    """A preset name no plugin registered."""

    def __init__(self, name: str, available: Iterable[str], broken: Iterable[str] = (), context: str = "") -> None:
        self.name = name
        self.available = sorted(available)
        self.closest = close_matches(name, self.available, n=3)
        msg = f"unknown preset {name!r}{context}"
        if self.closest:
            msg += f"; closest: {', '.join(self.closest)}"
        msg += f"; available: {', '.join(self.available) or '(none)'}"
        super().__init__(msg + _broken_plugins(broken))

    def __str__(self) -> str:  # LookupError would repr() the message
        return str(self.args[0])


class DuplicatePresetError(RegistryError):
    """Two plugins registered a preset of the same name."""

    def __init__(self, name: str, first: str, second: str) -> None:
        super().__init__(f"preset {name!r} is registered twice: by {first} and by {second}")


class DuplicateCommandError(RegistryError):
    """Two plugins registered a ``bertblocks`` subcommand of the same name."""

    def __init__(self, name: str, first: str, second: str) -> None:
        super().__init__(f"command {name!r} is registered twice: by {first} and by {second}")
