"""A third-party family written only from the docs: the code of "Writing a family" in
docs/plugins/writing-a-plugin.md, run as it stands, registered through the plugin API as a third party would, loads
and saves a BERT-shaped ``config.json`` through the public helper (:mod:`bertblocks.families.bertlike`), and its
checkpoints under its own prefix."""

from __future__ import annotations

import dataclasses
import json
import re
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.hf.weights import read_state_dict
from bertblocks.registry import Registry, set_registry

PAGE = Path(__file__).parents[2] / "docs" / "plugins" / "writing-a-plugin.md"
#: a BERT-shaped config.json of the docs' family: no type_vocab_size and no layer_norm_eps (the family's
#: defaults: 0 and 1e-6), a field bertblocks does not model (kept through the `hf` passthrough)
CONFIG_JSON: dict[str, Any] = {
    "model_type": "mybert",
    "architectures": ["MyBertForSequenceClassification"],
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "hidden_act": "gelu_new",
    "id2label": {"0": "a", "1": "b", "2": "c"},
    "label2id": {"a": 0, "b": 1, "c": 2},
    "add_pooling_layer": True,
    "summary_note": "kept for the round trip",
}


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text.split("\n## Writing a family\n", 1)[1].split("\n## ", 1)[0]


def _plugin() -> types.ModuleType:
    """The section's Python code as a module, as a plugin package would hold it."""
    blocks = re.findall(r"^```python\n(.*?)^```", _section(), flags=re.S | re.M)
    assert len(blocks) == 1, "the section shows one complete family"
    module = types.ModuleType("mybert_plugin")
    exec(compile(blocks[0], f"{PAGE.name}: Writing a family", "exec"), module.__dict__)
    return module


@pytest.fixture
def registry() -> Registry:
    """The built-ins and the docs' family, registered as an in-process plugin (conftest resets the registry)."""
    registry = Registry(load_entry_points=False)
    registry.register(_plugin(), name="mybert")
    set_registry(registry)
    return registry


def test_the_docs_family_uses_only_the_public_api():
    code = re.findall(r"^```python\n(.*?)^```", _section(), flags=re.S | re.M)[0]
    imported = re.findall(r"^from (bertblocks[\w.]*) import", code, flags=re.M)
    assert "bertblocks.families.bertlike" in imported
    assert not [name for name in imported if any(part.startswith("_") for part in name.split("."))]


def test_the_docs_family_loads_and_saves_a_bert_shaped_config_json(tmp_path, registry):
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(CONFIG_JSON))
    config = bertblocks.load_config(source / "config.json")
    assert config.family == "mybert"
    assert (config.hidden_size, config.encoder.num_layers, config.encoder.attention.num_heads) == (32, 2, 4)
    assert config.encoder.feedforward.intermediate_size == 37
    assert config.encoder.feedforward.activation == "gelu_new"
    assert (config.type_vocab_size, config.layer_norm_eps) == (0, 1e-6)  # the family's defaults
    assert config.head is not None
    assert config.head.name == "sequence_classification"  # from `architectures`
    assert config.num_labels == 3
    assert config.pooler is not None
    assert config.hf == {"summary_note": "kept for the round trip"}  # the passthrough, nothing else

    torch.manual_seed(0)
    model = bertblocks.create_model(config).eval()
    assert not any("token_type" in key for key in model.state_dict())  # type_vocab_size 0: no table
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        assert torch.equal(logits, model(input_ids=ids, token_type_ids=torch.ones_like(ids)).logits)  # ignored

    model.save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    for key, value in CONFIG_JSON.items():
        assert written[key] == value, key
    assert (written["type_vocab_size"], written["layer_norm_eps"], written["use_alibi"]) == (0, 1e-6, False)
    assert "position_embedding_type" not in written  # dropped: the family has no such field
    assert "bertblocks" not in written  # the family's own fields say everything
    keys = read_state_dict([tmp_path / "saved" / "model.safetensors"])
    assert "mybert.encoder.layer.1.attention.self.query.weight" in keys  # the family's prefix
    assert "classifier.weight" in keys

    again = bertblocks.from_pretrained(tmp_path / "saved", head="auto").eval()
    # the same config; saving records the weights' dtype in the passthrough, as transformers writes it
    assert again.config.hf == {**config.hf, "dtype": "float32", "torch_dtype": "float32"}
    assert {**again.config.model_dump(), "hf": {}} == {**config.model_dump(), "hf": {}}
    with torch.no_grad():  # the same modules and weights through the family's format
        assert torch.equal(again(input_ids=ids).logits, logits)


def test_a_backbone_without_pooler_round_trips(tmp_path, registry):
    hf = {**CONFIG_JSON, "architectures": ["MyBertModel"], "add_pooling_layer": False}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    config = bertblocks.load_config(tmp_path / "config.json")
    assert config.pooler is None
    assert config.head is None
    bertblocks.create_model(config).save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert (written["architectures"], written["add_pooling_layer"]) == (["MyBertModel"], False)
    assert not any(key.startswith("pooler.") for key in read_state_dict([tmp_path / "saved" / "model.safetensors"]))


