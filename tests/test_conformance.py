"""The conformance suite (``bertblocks.testing``) over every registered component, and proof that it catches
components that break their interface.

The cases are generated from the registry (built-ins plus every installed plugin, the example
``bertblocks-alibi`` included), so a new component is covered without touching this file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertblocks.config import ConfigError
from bertblocks.core.component import KINDS, Component
from bertblocks.core.interfaces import BackendCapabilities, Pooler, Positions
from bertblocks.core.masks import is_hidden
from bertblocks.plugins.attention import BertAttention, build_bert_attention
from bertblocks.plugins.backends import SdpaBackend
from bertblocks.plugins.embeddings import BertEmbeddings, build_bert_embeddings
from bertblocks.plugins.feedforward import BertIntermediate, build_bert_feedforward
from bertblocks.registry import DISABLE_AUTOLOAD_ENV, Registry, validate_config
from bertblocks.testing import CHECKS, ConformanceError, ConformanceSuite


def _installed_registry() -> Registry:
    """Built-ins and every installed plugin, whatever the environment says; a broken plugin fails loudly."""
    saved = os.environ.pop(DISABLE_AUTOLOAD_ENV, None)
    try:
        return Registry(strict=True)
    finally:
        if saved is not None:
            os.environ[DISABLE_AUTOLOAD_ENV] = saved


REGISTRY = _installed_registry()
BUILTIN_PLUGIN_NAMES = {p.name for p in REGISTRY.plugins() if p.distribution == "bertblocks"}
#: components that need other choices of the tiny config: the convbert and squeezebert families describe models with
#: their own components; grouped projections need an intermediate width their groups divide (37 is prime)
_GROUPED = {"encoder": {"feedforward": {"intermediate_size": 40}}}
CONFIGS = {
    ("family", "convbert"): {"encoder": {"attention": {"name": "convbert"}}},
    ("feedforward", "grouped_conv"): _GROUPED,
    ("family", "squeezebert"): {
        "encoder": {
            "attention": {"name": "grouped_conv"},
            "feedforward": {"name": "grouped_conv", "intermediate_size": 40},
        }
    },
}
SUITE = ConformanceSuite(REGISTRY, compile_backend="aot_eager", configs=CONFIGS)


#: the checks of a whole tiny model: they read the subject through its config only (``subject.model()``,
#: ``subject.decoder()``, the packing path), never through the component's name or factory
_MODEL_CHECK_MODULES = {
    "bertblocks.testing.checks.model",
    "bertblocks.testing.checks.cache",
    "bertblocks.testing.checks.masks",
}


def _model_key(case: Any) -> str | None:
    """What a model-level check of a backbone component runs on: its validated tiny config; ``None`` for a check that
    reads the component itself (or a head's or a family's, which are more than their config)."""
    subject = case.subject
    if case.check.run.__module__ not in _MODEL_CHECK_MODULES or subject.kind in ("head", "family"):
        return None
    config = validate_config(subject.config(), subject.registry).model_dump(mode="json")
    return f"{case.check.name}:{json.dumps(config, sort_keys=True, default=str)}"


def _one_case_per_model(params: list) -> list:
    """The suite's params with the model-level cases that build the same model merged into one, its id naming every
    component it stands for.

    Nine built-ins are BERT's defaults (embedding ``bert``, position ``absolute``, attention ``bert``, backend
    ``sdpa``, feed-forward ``bert``, activation ``gelu``, norm ``layernorm``, layer ``post_ln``, pooler
    ``first_token``): placed in the tiny config, each gives the default model, so each model-level check (compile
    included) ran nine times on one model. A check of a model depends on its config alone (the seed is fixed), so
    the merged case fails for every bug any of the nine would have; a component whose config differs in any field
    keeps its own case (the key is the validated config, so a changed default splits the group again)."""
    merged: dict[str, list[Any]] = {}
    out: list[Any] = []
    for param in params:
        key = _model_key(param.values[0])
        if key is None:
            out.append(param)
        elif key in merged:
            merged[key].append(param)
        else:
            merged[key] = [param]
            out.append(key)
    result = []
    for item in out:
        if not isinstance(item, str):
            result.append(item)
            continue
        group = merged[item]
        first = group[0]
        if len(group) == 1:
            result.append(first)
            continue
        case = first.values[0]
        names = "+".join(f"{p.values[0].subject.kind}-{p.values[0].subject.name}" for p in group)
        result.append(pytest.param(case, id=f"{names}-{case.check.name}", marks=first.marks))
    return result


@pytest.mark.parametrize("case", _one_case_per_model(SUITE.params(exclude=["compile"])))
def test_component_conforms(case):
    case.run()


def test_identical_models_are_checked_once_and_every_component_stays_named():
    """The merge drops no component: every case id of the suite is named in exactly one merged id, and only cases
    of the same check on the same validated config are merged (BERT's nine default components among them)."""
    params = SUITE.params()
    merged = _one_case_per_model(params)
    named = [part for p in merged for part in _parts(p.id)]
    assert sorted(named) == sorted(p.id for p in params)
    for p in merged:
        if "+" in p.id:
            cases = [q.values[0] for q in params if q.id in _parts(p.id)]
            assert len({_model_key(c) for c in cases}) == 1
    assert "embedding-bert+position-absolute+attention-bert+backend-sdpa+feedforward-bert+activation-gelu+" in "".join(
        p.id for p in merged
    )
    assert len(merged) < len(params)


def _parts(merged_id: str) -> list[str]:
    """The suite's case ids a (possibly merged) id stands for."""
    *components, check = merged_id.rsplit("-", 1)
    return [f"{component}-{check}" for component in "-".join(components).split("+")]


def _compile_params() -> list:
    # The built-in activations are torch-native element-wise modules, traced inside every other compiled model
    # through the default gelu; compiling each one separately would cost seconds and show nothing new.
    return _one_case_per_model(
        [
            p
            for p in SUITE.params(include=["compile"])
            if p.values[0].subject.kind != "activation"
            or p.values[0].subject.name == "gelu"
            or p.values[0].subject.component.provider.split(" ")[0] not in BUILTIN_PLUGIN_NAMES
        ]
    )


@pytest.mark.parametrize("case", _compile_params())
def test_component_compiles(case):
    """Components traced by torch.compile (aot_eager: dynamo and AOT autograd without C++ code generation)."""
    case.run()


@pytest.mark.compile
def test_sdpa_model_compiles_with_inductor():
    """One full inductor compile (code generation included), on the default backend."""
    (case,) = ConformanceSuite(REGISTRY).cases(kinds=["backend"], names=["sdpa"], include=["compile"])
    case.run()


def test_the_suite_covers_every_kind_and_the_example_plugin():
    cases = SUITE.cases()
    covered = {(c.subject.kind, c.subject.name) for c in cases}
    assert covered == {(c.kind, c.name) for c in REGISTRY.components()}
    assert {("position", "alibi"), ("backend", "local")} <= covered
    kinds_with_checks = {kind for check in CHECKS for kind in check.kinds}
    assert {c.kind for c in REGISTRY.components()} <= kinds_with_checks
    assert set(kinds_with_checks) <= set(KINDS)


def test_the_report_outside_pytest():
    report = SUITE.run(names=["local"], kinds=["backend"], exclude=["compile"])
    assert report["backend-local-eager_equivalence"] == "ok"
    broken = ConformanceSuite(_registry_with(_component("backend", "no_mask", lambda: NoMaskBackend())))
    report = broken.run(names=["no_mask"], include=["eager_equivalence", "causal"])
    assert report["backend-no_mask-eager_equivalence"].startswith("FAILED: ConformanceError: output vs eager (padding")
    assert report["backend-no_mask-causal"] == "skipped: the backend does not claim causal support"


# ---------------------------------------------------------------------- the suite catches broken components
class NoMaskBackend(SdpaBackend):
    """Forgets the mask (the bug of transformers #46132: a custom kernel silently dropping masking)."""

    name = "no_mask"
    capabilities = BackendCapabilities(additive_mask=True, attention_weights=False, causal=False, dropout=True)

    def __call__(self, query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):
        return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, scale=scale), None


