"""``bertblocks ablate``, registered through ``bertblocks_register_commands`` exactly as a third party would.

Nothing of the ablation package is imported to list the command: ``configure`` and ``run`` are
``"module:function"`` strings, imported when the command runs.
"""

from __future__ import annotations

from bertblocks.core.component import Command


def bertblocks_register_commands() -> list[Command]:
    """The ``ablate`` command."""
    return [
        Command(
            "ablate",
            "run an ablation study: vary components, measure cost and quality per variant",
            configure="bertblocks.ablation.cli:configure_parser",
            run="bertblocks.ablation.cli:run",
        )
    ]
