"""The registry: look-up and listing, in-process plugins used end to end, plugin options, and every way a
plugin can be wrong (duplicate names, garbage from a hook, missing capabilities, wrong factory output)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

import bertblocks
from bertblocks import load_config
from bertblocks.config import ConfigError
from bertblocks.core.component import KINDS, Component
from bertblocks.core.interfaces import AttentionBackend, BackendCapabilities
from bertblocks.registry import (
    DISABLE_AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
    BuildError,
    DuplicateComponentError,
    PluginLoadError,
    Registry,
    RegistryError,
    UnknownComponentError,
    get_registry,
    hookimpl,
    set_registry,
)
from bertblocks.registry import manager as manager_module
from tests.conftest import TINY, batch, max_diff
from tests.tolerances import assert_close


# ------------------------------------------------------------------------------ an in-process plugin
class ScaledSdpaOptions(BaseModel):
    """Options of the test backend; ``extra="forbid"`` so a typo is an error, as for built-ins."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, gt=0, description="divides the softmax scale")


class ScaledSdpa(AttentionBackend):
    """PyTorch's SDPA with a temperature: at 1.0 it must give exactly the built-in sdpa's numbers."""

    name = "scaled_sdpa"
    capabilities = BackendCapabilities(additive_mask=True)

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.calls = 0

    def __call__(self, query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):
        self.calls += 1
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale / self.temperature
        )
        return out, None


class NoMaskBackend(ScaledSdpa):
    """A kernel that cannot take an additive mask (a flash-style kernel without bias support)."""

    name = "no_mask"
    capabilities = BackendCapabilities(additive_mask=False)


class ThirdPartyPlugin:
    """What a third-party package would expose through its entry point; registered in-process here."""

    def bertblocks_register_components(self) -> list[Component]:
        return [
            Component(
                "backend",
                "scaled_sdpa",
                lambda *, options: ScaledSdpa(options.temperature),
                ScaledSdpaOptions,
                "SDPA with a temperature",
            ),
            Component("backend", "no_mask", lambda *, options: NoMaskBackend(1.0), description="no additive mask"),
            Component("backend", "not_a_backend", lambda *, options: "a string", description="broken factory"),
        ]


def _registry(*plugins: object) -> Registry:
    reg = Registry(load_entry_points=False)
    for i, plugin in enumerate(plugins):
        reg.register(plugin, name=f"test-plugin-{i}")
    return reg


def _tiny(backend: object = "sdpa", position: str = "absolute") -> dict:
    data = copy.deepcopy(TINY)
    data["encoder"]["attention"]["backend"] = backend
    data["position"] = position
    return data


# ----------------------------------------------------------------------------------------- look-up
def test_lookup_by_kind_and_name():
    reg = _registry()
    component = reg.get("backend", "sdpa")
    assert (component.kind, component.name) == ("backend", "sdpa")
    assert component.provider == "bertblocks.plugins.backends (bertblocks)"
    assert reg.get("position", "relative_key").name == "relative_key"


def test_unknown_name_lists_the_kind_and_the_closest():
    reg = _registry()
    with pytest.raises(UnknownComponentError) as info:
        reg.get("position", "relative_kye")
    assert str(info.value) == (
        "unknown position 'relative_kye'; available: absolute, disentangled, none, relative_bucket, "
        "relative_key, relative_key_query, rope, symmetric_alibi (did you mean 'relative_key'?)"
    )
    with pytest.raises(UnknownComponentError, match=r"available: eager, sdpa, sliding_window$"):
        reg.get("backend", "flash")  # nothing close: no hint


def test_unknown_kind_lists_the_kinds():
    with pytest.raises(RegistryError, match="unknown component kind 'backends'; kinds: embedding, position"):
        _registry().get("backends", "sdpa")


