"""The suite: which checks apply to which component kinds (:data:`CHECKS`), one :class:`Case` per component and
check, and :class:`ConformanceSuite`, which generates the cases from a registry (as pytest params or as a report
outside pytest)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.component import KINDS
from ..registry import Registry, get_registry
from .checks.activation import check_activation
from .checks.attention import check_attention_module
from .checks.backend import (
    check_backend_attention_weights,
    check_backend_causal,
    check_backend_dropout,
    check_backend_eager_equivalence,
    check_backend_varlen,
)
from .checks.cache import check_cache_equivalence
from .checks.embedding import check_embedding
from .checks.family import check_family_round_trip
from .checks.feedforward import check_feedforward_position_wise
from .checks.masks import MASK_KINDS, check_mask_contract
from .checks.model import (
    check_batch_independence,
    check_checkpoint_roundtrip,
    check_compile,
    check_determinism,
    check_gradients,
    check_padding_declaration,
    check_padding_mask,
    check_shapes_and_dtypes,
)
from .checks.pooler import check_pooler
from .checks.position import (
    check_packed_positions,
    check_position_cache_chunks,
    check_position_scheme,
    check_rotary_shift_invariance,
)
from .inputs import BATCH_LENGTH
from .subject import ConformanceError, ConformanceSkip, Subject

#: the kinds placed in a tiny model: every built-in kind but ``family`` (a translation of config.json and
#: checkpoint keys, checked on its own)
MODEL_KINDS: tuple[str, ...] = tuple(kind for kind in KINDS if kind != "family")
#: the kinds that take part in decoding through the KV cache
CACHE_KINDS: tuple[str, ...] = ("embedding", "position", "attention", "backend", "feedforward", "norm", "layer")


@dataclass(frozen=True)
class Check:
    """One property and the kinds it applies to.

    Attributes:
        name: short id (``eager_equivalence``).
        kinds: component kinds it is run for.
        run: the check.
        slow: compiles (``torch.compile``); marked so that it can be deselected.
        paths: run on both the padded and the packed path (``encoder.packing`` ``never``, then ``always``; see
            :func:`run_check`), a failure naming the path.
    """

    name: str
    kinds: tuple[str, ...]
    run: Callable[[Subject], None]
    slow: bool = False
    paths: bool = False


#: the two paths a model-level check runs on: (name, ``encoder.packing``)
PATHS: tuple[tuple[str, str], ...] = (("padded", "never"), ("packed", "always"))


def run_check(check: Check, subject: Subject) -> None:
    """Run ``check`` on ``subject``: once, or (``check.paths``) on the padded and then the packed path.

    A failure says which path failed. A component that declares reading padded positions in the checks' batch
    (``reads_padded_positions``, or ``reads_padded_positions_above`` a length below the batch's) is run on the
    padded path only: ``encoder.packing: auto`` does not pack that batch (the ``padding_declaration`` check checks
    the declaration itself). A skip on both paths is one skip.

    Raises:
        ConformanceError: the check failed (on the path named in the message).
        ConformanceSkip: it does not apply.
    """
    if not check.paths:
        check.run(subject)
        return
    paths = PATHS if not (subject.kind != "head" and subject.padding_readers(BATCH_LENGTH)) else PATHS[:1]
    skips = []
    for path, packing in paths:
        try:
            check.run(subject.on(packing))
        except ConformanceSkip as skip:
            skips.append(f"{path} path: {skip}")
        except ConformanceError as error:
            raise ConformanceError(f"on the {path} path (encoder.packing: {packing}): {error}") from error
    if len(skips) == len(paths):
        reasons = {str(skip).split(": ", 1)[1] for skip in skips}
        raise ConformanceSkip(reasons.pop() if len(reasons) == 1 else "; ".join(skips))


CHECKS: tuple[Check, ...] = (
    Check("shapes_dtypes", MODEL_KINDS, check_shapes_and_dtypes, paths=True),
    Check("padding_mask", MODEL_KINDS, check_padding_mask, paths=True),
    Check("batch_independence", MODEL_KINDS, check_batch_independence, paths=True),
    Check("determinism", MODEL_KINDS, check_determinism, paths=True),
    Check("gradients", MODEL_KINDS, check_gradients, paths=True),
    Check("checkpoint_roundtrip", MODEL_KINDS, check_checkpoint_roundtrip, paths=True),
    Check("padding_declaration", MODEL_KINDS, check_padding_declaration),
    Check("mask_contract", MASK_KINDS, check_mask_contract),
    Check("cache_equivalence", CACHE_KINDS, check_cache_equivalence),
    Check("eager_equivalence", ("backend",), check_backend_eager_equivalence),
    Check("attention_weights", ("backend",), check_backend_attention_weights),
    Check("causal", ("backend",), check_backend_causal),
    Check("dropout", ("backend",), check_backend_dropout),
    Check("varlen", ("backend",), check_backend_varlen),
    Check("position_scheme", ("position",), check_position_scheme),
    Check("rotary_shift", ("position",), check_rotary_shift_invariance),
    Check("position_cache_chunks", ("position",), check_position_cache_chunks),
    Check("packed_positions", ("position",), check_packed_positions),
    Check("embedding", ("embedding",), check_embedding),
    Check("attention_module", ("attention",), check_attention_module),
    Check("position_wise", ("feedforward",), check_feedforward_position_wise),
    Check("elementwise", ("activation",), check_activation),
    Check("pooler", ("pooler",), check_pooler),
    Check("family_round_trip", ("family",), check_family_round_trip),
    Check("compile", MODEL_KINDS, check_compile, slow=True),
)


@dataclass(frozen=True)
class Case:
    """One check of one component: ``case.run()`` raises :class:`ConformanceError` if it fails."""

    subject: Subject
    check: Check

    @property
    def id(self) -> str:
        return f"{self.subject.kind}-{self.subject.name}-{self.check.name}"

    def run(self) -> None:
        """Run the check; under pytest a :class:`ConformanceSkip` becomes ``pytest.skip`` with its reason."""
        try:
            run_check(self.check, self.subject)
        except ConformanceSkip as skip:
            try:
                import pytest
            except ImportError:  # pragma: no cover - outside pytest the skip propagates
                raise skip from None
            pytest.skip(f"{self.id}: {skip}")


@dataclass
class ConformanceSuite:
    """Every applicable check for every registered component (or a selection).

    Args:
        registry: where the components come from (default: the process-wide registry).
        options: plugin options per ``(kind, name)`` for the tests; components not listed use their options
            model's defaults.
        checks: the checks to choose from (default: all of :data:`CHECKS`).
        compile_backend: the ``torch.compile`` backend of the compile check.
        configs: per ``(kind, name)``, the rest of the tiny config the component needs, merged over
            :data:`TINY_CONFIG` (nested keys merge): ``{("attention", "rotary"): {"position": "rope"}}``.
        reference: the plugin's own reference kernel for the numeric checks of its backends (``eager_equivalence``,
            ``attention_weights``, ``causal``, ``varlen``), called as a backend is (``reference(query, key,
            value, *, mask, scale, dropout_p, is_causal, need_weights) -> (output, weights | None)``): one for
            every backend under test, or a mapping per ``(kind, name)``. Default: the built-in ``eager`` kernel,
            softmax attention.
    """

    registry: Registry | None = None
    options: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    checks: tuple[Check, ...] = CHECKS
    compile_backend: str = "inductor"
    configs: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    reference: Callable[..., Any] | Mapping[tuple[str, str], Callable[..., Any]] | None = None

    def cases(
        self,
        kinds: Iterable[str] | None = None,
        names: Iterable[str] | None = None,
        provider: str | None = None,
        include: Iterable[str] | None = None,
        exclude: Iterable[str] = (),
    ) -> list[Case]:
        """The cases to run.

        Args:
            kinds: only components of these kinds.
            names: only components with these names.
            provider: only components whose provider (plugin name, with its distribution) contains this.
            include: only these check names; ``exclude``: not these.
        """
        reg = self.registry or get_registry()
        kinds = set(kinds) if kinds is not None else set(KINDS)
        names = set(names) if names is not None else None
        wanted = set(include) if include is not None else None
        out = []
        for component in reg.components():
            if component.kind not in kinds or (names is not None and component.name not in names):
                continue
            if provider is not None and provider not in component.provider:
                continue
            options = dict(self.options.get((component.kind, component.name), {}))
            base = dict(self.configs.get((component.kind, component.name), {}))
            reference = (
                self.reference.get((component.kind, component.name))
                if isinstance(self.reference, Mapping)
                else self.reference
            )
            subject = Subject(component, options, reg, self.compile_backend, base, reference)
            for check in self.checks:
                if component.kind not in check.kinds or check.name in exclude:
                    continue
                if wanted is not None and check.name not in wanted:
                    continue
                out.append(Case(subject, check))
        return out

    def params(self, *args: Any, slow_marks: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
        """:meth:`cases` as ``pytest.param`` s with readable ids; slow (compile) checks carry ``slow_marks``
        (default ``pytest.mark.compile``, which the project must register, or pass your own)."""
        import pytest

        marks = list(slow_marks) if slow_marks is not None else [pytest.mark.compile]
        return [
            pytest.param(case, id=case.id, marks=marks if case.check.slow else [])
            for case in self.cases(*args, **kwargs)
        ]

    def run(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        """Run the cases outside pytest; returns ``{case id: "ok" | "skipped: why" | "FAILED: what"}``."""
        report = {}
        for case in self.cases(*args, **kwargs):
            try:
                run_check(case.check, case.subject)
                report[case.id] = "ok"
            except ConformanceSkip as skip:
                report[case.id] = f"skipped: {skip}"
            except Exception as e:  # a crash is a failure too, reported with its type
                report[case.id] = f"FAILED: {type(e).__name__}: {e}"
        return report
