"""The hooks a bertblocks plugin can implement.

A plugin is a module (or object) with functions named after these hooks. The ``@hookimpl`` marker is
optional: like pytest, bertblocks also takes any function whose name starts with ``bertblocks_``, so a
plugin module need not import the registry at all. Every hook returns a list; results of all plugins are
concatenated.
"""

from __future__ import annotations

import pluggy

from bertblocks.core.component import Command, Component, ComponentKind, Preset

PROJECT = "bertblocks"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BertBlocksHooks:
    """Hook specifications (documented in ``docs/plugins/hooks.md``; a test checks every hook is)."""

    @hookspec
    def bertblocks_register_components(self) -> list[Component]:  # type: ignore[empty-body]
        """Return the components this plugin adds: embeddings, position schemes, attention modules,
        attention backends, feed-forward blocks, activations, poolers, heads.

        Each :class:`~bertblocks.core.component.Component` names its kind, its name, a factory and a pydantic
        model of its options. A ``(kind, name)`` registered by two plugins is an error naming both.
        """

    @hookspec
    def bertblocks_register_presets(self) -> list[Preset]:  # type: ignore[empty-body]
        """Return the named architectures (presets) this plugin adds to the zoo.

        Each :class:`~bertblocks.core.component.Preset` carries a name, the config as a nested mapping (what
        a YAML config file holds) and a one-line description. The config is validated when the preset is
        used (``create_model``, ``load_config``), with the same errors as a config file. A name registered
        by two plugins is an error naming both.
        """

    @hookspec
    def bertblocks_register_commands(self) -> list[Command]:  # type: ignore[empty-body]
        """Return the ``bertblocks`` subcommands this plugin adds (datasette's ``register_commands``).

        Each :class:`~bertblocks.core.component.Command` names the command, a one-line help, and the
        functions that add its arguments and run it (callables, or ``"module:function"`` strings imported only
        when the command runs, so that ``bertblocks --help`` stays fast). The built-in commands and
        ``bertblocks ablate`` register through this hook too. A name registered by two plugins is an error
        naming both.
        """

    @hookspec
    def bertblocks_register_kinds(self) -> list[ComponentKind]:  # type: ignore[empty-body]
        """Return the component kinds this plugin declares, for sub-components its own components build.

        Each :class:`~bertblocks.core.component.ComponentKind` has a name (never a built-in kind's, nor another
        plugin's: either raises :class:`~bertblocks.registry.KindCollisionError` naming both) and the type its
        factories return. Components of the kind are registered with ``bertblocks_register_components`` like
        any other; an options field made with :func:`~bertblocks.core.component.subcomponent` names one, and the
        registry validates it with dotted-path errors.
        """