def test_the_docs_family_passes_the_conformance_suite(registry):
    from bertblocks.testing import ConformanceSuite

    results = ConformanceSuite(registry).run(kinds=["family"], provider="mybert")
    assert results == {"family-mybert-family_round_trip": "ok"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_alibi": True}, r"mybert: use_alibi=true is not supported"),
        ({"bertblocks": {"position": {"name": "relative_key"}}}, r"position\.name.*requires 'absolute'"),
    ],
)
def test_what_the_docs_family_cannot_represent_is_an_error_naming_the_field(tmp_path, registry, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG_JSON, **change}))
    with pytest.raises(ConfigError, match=message):
        bertblocks.load_config(tmp_path / "config.json")


# ------------------------------------------------------------------- a plugin like ConvBERT and sigmoid attention
@pytest.fixture
def conv_registry() -> Registry:
    """The built-ins and :mod:`convmix_plugin` (a ConvBERT-like attention, a sigmoid backend, their family)."""
    from . import convmix_plugin

    registry = Registry(load_entry_points=False)
    registry.register(convmix_plugin, name="convmix-plugin")
    set_registry(registry)
    return registry


def _convmix_model(registry: Registry, *overrides: str) -> Any:
    from bertblocks.testing import TINY_CONFIG

    torch.manual_seed(0)
    return bertblocks.create_model(
        TINY_CONFIG, ["encoder.attention.name=convmix", *overrides], registry=registry
    ).eval()


def test_a_component_reading_padding_passes_the_suite_with_packing_on_auto(conv_registry):
    """No excluded check, no `packing: never`: the declaration turns automatic packing off, naming the component,
    and every check passes or skips with the component's own reason."""
    from bertblocks.testing import ConformanceSuite

    report = ConformanceSuite(conv_registry, compile_backend="aot_eager").run(
        kinds=["attention"], names=["convmix"], exclude=["compile"]
    )
    failed = {case: result for case, result in report.items() if not (result == "ok" or result.startswith("skipped"))}
    assert not failed, failed
    skipped = {case.rsplit("-", 1)[1]: result for case, result in report.items() if result.startswith("skipped")}
    assert set(skipped) == {"padding_mask", "batch_independence", "cache_equivalence"}, skipped
    assert "reads_padded_positions" in skipped["padding_mask"]
    assert "the convolution heads read every channel" in skipped["cache_equivalence"]  # its own reason
    for check in ("padding_declaration", "attention_module", "mask_contract", "determinism", "gradients"):
        assert report[f"attention-convmix-{check}"] == "ok"

    model = _convmix_model(conv_registry)
    assert model.config.encoder.packing == "auto"
    assert model.auto_packing_limit == 0
    assert "encoder.layer.0.attention (ConvMixAttention)" in model.packing_off_reason


def test_the_declaration_keeps_auto_from_packing_what_would_change_real_tokens(conv_registry):
    from bertblocks.testing.inputs import padded_batch

    batch = padded_batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        auto = _convmix_model(conv_registry)(**batch).last_hidden_state
        never = _convmix_model(conv_registry, "encoder.packing=never")(**batch).last_hidden_state
        always = _convmix_model(conv_registry, "encoder.packing=always")(**batch).last_hidden_state
    assert torch.equal(auto, never)  # the same path: auto did not pack
    assert (always[real] - never[real]).abs().max() > 1e-3  # packing would have changed real tokens


def _registry_with_variant(base: Registry, kind: str, name: str, new_name: str, cls: type) -> Registry:
    """A registry holding ``base``'s component ``(kind, name)`` as ``new_name``, its modules of class ``cls``."""
    component = base.get(kind, name)

    def make(**kwargs: Any) -> Any:
        built = component.factory(**kwargs)
        built.__class__ = cls
        return built

    variant = dataclasses.replace(component, name=new_name, provider="", factory=make, aliases=())
    registry = Registry(load_entry_points=False)
    registry.register(types.SimpleNamespace(bertblocks_register_components=lambda: [variant]), name=new_name)
    return registry


def test_an_undeclared_padding_reader_fails_the_suite_with_a_clear_message(conv_registry):
    from bertblocks.testing import ConformanceError, ConformanceSuite
    from bertblocks.testing.suite import run_check

    from .convmix_plugin import ConvMixAttention

    class Undeclared(ConvMixAttention):
        reads_padded_positions = False

    suite = ConformanceSuite(_registry_with_variant(conv_registry, "attention", "convmix", "undeclared", Undeclared))
    (declaration,) = suite.cases(kinds=["attention"], names=["undeclared"], include=["padding_declaration"])
    with pytest.raises(ConformanceError, match=r"packing changes the outputs at real tokens.*reads_padded_positions"):
        declaration.check.run(declaration.subject)
    (padding,) = suite.cases(kinds=["attention"], names=["undeclared"], include=["padding_mask"])
    # the path is named, and the message points at the declaration
    with pytest.raises(ConformanceError, match=r"^on the padded path \(encoder.packing: never\): outputs after ch"):
        run_check(padding.check, padding.subject)


