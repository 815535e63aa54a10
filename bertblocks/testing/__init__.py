"""A conformance suite for plugin authors: does a registered component honour its interface?

Every check places the component in a tiny model (hidden 32, 2 layers, 4 heads) or calls it directly, and
compares it with what the interface promises: output shapes and dtypes, padding masks respected, the same
answer twice with dropout off, gradients for every parameter, weights that survive a checkpoint round trip,
cache equivalence for decoders, equivalence with the built-in ``eager`` kernel for attention backends, and
``torch.compile`` on a packed batch with dynamic shapes. Model-level checks run on the padded and the packed path
(:func:`~bertblocks.testing.suite.run_check`); declarations (``reads_padded_positions``, an attention's
``capabilities``) are checked to be true, and what they declare absent is skipped with the component's reason.
A plugin may give its own reference kernel (``ConformanceSuite(reference=...)``). A check raises
:class:`ConformanceError` (an ``AssertionError``) saying what broke, or :class:`ConformanceSkip` with the
reason it does not apply (e.g. a backend that does not claim causal support is not run as a decoder).

Example (a plugin's own test module; see ``docs/plugins/testing-a-plugin.md``)::

    import pytest
    from bertblocks.registry import Registry
    from bertblocks.testing import ConformanceSuite

    import my_plugin

    registry = Registry(load_entry_points=False)
    registry.register(my_plugin)
    suite = ConformanceSuite(registry, options={("backend", "flash"): {"block": 64}})

    @pytest.mark.parametrize("case", suite.params(provider="my_plugin"))
    def test_conformance(case):
        case.run()

The package: :mod:`~bertblocks.testing.subject` (the component under test in its tiny model, and the errors),
:mod:`~bertblocks.testing.assertions` and :mod:`~bertblocks.testing.inputs` (what checks compare and feed),
``checks/<kind>.py`` (the checks of each component kind; ``checks/model.py`` those every kind gets, and
``checks/cache.py`` decoding through the KV cache) and :mod:`~bertblocks.testing.suite` (which checks apply to
which kinds, and the suite). This module exports what a plugin's tests use.

pytest is imported only inside :meth:`Case.run` (to turn a skip into ``pytest.skip``) and
:meth:`ConformanceSuite.params`, so importing this package does not need it.
"""

from __future__ import annotations

from .subject import ATOL, TINY_CONFIG, ConformanceError, ConformanceSkip, Subject
from .suite import CACHE_KINDS, CHECKS, MODEL_KINDS, PATHS, Case, Check, ConformanceSuite, run_check

__all__ = [
    "ATOL",
    "CACHE_KINDS",
    "CHECKS",
    "MODEL_KINDS",
    "PATHS",
    "TINY_CONFIG",
    "Case",
    "Check",
    "ConformanceError",
    "ConformanceSkip",
    "ConformanceSuite",
    "Subject",
    "run_check",
]