def test_listing_components_and_plugins():
    reg = _registry(ThirdPartyPlugin())
    backends = reg.components("backend")
    assert [c.name for c in backends] == ["eager", "no_mask", "not_a_backend", "scaled_sdpa", "sdpa", "sliding_window"]
    assert {c.provider for c in backends} == {"bertblocks.plugins.backends (bertblocks)", "test-plugin-0"}
    everything = reg.components()
    assert [KINDS.index(c.kind) for c in everything] == sorted(KINDS.index(c.kind) for c in everything)
    for kind in ("embedding", "position", "attention", "backend", "feedforward", "activation", "pooler"):
        assert any(c.kind == kind for c in everything), kind
    assert all(c.description for c in everything)

    plugins = {p.name: p for p in reg.plugins()}
    builtin = plugins["bertblocks.plugins.backends"]
    assert builtin.distribution == "bertblocks"
    assert builtin.version  # the installed version, or "0+unknown" from a bare checkout
    assert "bertblocks_register_components" in builtin.hooks
    ours = plugins["test-plugin-0"]
    assert (ours.distribution, ours.version) == ("(in-process)", "")
    assert ours.hooks == ("bertblocks_register_components",)


def test_the_process_registry_is_built_lazily_and_replaceable():
    set_registry(None)
    assert manager_module._default is None  # importing bertblocks built nothing
    first = get_registry()
    assert get_registry() is first
    mine = _registry(ThirdPartyPlugin())
    set_registry(mine)
    try:
        # the public API (no registry argument) now sees the in-process plugin
        assert load_config(_tiny("scaled_sdpa")).encoder.attention.backend.name == "scaled_sdpa"
    finally:
        set_registry(None)


# ---------------------------------------------------------------------------- a plugin used end to end
def test_in_process_backend_through_a_config_gives_sdpa_numbers(hf_checkpoint):
    reg = _registry(ThirdPartyPlugin())
    directory = hf_checkpoint()
    # padded: packed, the built-in sdpa would take its varlen kernel, which the plugin does not declare
    padded = "encoder.packing=never"
    reference = bertblocks.from_pretrained(directory, [padded], registry=reg).eval()
    ours = bertblocks.from_pretrained(directory, [padded, "encoder.attention.backend=scaled_sdpa"], registry=reg).eval()
    warmer = bertblocks.from_pretrained(
        directory,
        {"encoder.packing": "never", "encoder.attention.backend": {"name": "scaled_sdpa", "temperature": 2.0}},
        registry=reg,
    ).eval()
    backend = ours.encoder.layer[0].attention.backend
    assert isinstance(backend, ScaledSdpa)
    assert ours.config.encoder.attention.backend.model_dump() == {"name": "scaled_sdpa", "temperature": 1.0}
    inputs = batch()
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        assert_close(ours(**inputs).last_hidden_state, expected)
        # the option reached the factory: another temperature, other numbers
        assert max_diff(warmer(**inputs).last_hidden_state, expected) > 1e-3
    assert backend.calls == 1


def test_plugin_options_are_validated_with_the_builtins_error_format():
    reg = _registry(ThirdPartyPlugin())
    with pytest.raises(ConfigError) as info:
        load_config(_tiny({"name": "scaled_sdpa", "temprature": 2.0}), registry=reg)
    assert [str(i) for i in info.value.issues] == [
        "encoder.attention.backend.temprature: unknown field; allowed fields: name, temperature "
        "(did you mean 'temperature'?)"
    ]
    with pytest.raises(ConfigError) as info:
        load_config(_tiny({"name": "scaled_sdpa", "temperature": -1}), registry=reg)
    assert [str(i) for i in info.value.issues] == [
        "encoder.attention.backend.temperature: Input should be greater than 0"
    ]
    # the same option on a per-layer override is checked at the override's path
    data = _tiny()
    data["encoder"]["overrides"] = [
        {"layers": 1, "attention": {"backend": {"name": "scaled_sdpa", "temperature": "hot"}}}
    ]
    with pytest.raises(ConfigError) as info:
        load_config(data, registry=reg)
    assert [i.loc for i in info.value.issues] == ["encoder.overrides.0.attention.backend.temperature"]


def test_validated_config_shows_the_plugins_defaults():
    reg = _registry(ThirdPartyPlugin())
    config = load_config(_tiny("scaled_sdpa"), registry=reg)
    assert config.encoder.attention.backend.options() == {"temperature": 1.0}