def test_a_declaration_that_is_not_true_fails_the_suite(registry):
    """BERT's attention declared a padding reader: the packed and padded paths agree, so the declaration is false."""
    from bertblocks.plugins.attention import BertAttention
    from bertblocks.testing import ConformanceError, ConformanceSuite

    class Overcautious(BertAttention):
        reads_padded_positions = True

    suite = ConformanceSuite(_registry_with_variant(registry, "attention", "bert", "overcautious", Overcautious))
    (case,) = suite.cases(kinds=["attention"], names=["overcautious"], include=["padding_declaration"])
    with pytest.raises(ConformanceError, match="the declaration turns packing off for nothing"):
        case.check.run(case.subject)


@pytest.mark.parametrize(
    ("overrides", "call", "message"),
    [
        (["pruned_heads={0: [1]}"], None, r"pruned_heads\.0: encoder layer 0: attention 'convmix'.*cannot be pruned"),
        (["is_decoder=true"], None, r"use_cache: encoder layer 0.*cannot decode through a KV cache \(the convolution"),
    ],
)
def test_the_builder_refuses_a_config_needing_what_an_attention_declares_absent(
    conv_registry, overrides, call, message
):
    from bertblocks.registry import BuildError

    with pytest.raises(BuildError, match=message):
        _convmix_model(conv_registry, *overrides)


def test_calls_needing_what_an_attention_declares_absent_are_refused(conv_registry):
    from bertblocks.core.capabilities import CapabilityError
    from bertblocks.errors import BertBlocksError
    from bertblocks.testing.inputs import padded_batch

    model = _convmix_model(conv_registry)
    with pytest.raises(CapabilityError, match=r"encoder layer 0's attention ConvMixAttention declares that its heads"):
        model.prune_heads({0: [1]})
    assert issubclass(CapabilityError, BertBlocksError)
    out = model(**padded_batch(), output_attentions=True)  # "some": the softmax heads only
    assert [tuple(w.shape) for w in out.attentions] == [(3, 2, 9, 9)] * 2
    decoder = _convmix_model(conv_registry, "is_decoder=true", "use_cache=false")
    with pytest.raises(CapabilityError, match="use_cache: encoder layer 0's attention ConvMixAttention"):
        decoder(input_ids=torch.ones(1, 3, dtype=torch.long), use_cache=True)


def test_a_sigmoid_backend_passes_against_its_own_reference_with_no_exclusions(conv_registry):
    from bertblocks.testing import ConformanceSuite

    from .convmix_plugin import sigmoid_reference

    suite = ConformanceSuite(conv_registry, reference=sigmoid_reference, compile_backend="aot_eager")
    report = suite.run(kinds=["backend"], names=["sigmoid"], exclude=["compile"])
    assert (
        report.pop("backend-sigmoid-varlen")
        == "skipped: the backend does not claim varlen (packed batches are re-padded for it)"
    )
    assert set(report.values()) == {"ok"}, report
    assert {"eager_equivalence", "attention_weights", "causal", "dropout", "mask_contract", "cache_equivalence"} <= {
        case.rsplit("-", 1)[1] for case in report
    }
    # without its reference the suite compares with softmax attention, which it is not
    plain = ConformanceSuite(conv_registry).run(kinds=["backend"], names=["sigmoid"], include=["eager_equivalence"])
    assert plain["backend-sigmoid-eager_equivalence"].startswith("FAILED: ConformanceError: output vs eager")


def test_the_family_needing_its_own_component_passes_its_check_with_configs(conv_registry):
    from bertblocks.testing import ConformanceSuite

    suite = ConformanceSuite(
        conv_registry, configs={("family", "myconvbert"): {"encoder": {"attention": {"name": "convmix"}}}}
    )
    assert suite.run(kinds=["family"], names=["myconvbert"]) == {"family-myconvbert-family_round_trip": "ok"}
    bare = ConformanceSuite(conv_registry).run(kinds=["family"], names=["myconvbert"])
    assert "convmix attention" in bare["family-myconvbert-family_round_trip"]  # why configs= is needed


@pytest.mark.compile
def test_the_convmix_plugin_compiles(conv_registry):
    from bertblocks.testing import ConformanceSuite

    from .convmix_plugin import sigmoid_reference

    suite = ConformanceSuite(conv_registry, reference=sigmoid_reference, compile_backend="aot_eager")
    report = suite.run(names=["convmix", "sigmoid"], include=["compile"])
    assert set(report.values()) == {"ok"}, report