class TopLeftCausalBackend(SdpaBackend):
    """Claims causal support but aligns the causal mask top-left, which is wrong when queries follow a cache."""

    def __call__(self, query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):
        if is_causal and mask is None:
            return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale), None
        return super().__call__(
            query, key, value, mask=mask, scale=scale, dropout_p=dropout_p, is_causal=is_causal, need_weights=False
        )


class AlwaysDropoutBackend(SdpaBackend):
    """Applies dropout even in eval mode (ignores ``dropout_p``)."""

    def __call__(self, query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):
        return super().__call__(
            query, key, value, mask=mask, scale=scale, dropout_p=0.1, is_causal=is_causal, need_weights=False
        )


class NoWeightsBackend(SdpaBackend):
    """Claims attention_weights but never returns them."""

    def __call__(self, query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):
        out, _ = super().__call__(
            query, key, value, mask=mask, scale=scale, dropout_p=dropout_p, is_causal=is_causal, need_weights=False
        )
        return out, None


class CompileOnlyBugBackend(SdpaBackend):
    """Gives other numbers when compiled (stands in for a kernel whose traced path differs)."""

    def __call__(self, query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):
        out, weights = super().__call__(
            query, key, value, mask=mask, scale=scale, dropout_p=dropout_p, is_causal=is_causal, need_weights=False
        )
        return (out * 1.5 if torch.compiler.is_compiling() else out), weights