def test_a_plugin_may_use_the_hookimpl_marker_and_be_a_module_like_object():
    marked = SimpleNamespace(
        bertblocks_register_components=hookimpl(
            lambda: [Component("activation", "double", lambda *, options: torch.nn.Identity(), description="x")]
        ),
        __name__="marked_plugin",
    )
    reg = Registry(load_entry_points=False)
    reg.register(marked)
    assert reg.get("activation", "double").provider == "marked_plugin"


# ------------------------------------------------------------------------------------ wrong plugins
def test_duplicate_component_names_both_providers():
    class Clash:
        def bertblocks_register_components(self) -> list[Component]:
            return [Component("backend", "sdpa", lambda *, options: ScaledSdpa(1.0), description="imposter")]

    reg = _registry(Clash())
    assert reg.get("backend", "eager").name == "eager"  # a clash is an error only where the name is used
    assert [c.description for c in reg.components("backend") if c.name == "sdpa"][1] == "imposter"  # both listed
    with pytest.raises(DuplicateComponentError) as info:
        reg.get("backend", "sdpa")
    message = str(info.value)
    assert (
        message
        == "backend 'sdpa' is registered twice: by bertblocks.plugins.backends (bertblocks) and by test-plugin-0"
    )


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        ("not a list", "must return a list of Component"),
        ([42], "returned 42, not a Component"),
        ([Component("widget", "w", lambda: None)], "has unknown kind 'widget'"),  # type: ignore[arg-type]
        ([Component("backend", "w", lambda: None, options=dict)], "options must be a pydantic model class"),  # type: ignore[arg-type]
    ],
)
def test_a_hook_returning_garbage_is_recorded_and_strict_raises(returned: object, expected: str):
    garbage = SimpleNamespace(bertblocks_register_components=lambda: returned)
    reg = _registry(garbage)
    # the other plugins keep working
    assert reg.get("backend", "sdpa").name == "sdpa"
    assert len(reg.load_errors) == 1
    error = reg.load_errors[0]
    assert isinstance(error, PluginLoadError)
    assert error.plugin == "test-plugin-0"
    assert expected in str(error)
    assert "Traceback" in error.detail
    # a look-up that fails mentions the broken plugin, since the name may have come from it
    with pytest.raises(UnknownComponentError, match=r"plugins that failed to load .*test-plugin-0"):
        reg.get("backend", "flash")

    strict = Registry(load_entry_points=False, strict=True)
    strict.register(garbage, name="garbage")
    with pytest.raises(PluginLoadError, match=r'Error loading plugin "garbage"'):
        strict.get("backend", "sdpa")


def test_a_hook_that_raises_is_recorded_with_its_traceback():
    def boom() -> list[Component]:
        raise RuntimeError("plugin bug")

    reg = _registry(SimpleNamespace(bertblocks_register_components=boom))
    assert reg.get("backend", "eager").name == "eager"
    assert "RuntimeError: plugin bug" in reg.load_errors[0].detail
    assert reg.load_errors[0].summary() == "test-plugin-0 ((in-process)): RuntimeError: plugin bug"


def test_backend_without_additive_mask_is_refused_with_relative_positions():
    reg = _registry(ThirdPartyPlugin())
    with pytest.raises(BuildError) as info:
        bertblocks.create_model(_tiny("no_mask", "relative_key"), registry=reg)
    assert str(info.value).startswith(
        "encoder layer 0: backend 'no_mask' cannot take an additive score bias, which the 'relative_key' position "
        "scheme needs"
    )
    # refused on the layer that uses it, also when only an override chooses it
    data = _tiny("sdpa", "relative_key_query")
    data["encoder"]["overrides"] = [{"layers": 1, "attention": {"backend": "no_mask"}}]
    with pytest.raises(BuildError, match=r"^encoder layer 1: backend 'no_mask'"):
        bertblocks.create_model(data, registry=reg)
    # absolute positions need no score bias: the same backend is accepted
    model = bertblocks.create_model(_tiny("no_mask"), registry=reg).eval()
    assert isinstance(model.encoder.layer[0].attention.backend, NoMaskBackend)
    with torch.no_grad():
        assert model(input_ids=batch()["input_ids"]).last_hidden_state.shape == (3, 9, 32)
        # ... but a padded batch needs a mask it cannot take: a clear error, not silently unmasked attention
        with pytest.raises(ValueError, match="backend 'no_mask' takes no attention mask"):
            model(**batch())


