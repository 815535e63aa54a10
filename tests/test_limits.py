"""Limits checked before any work: YAML alias bombs, huge layer ranges, models too big to build, non-finite
floats. Each bomb is run under tracemalloc with a generous cap on CPU time and memory: unbounded, the
billion-laughs file took 42 s and 3.7 GB, the layer range 1.1 GB."""

from __future__ import annotations

import random
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import TINY

import bertblocks
from bertblocks.ablation import StudyError, load_study
from bertblocks.cli import main
from bertblocks.config import BertConfig, ConfigError
from bertblocks.config.limits import (
    MAX_LABELS_ENV,
    MAX_LAYERS_ENV,
    MAX_PARAMETERS_ENV,
    LimitError,
    check_size,
    estimate_size,
)
from bertblocks.config.overrides import OVERRIDABLE
from bertblocks.readers.bounded_yaml import MAX_ALIAS_NODES_ENV, YAMLLimitError, load_yaml

CPU_SECONDS = 2.0
PEAK_BYTES = 200 * 2**20


def bounded(action: Callable[[], Any]) -> tuple[BaseException | None, float, int]:
    """Run ``action``; return what it raised, the CPU seconds it took and its peak traced memory."""
    tracemalloc.start()
    start = time.process_time()  # CPU time of this process: not inflated by other jobs on a shared machine
    error = None
    try:
        action()
    except Exception as e:
        error = e
    seconds = time.process_time() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return error, seconds, peak