class CrossSequenceVarlenBackend(SdpaBackend):
    """Claims varlen but attends over the whole packed batch, ignoring ``cu_seqlens`` (sequences see each other)."""

    def varlen(self, query, key, value, *, cu_seqlens, max_seqlen, scale, dropout_p):
        q, k, v = (x.transpose(0, 1)[None] for x in (query, key, value))  # [1, h, T, d]
        return F.scaled_dot_product_attention(q, k, v, scale=scale)[0].transpose(0, 1)


class BoolMaskAttention(BertAttention):
    """Hands its backend a boolean mask (True = attend, SDPA's convention) instead of the additive one; SDPA
    takes it, so the numbers are right, but a backend written to the contract adds it to its scores."""

    def _attend(self, query, key, value, mask, *args, **kwargs):
        if mask is not None:
            mask = ~is_hidden(mask)
        return super()._attend(query, key, value, mask, *args, **kwargs)


def _bool_mask_attention(**kwargs: Any) -> BoolMaskAttention:
    built = build_bert_attention(**kwargs)
    built.__class__ = BoolMaskAttention
    return built


class FinfoMinMaskAttention(BertAttention):
    """Hides keys at transformers' ``finfo.min`` instead of the mask's hidden value (``finfo.min / 2``): right on
    CPU, but CUDA's memory-efficient kernel scales it by log2(e) to ``-inf`` and gives a fully hidden row zeros."""

    def _attend(self, query, key, value, mask, *args, **kwargs):
        if mask is not None:
            mask = mask.masked_fill(is_hidden(mask), torch.finfo(mask.dtype).min)
        return super()._attend(query, key, value, mask, *args, **kwargs)


def _finfo_min_mask_attention(**kwargs: Any) -> FinfoMinMaskAttention:
    built = build_bert_attention(**kwargs)
    built.__class__ = FinfoMinMaskAttention
    return built


class TokenCountBranchIntermediate(BertIntermediate):
    """Stands in for code whose compilation needs the packed token count's value (ConvBERT's grouped matmul
    failed in inductor with ``GuardOnDataDependentSymNode Eq(u0, 1)``): raises what the compiler raises then."""

    def forward(self, hidden_states):
        if torch.compiler.is_compiling():
            from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

            raise GuardOnDataDependentSymNode(None, "Could not guard on data-dependent expression Eq(u0, 1)")
        return super().forward(hidden_states)


def _token_count_feedforward(**kwargs: Any) -> Any:
    ff = build_bert_feedforward(**kwargs)
    ff.intermediate.__class__ = TokenCountBranchIntermediate
    return ff


class CacheBlindScheme:
    """ALiBi-like bias that numbers queries from 0 even after a cache (the bug of transformers #19045)."""

    def __init__(self, max_positions: int) -> None:
        from bertblocks_alibi import AlibiOptions, AlibiPositions

        self.inner = AlibiPositions(max_positions, AlibiOptions())

    def make(self) -> Any:
        from bertblocks_alibi import AlibiBias

        class Blind(AlibiBias):
            def forward(self, query, key, positions):
                q = query.shape[2]
                restarted = Positions(torch.arange(q), positions.key, positions.distance_range)
                return super().forward(query, key, restarted)

        scheme = self.inner
        correct = scheme.attention_bias

        def attention_bias(num_heads: int, head_dim: int) -> Blind:
            return Blind(correct(num_heads, head_dim).slopes.tolist())

        scheme.attention_bias = attention_bias  # type: ignore[method-assign]
        return scheme


