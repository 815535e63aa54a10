"""The module the ``bertblocks`` entry point names: it implements the ``bertblocks_register_components`` hook.

No decorator and no import of ``bertblocks.registry`` is needed: bertblocks takes any function called
``bertblocks_<hook>`` in an entry-point module as that hook's implementation.
"""

from __future__ import annotations

from bertblocks.core.component import Component

from .alibi import AlibiOptions, make_alibi
from .local import LocalOptions, make_local


def bertblocks_register_components() -> list[Component]:
    """The components this plugin adds: position scheme ``alibi`` and attention backend ``local``."""
    return [
        Component(
            "position",
            "alibi",
            make_alibi,
            options=AlibiOptions,
            description="ALiBi: per-head linear distance bias, no position embedding",
        ),
        Component(
            "backend",
            "local",
            make_local,
            options=LocalOptions,
            description="sliding-window attention: keys at most `window` positions away",
        ),
    ]