def billion_laughs(top: str = "") -> str:
    """The classic file: nine levels, each a list of nine aliases of the one before (10^9 leaves)."""
    lines = [top, 'lol0: &lol0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        refs = ", ".join([f"*lol{level - 1}"] * 9)
        lines.append(f"lol{level}: &lol{level} [{refs}]")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------- YAML
def test_billion_laughs_config_is_refused_fast_with_a_clear_error(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    assert path.stat().st_size < 1024  # under a kilobyte
    error, seconds, peak = bounded(lambda: bertblocks.load_config(path))
    assert isinstance(error, ConfigError)
    assert str(path) in str(error)
    assert "refused YAML: aliases expand to more than 10,000 nodes" in str(error)
    assert MAX_ALIAS_NODES_ENV in str(error)
    assert (seconds < CPU_SECONDS, peak < PEAK_BYTES) == (True, True), (seconds, peak)


def test_billion_laughs_study_is_refused_fast(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(billion_laughs("base: bert-tiny-uncased"))
    error, seconds, peak = bounded(lambda: load_study(path))
    assert isinstance(error, StudyError)
    assert "aliases expand to more than" in str(error)
    assert (seconds < CPU_SECONDS, peak < PEAK_BYTES) == (True, True), (seconds, peak)


def test_billion_laughs_in_a_cli_override_is_refused():
    value = "[" + ", ".join(["*a"] * 9) + "]"
    nested = f"{{x: &a [1, 2, 3, 4, 5, 6, 7, 8, 9], y: {value}}}"
    assert load_yaml(nested)["y"][0] == list(range(1, 10))  # a few aliases are fine
    bomb = billion_laughs().replace("\n", ", ").strip(", ")
    error, seconds, peak = bounded(lambda: bertblocks.load_config(TINY, [f"hf={{{bomb}}}"]))
    assert isinstance(error, ConfigError)
    assert "aliases expand" in str(error)
    assert seconds < CPU_SECONDS
    assert peak < PEAK_BYTES


def test_anchors_that_share_a_few_options_still_load(tmp_path):
    path = tmp_path / "shared.yaml"
    path.write_text(
        "vocab_size: 99\nhidden_size: 32\n"
        "encoder:\n  num_layers: 2\n  attention: &attn {num_heads: 4, backend: eager}\n"
        "  overrides:\n    - layers: 1\n      attention: *attn\n"
    )
    cfg = bertblocks.load_config(path)
    assert cfg.encoder.overrides[0].attention == {"num_heads": 4, "backend": "eager"}


def test_a_recursive_alias_is_refused():
    with pytest.raises(YAMLLimitError, match="recursive alias") as info:
        load_yaml("a: &a [1, *a]")
    assert info.value.problem_mark is not None
    assert info.value.problem_mark.line == 0


def test_the_alias_limit_can_be_raised_and_switched_off(monkeypatch):
    text = billion_laughs().split("lol5:")[0]  # four levels of nine: 9^4 * 9 nodes from aliases
    with pytest.raises(YAMLLimitError):
        load_yaml(text)
    monkeypatch.setenv(MAX_ALIAS_NODES_ENV, "100000")
    assert len(load_yaml(text)["lol4"]) == 9
    monkeypatch.setenv(MAX_ALIAS_NODES_ENV, "0")
    assert len(load_yaml(text)["lol4"][0][0]) == 9


# ---------------------------------------------------------------------------------------- layer ranges
def test_a_huge_layer_range_is_a_short_error_without_expansion():
    data = {**TINY, "encoder": {**TINY["encoder"], "overrides": [{"layers": "0-10000000", "attention": "bert"}]}}
    error, seconds, peak = bounded(lambda: bertblocks.load_config(data))
    assert isinstance(error, ConfigError)
    # the message goes on to say what to change (end the range at the last layer, or leave its end open)
    assert "encoder.overrides.0.layers: layers 2-10000000 do not exist (num_layers is 2);" in str(error)
    assert len(str(error)) < 300
    assert (seconds < CPU_SECONDS, peak < 20 * 2**20) == (True, True), (seconds, peak)


def test_a_range_past_the_layer_limit_is_refused_even_with_as_many_layers():
    data = {
        **TINY,
        "encoder": {**TINY["encoder"], "num_layers": 10**8, "overrides": [{"layers": f"0-{10**8 - 1}"}]},
    }
    error, seconds, peak = bounded(lambda: bertblocks.load_config(data))
    assert isinstance(error, ConfigError)
    assert f"reaches layer {10**8 - 1}, but no stack may have more than 1024 layers ({MAX_LAYERS_ENV})" in str(error)
    assert seconds < CPU_SECONDS
    assert peak < 20 * 2**20


def test_small_ranges_outside_the_stack_still_list_the_layers():
    data = {**TINY, "encoder": {**TINY["encoder"], "overrides": [{"layers": "1-3,5", "attention": "bert"}]}}
    with pytest.raises(ConfigError, match=r"layers \[2, 3, 5\] do not exist \(num_layers is 2\)"):
        bertblocks.load_config(data)


# ----------------------------------------------------------------------------------------- model size
def test_a_million_layers_are_refused_before_anything_is_built():
    cfg = bertblocks.load_config({**TINY, "encoder": {**TINY["encoder"], "num_layers": 1_000_000}})
    error, seconds, peak = bounded(lambda: bertblocks.create_model(cfg))
    assert isinstance(error, LimitError)
    assert str(error).startswith("encoder.num_layers: 1000000 layers exceed the limit of 1024")
    assert f"{MAX_LAYERS_ENV}=1000000" in str(error)
    assert seconds < CPU_SECONDS
    assert peak < 20 * 2**20


def test_a_huge_hidden_size_is_refused_with_the_size_it_would_have():
    cfg = bertblocks.load_config({**TINY, "hidden_size": 1_000_000})
    estimate = estimate_size(cfg)
    with torch.device("meta"), pytest.raises(LimitError) as info:
        bertblocks.create_model(cfg)  # refused even on the meta device: the estimate comes first
    message = str(info.value)
    assert f"about {estimate.parameters:,} parameters" in message
    assert "TiB" in message
    assert "hidden_size 1000000" in message
    assert MAX_PARAMETERS_ENV in message


def test_the_parameter_limit_is_read_from_the_environment(monkeypatch):
    cfg = bertblocks.load_config(TINY)
    monkeypatch.setenv(MAX_PARAMETERS_ENV, "1e3")
    with pytest.raises(LimitError, match="above the limit of 1,000 parameters"):
        bertblocks.create_model(cfg)
    monkeypatch.setenv(MAX_PARAMETERS_ENV, "0")  # no limit
    assert check_size(bertblocks.load_config({**TINY, "hidden_size": 10**6})).parameters > 10**10
    monkeypatch.setenv(MAX_PARAMETERS_ENV, "lots")
    with pytest.raises(LimitError, match="is not a number"):
        bertblocks.create_model(cfg)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"pooler": None},
        {"add_cross_attention": True, "is_decoder": True},
        {"encoder": {**TINY["encoder"], "overrides": [{"layers": 1, "feedforward": {"intermediate_size": 64}}]}},
    ],
)
def test_the_size_estimate_is_exact_for_the_standard_layout(changes):
    cfg = bertblocks.load_config({**TINY, **changes})
    model = bertblocks.create_model(cfg)
    estimate = estimate_size(cfg)
    assert estimate.parameters == sum(p.numel() for p in model.parameters())
    assert estimate.bytes == 4 * estimate.parameters