class MeanOverPadding(Pooler):
    """Averages padded positions too."""

    def forward(self, hidden_states, attention_mask=None):
        return hidden_states.mean(dim=1)


class UnusedParameterEmbeddings(BertEmbeddings):
    """Holds a parameter it never uses (breaks DDP, transformers PR #31899); see :func:`_embeddings`."""


class RestartingEmbeddings(BertEmbeddings):
    """Ignores ``past_length``: positions restart at 0 after a cache."""

    def forward(self, input_ids, token_type_ids, position_ids, inputs_embeds, past_length=0):
        return super().forward(input_ids, token_type_ids, position_ids, inputs_embeds, 0)


class CumulativeIntermediate(BertIntermediate):
    """Mixes positions (a running mean): not position-wise."""

    def forward(self, hidden_states):
        steps = torch.arange(1, hidden_states.shape[1] + 1, dtype=hidden_states.dtype)[None, :, None]
        return super().forward(hidden_states.cumsum(dim=1) / steps)


def _cumulative_feedforward(**kwargs: Any) -> Any:
    ff = build_bert_feedforward(**kwargs)
    ff.intermediate.__class__ = CumulativeIntermediate
    return ff


def _embeddings(cls: type[BertEmbeddings]) -> Any:
    def make(**kwargs: Any) -> BertEmbeddings:
        built = build_bert_embeddings(**kwargs)
        built.__class__ = cls
        if cls is UnusedParameterEmbeddings:
            built.unused = nn.Linear(2, 2)
        return built

    return make


def _component(kind: str, name: str, make: Any) -> Component:
    return Component(kind, name, lambda **kwargs: make(**kwargs) if kind != "backend" else make())  # type: ignore[arg-type]


def _registry_with(*components: Component) -> Registry:
    reg = Registry(load_entry_points=False)

    class Broken:
        @staticmethod
        def bertblocks_register_components() -> list[Component]:
            return list(components)

    reg.register(Broken(), name="broken-components")
    return reg


BROKEN: list[tuple[str, Component, list[str]]] = [
    ("mask ignored", _component("backend", "no_mask", NoMaskBackend), ["eager_equivalence", "batch_independence"]),
    (
        "causal aligned top-left",
        _component("backend", "top_left", TopLeftCausalBackend),
        ["causal", "cache_equivalence"],
    ),
    ("dropout in eval", _component("backend", "leaky", AlwaysDropoutBackend), ["determinism", "eager_equivalence"]),
    ("weights claimed", _component("backend", "no_weights", NoWeightsBackend), ["attention_weights"]),
    ("compiled differs", _component("backend", "compile_bug", CompileOnlyBugBackend), ["compile"]),
    (
        "positions restart after cache",
        _component(
            "position", "blind", lambda *, max_positions, model, options: CacheBlindScheme(max_positions).make()
        ),
        ["position_scheme", "cache_equivalence"],
    ),
    (
        "pooler reads padding",
        _component("pooler", "mean_all", lambda *, hidden_size, options: MeanOverPadding()),
        ["pooler", "batch_independence"],
    ),
    ("unused parameter", _component("embedding", "unused", _embeddings(UnusedParameterEmbeddings)), ["gradients"]),
    (
        "embedding ignores past_length",
        _component("embedding", "restart", _embeddings(RestartingEmbeddings)),
        ["embedding", "cache_equivalence"],
    ),
    (
        "feed-forward mixes positions",
        _component("feedforward", "mixing", _cumulative_feedforward),
        ["position_wise"],
    ),
    (
        "varlen across sequences",
        _component("backend", "cross_varlen", CrossSequenceVarlenBackend),
        ["varlen", "batch_independence"],
    ),
    ("boolean mask to the backend", _component("attention", "bool_mask", _bool_mask_attention), ["mask_contract"]),
    (
        "finfo.min mask to the backend",
        _component("attention", "finfo_min_mask", _finfo_min_mask_attention),
        ["mask_contract"],
    ),
    (
        "compiles only with the token count's value",
        _component("feedforward", "token_count", _token_count_feedforward),
        ["compile"],
    ),
    (
        "activation not element-wise",
        _component("activation", "softmax", lambda **_: nn.Softmax(dim=-1)),
        ["elementwise"],
    ),
]