def test_factory_returning_the_wrong_type_is_a_build_error():
    reg = _registry(ThirdPartyPlugin())
    with pytest.raises(BuildError) as info:
        bertblocks.create_model(_tiny("not_a_backend"), registry=reg)
    assert str(info.value) == (
        "encoder layer 0 backend: backend 'not_a_backend' from test-plugin-0 returned str, not a AttentionBackend "
        "as the backend contract requires (config: encoder.attention.backend)"
    )


# ------------------------------------------------------------------------------------- entry points
class _FakeDist:
    name = "bertblocks-fake"
    version = "9.9"


class _FakeEntryPoint:
    """Stands in for an installed package's entry point (real packaging is tested with the example plugin)."""

    dist = _FakeDist()

    def __init__(self, name: str, plugin: object | None) -> None:
        self.name, self.value, self._plugin = name, f"bertblocks_fake:{name}", plugin

    def load(self) -> object:
        if self._plugin is None:
            raise ImportError("No module named 'bertblocks_fake_missing_dep'")
        return self._plugin


@pytest.fixture
def fake_entry_points(monkeypatch: pytest.MonkeyPatch) -> list[_FakeEntryPoint]:
    points = [_FakeEntryPoint("fake", ThirdPartyPlugin()), _FakeEntryPoint("broken", None)]

    def entry_points(*, group: str) -> list[_FakeEntryPoint]:
        assert group == ENTRY_POINT_GROUP
        return points

    monkeypatch.setattr(manager_module.metadata, "entry_points", entry_points)
    return points


def test_entry_points_load_one_by_one_and_a_broken_one_is_named(fake_entry_points, monkeypatch):
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    reg = Registry()
    assert reg.get("backend", "scaled_sdpa").provider == "fake (bertblocks-fake)"
    assert {(p.name, p.distribution, p.version) for p in reg.plugins()} >= {("fake", "bertblocks-fake", "9.9")}
    (error,) = reg.load_errors
    assert error.plugin == "broken = bertblocks_fake:broken"
    assert error.distribution == "bertblocks-fake 9.9"
    assert "No module named 'bertblocks_fake_missing_dep'" in error.detail
    with pytest.raises(PluginLoadError, match='Error loading plugin "broken'):
        Registry(strict=True)


def test_disable_autoload_env_skips_entry_points_but_keeps_builtins(fake_entry_points, monkeypatch):
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    reg = Registry()
    assert reg.load_errors == []
    assert "fake" not in {p.name for p in reg.plugins()}
    with pytest.raises(UnknownComponentError):
        reg.get("backend", "scaled_sdpa")
    assert reg.get("backend", "sdpa").name == "sdpa"
    # an explicit in-process registration still works with autoload disabled
    reg.register(ThirdPartyPlugin(), name="by-hand")
    assert reg.get("backend", "scaled_sdpa").provider == "by-hand"


# ------------------------------------------------------------------------- every built-in, timm-style
BUILTIN = Registry(load_entry_points=False)


@pytest.mark.parametrize(
    ("kind", "name"),
    [(c.kind, c.name) for c in BUILTIN.components() if c.kind in ("position", "backend", "activation", "pooler")],
)
def test_every_builtin_component_builds_and_runs(kind: str, name: str):
    overrides = {
        "position": {"position": name},
        "backend": {"encoder.attention.backend": name},
        "activation": {"encoder.feedforward.activation": name},
        "pooler": {"pooler": name},
    }[kind]
    model = bertblocks.create_model(TINY, overrides, registry=BUILTIN).eval()
    with torch.no_grad():
        out = model(**batch())
    assert out.last_hidden_state.shape == (3, 9, 32)
    assert torch.isfinite(out.last_hidden_state).all()
    assert out.pooler_output.shape == (3, 32)