# ------------------------------------------------------------------------------------ non-finite floats
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("layer_norm_eps", ".inf"),
        ("layer_norm_eps", ".nan"),
        ("initializer_range", ".inf"),
        ("hidden_dropout_prob", ".nan"),
        ("encoder.packing_threshold", ".nan"),
        ("encoder.attention.dropout", ".nan"),
    ],
)
def test_non_finite_floats_are_rejected(key, value):
    with pytest.raises(ConfigError, match=rf"{key}: Input should be"):
        bertblocks.load_config(TINY, [f"{key}={value}"])


def test_infinite_layer_norm_eps_in_a_yaml_file_is_rejected(tmp_path):
    path = tmp_path / "inf.yaml"
    path.write_text(yaml.safe_dump(TINY) + "layer_norm_eps: .inf\n")
    with pytest.raises(ConfigError, match="layer_norm_eps: Input should be a finite number"):
        bertblocks.load_config(path)


# ------------------------------------------------------------------------------------------ CLI exits
def test_cli_limits_are_user_errors(tmp_path: Path, capsys):
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    assert main(["validate", str(path)]) == 1
    assert "aliases expand" in capsys.readouterr().err
    assert main(["build", "bert-tiny-uncased", "--set", "encoder.num_layers=1000000"]) == 1
    err = capsys.readouterr().err
    assert "exceed the limit of 1024" in err
    assert "bug" not in err


@pytest.mark.parametrize("value", ["[eager", "{a: 1", "'open", "a: b: c"])
def test_cli_unreadable_set_value_exits_1_with_the_key(value, capsys):
    assert main(["validate", "bert-tiny-uncased", "--set", f"encoder.attention.backend={value}"]) == 1
    err = capsys.readouterr().err
    assert f"encoder.attention.backend: cannot read the value {value!r} as YAML" in err
    assert "bug" not in err


# ------------------------------------------------------------------ sizes read before the work they allocate
def test_a_billion_labels_are_refused_before_a_label_is_named(monkeypatch):
    error, seconds, peak = bounded(lambda: bertblocks.load_config({**TINY, "num_labels": 10**9}))
    assert isinstance(error, ConfigError)
    assert "num_labels: 1000000000 labels exceed the limit of 1,000,000" in str(error)
    assert f"{MAX_LABELS_ENV}=1000000000" in str(error)
    assert seconds < CPU_SECONDS
    assert peak < 20 * 2**20
    monkeypatch.setenv(MAX_LABELS_ENV, "3")
    with pytest.raises(ConfigError, match="num_labels: 4 labels exceed the limit of 3"):
        bertblocks.load_config({**TINY, "num_labels": 4})
    assert bertblocks.load_config({**TINY, "num_labels": 3}).id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    monkeypatch.setenv(MAX_LABELS_ENV, "0")  # no limit
    assert bertblocks.load_config({**TINY, "num_labels": 4}).num_labels == 4


def test_a_billion_modernbert_layers_are_refused_before_layer_types_are_spelt_out():
    hf = {"model_type": "modernbert", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 10**9}
    error, seconds, peak = bounded(lambda: bertblocks.load_config(hf))
    assert isinstance(error, ConfigError)
    assert "num_hidden_layers: 1000000000 layers exceed the limit of 1024" in str(error)
    assert f"{MAX_LAYERS_ENV}=1000000000" in str(error)
    assert seconds < CPU_SECONDS
    assert peak < 20 * 2**20


def test_a_billion_albert_layers_validate_at_once_and_are_refused_at_build():
    hf = {"model_type": "albert", "vocab_size": 99, "hidden_size": 32, "num_attention_heads": 4,
          "intermediate_size": 37, "num_hidden_layers": 10**9, "num_hidden_groups": 2}  # fmt: skip
    config = None

    def load() -> None:
        nonlocal config
        config = bertblocks.load_config(hf)

    error, seconds, peak = bounded(load)
    assert error is None  # the sharing check no longer walks a billion layers
    assert seconds < CPU_SECONDS
    assert peak < 20 * 2**20
    with pytest.raises(LimitError, match=r"encoder\.num_layers: 1000000000 layers exceed the limit of 1024"):
        bertblocks.create_model(config)
    # a difference inside a group is still found among a billion layers
    changed = {**hf, "bertblocks": {"encoder": {"overrides": [{"layers": 700_000_000, "attention": {"dropout": 0.3}}]}}}
    error, seconds, _ = bounded(lambda: bertblocks.load_config(changed))
    assert isinstance(error, ConfigError)
    assert "changes attention of layer 700000000 but not of layer 500000000" in str(error)
    assert seconds < CPU_SECONDS