def _broken_cases() -> list[Any]:
    params = []
    for label, component, checks in BROKEN:
        for check in checks:
            marks = [pytest.mark.compile] if check == "compile" else []
            params.append(pytest.param(component, check, id=f"{label}-{check}", marks=marks))
    return params


@pytest.mark.parametrize(("component", "check"), _broken_cases())
def test_the_suite_catches_a_broken_component(component, check):
    suite = ConformanceSuite(_registry_with(component), compile_backend="aot_eager")
    (case,) = suite.cases(kinds=[component.kind], names=[component.name], include=[check])
    with pytest.raises(ConformanceError):
        case.check.run(case.subject)


# ------------------------------------------------------------------------------- components that refuse decoders
def _refuses_decoders(config: Any, spec: Any, loc: str) -> list[str]:
    return ["an encoder-only component: is_decoder must be false"] if config.is_decoder else []


def _encoder_only(kind: str, name: str, validate: Any = _refuses_decoders) -> Component:
    """A built-in component under another name, whose validate hook refuses decoders (a bidirectional-only
    kernel, a scheme that cannot continue after a cache)."""
    builtin = Registry(load_entry_points=False).get(kind, name)
    return dataclasses.replace(builtin, name=f"encoder_only_{name}", aliases=(), validate=validate)


@pytest.mark.parametrize(
    ("kind", "name", "cache_checks"),
    [
        ("attention", "bert", ["cache_equivalence"]),
        ("position", "rope", ["cache_equivalence", "position_cache_chunks"]),
    ],
)
def test_an_encoder_only_component_passes_with_the_cache_checks_skipped(kind, name, cache_checks):
    component = _encoder_only(kind, name)
    report = ConformanceSuite(_registry_with(component)).run(kinds=[kind], names=[component.name], exclude=["compile"])
    prefix = f"{kind}-{component.name}-"
    for check in cache_checks:
        skipped = report.pop(prefix + check)
        assert skipped.startswith("skipped: refuses to be a decoder at validate:"), skipped
        assert "an encoder-only component: is_decoder must be false" in skipped  # the component's own reason
    assert len(report) >= 6  # the model-level checks (and the kind's own) ran
    assert set(report.values()) == {"ok"}, report


def test_a_component_refusing_its_encoder_config_too_fails_the_cache_check():
    """The skip is for a refusal of decoders only: a config the component refuses anyway is its failure."""
    component = _encoder_only("attention", "bert", validate=lambda config, spec, loc: ["refuses everything"])
    suite = ConformanceSuite(_registry_with(component))
    (case,) = suite.cases(kinds=["attention"], names=[component.name], include=["cache_equivalence"])
    with pytest.raises(ConfigError, match="refuses everything"):
        case.check.run(case.subject)


def test_a_broken_component_fails_on_the_path_that_breaks_it():
    """A varlen kernel that lets sequences see each other is only used on the packed path: the failure says so."""
    from bertblocks.testing.suite import run_check

    suite = ConformanceSuite(_registry_with(_component("backend", "cross_varlen", CrossSequenceVarlenBackend)))
    (case,) = suite.cases(kinds=["backend"], names=["cross_varlen"], include=["batch_independence"])
    with pytest.raises(ConformanceError, match=r"^on the packed path \(encoder.packing: always\): example 0 alone"):
        run_check(case.check, case.subject)


@pytest.mark.compile
def test_a_data_dependent_size_under_compile_is_named_with_the_fix():
    suite = ConformanceSuite(
        _registry_with(_component("feedforward", "token_count", _token_count_feedforward)), compile_backend="aot_eager"
    )
    (case,) = suite.cases(kinds=["feedforward"], names=["token_count"], include=["compile"])
    with pytest.raises(ConformanceError) as failure:
        case.check.run(case.subject)
    message = str(failure.value)
    assert "on the packed path: the component needs the value of a data-dependent size" in message
    assert "Fix: write the computation for every T without branching on it" in message
    assert "Eq(u0, 1)" in message  # the compiler's own line