def _first_difference_by_walking_every_layer(config: Any) -> tuple[int, int, str] | None:
    """The check as it was (every layer against the first of its group): the reference for the fast one."""
    enc = config.encoder
    first_of: dict[int, int] = {}
    for index in range(enc.num_layers):
        first = first_of.setdefault(enc.layer_group(index), index)
        if first == index:
            continue
        for key in OVERRIDABLE:
            base = config.position if key == "position" else None
            if enc.layer_spec(index, key, base) != enc.layer_spec(first, key, base):
                return index, first, key
    return None


def test_the_sharing_check_finds_the_difference_a_walk_over_every_layer_finds():
    rng = random.Random(0)
    changes = [{"attention": {"dropout": 0.3}}, {"feedforward": {"intermediate_size": 48}}, {"position": "rotary"}]
    for _ in range(300):
        num_layers = rng.randint(1, 9)
        overrides = [
            {"layers": sorted(rng.sample(range(num_layers), rng.randint(1, num_layers))), **rng.choice(changes)}
            for _ in range(rng.randint(0, 3))
        ]
        encoder = {**TINY["encoder"], "num_layers": num_layers, "overrides": overrides}
        encoder["num_layer_groups"] = rng.randint(1, num_layers)
        config = BertConfig.model_validate({**TINY, "encoder": encoder})
        want = _first_difference_by_walking_every_layer(config)
        got = config._sharing_issues()
        if want is None:
            assert got == [], (encoder, got)
        else:
            index, first, key = want
            assert len(got) == 1
            assert f"changes {key} of layer {index} but not of layer {first}," in got[0].msg, (encoder, got)


def test_a_factorized_embedding_is_counted_exactly_and_a_huge_one_refused():
    cfg = bertblocks.load_config({**TINY, "embedding": {"name": "bert", "embedding_size": 16}})
    assert estimate_size(cfg).parameters == sum(p.numel() for p in bertblocks.create_model(cfg).parameters())
    electra = bertblocks.load_config({"model_type": "electra", "embedding_size": 10**7})
    error, seconds, peak = bounded(lambda: bertblocks.create_model(electra))  # was a 26 GB allocation
    assert isinstance(error, LimitError)
    assert "embedding_size 10000000" in str(error)
    assert seconds < CPU_SECONDS
    assert peak < 20 * 2**20


def test_a_head_is_counted_in_the_estimate():
    cfg = bertblocks.load_config({**TINY, "head": "sequence_classification", "num_labels": 5})
    model = bertblocks.create_model(cfg)
    built = sum(p.numel() for p in model.parameters())
    estimate = estimate_size(cfg).parameters
    assert estimate > estimate_size(bertblocks.load_config(TINY)).parameters
    assert built <= estimate <= 1.1 * built  # an upper bound of the head's few weights, never far off


def test_a_study_grid_of_ten_billion_variants_is_refused_before_it_is_spelt_out(tmp_path, monkeypatch):
    path = tmp_path / "study.yaml"
    vary = {f"encoder.overrides.{i}.attention.dropout": [j / 100 for j in range(10)] for i in range(10)}
    path.write_text(yaml.safe_dump({"base": "bert-tiny-uncased", "vary": vary}))
    error, seconds, peak = bounded(lambda: load_study(path))
    assert isinstance(error, StudyError)
    assert "vary: the study would make 10,000,000,000 variants and 10,000,000,000 runs" in str(error)
    assert "above the limit of 10,000 runs; if you mean it, raise the limit with BERTBLOCKS_MAX_STUDY_RUNS=" in str(
        error
    )
    assert seconds < CPU_SECONDS
    assert peak < 20 * 2**20
    two = {"base": "bert-tiny-uncased", "vary": {"hidden_dropout_prob": [0.0, 0.1]}, "train": {"seeds": [0, 1]}}
    path.write_text(yaml.safe_dump(two))
    monkeypatch.setenv("BERTBLOCKS_MAX_STUDY_RUNS", "3")  # 2 variants x 2 seeds
    with pytest.raises(StudyError, match="2 variants and 4 runs, above the limit of 3 runs"):
        load_study(path)
    monkeypatch.setenv("BERTBLOCKS_MAX_STUDY_RUNS", "4")
    assert len(load_study(path).variants) == 2
