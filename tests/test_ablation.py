"""Ablation studies: a tiny 3-variant x 2-seed study end to end (killed and resumed), Ray against local,
FLOPs formula against torch's counter, the corpus and tokenizer, and bad study files."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY

import bertblocks
from bertblocks.ablation import StudyError, load_study, run_study
from bertblocks.ablation.corpus import generate_labelled, generate_sentences
from bertblocks.ablation.data import train_tokenizer
from bertblocks.ablation.flops import analytic_flops_per_token, counted_flops

ROOT = Path(__file__).parents[1]
VARIANTS = ["position=absolute", "position=relative_key", "position=relative_key_query"]
SEEDS = [0, 1]


def write_study(folder: Path, **changes: object) -> Path:
    """A tiny study: hidden 32, 2 layers, 3 position schemes x 2 seeds, a few MLM steps."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    study = {
        "name": "tiny",
        "base": "tiny.yaml",
        "vary": {"position.name": ["absolute", "relative_key", "relative_key_query"]},
        "measure": {"batch": 2, "seq_len": 16, "repeats": 2, "warmup": 1},
        "train": {"task": "mlm", "steps": 4, "batch_size": 8, "seq_len": 32, "seeds": SEEDS, "eval_batches": 2},
        "corpus": {"sentences": 300},
        "tokenizer": {"vocab_size": 200},
        **changes,
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


# ------------------------------------------------------------------------------ end to end, kill, resume
def ablate_and_kill(study: Path, out: Path, watched: Path, seconds: float) -> None:
    """Run `bertblocks ablate study --out out` in a subprocess and SIGKILL it as soon as a record (``*.json``)
    appears in ``watched``; fails if the study ends first or nothing appears within ``seconds``."""
    env = {**os.environ, "BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "-m", "bertblocks.cli", "ablate", str(study), "--out", str(out), "--no-progress"]
    # its own session, so the kill reaches the worker process it spawns too
    proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + seconds
    try:
        while not list(watched.glob("*.json")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"no record in {watched.name}/ in time"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory):
    """Start `bertblocks ablate` in a subprocess, SIGKILL it once the first run is on disk, then resume."""
    folder = tmp_path_factory.mktemp("study")
    study = write_study(folder)
    out = folder / "out"
    runs = out / "runs"
    ablate_and_kill(study, out, runs, seconds=240)
    before = {p.name: p.stat().st_mtime_ns for p in runs.glob("*.json")}
    # resumed in this process (workers=0): the runs it adds must match the subprocess's worker bit for bit,
    # which the Ray comparison below checks run by run
    result = run_study(study, out, workers=0, progress=False, echo=None)
    return result, before, out


def test_study_of_3_variants_x_2_seeds_writes_table_csv_json_and_png(killed_then_resumed):
    result, _, out = killed_then_resumed
    assert [s.variant for s in result.summaries] == VARIANTS
    assert len(result.records) == 6
    for summary in result.summaries:
        assert summary.seeds == SEEDS
        # the seeds train differently, so quality has a spread; costs that do not depend on the seed have none
        assert summary.std["eval_loss"] > 0
        assert summary.std["params"] == summary.std["flops_per_token"] == 0
        assert 0 < summary.mean["eval_loss"] < 10
    by_name = {s.variant: s for s in result.summaries}
    # relative schemes drop the absolute table and add per-layer distance tables; FLOPs grow with the bias
    assert by_name["position=absolute"].mean["params"] != by_name["position=relative_key"].mean["params"]
    flops = [by_name[v].mean["flops_per_token"] for v in VARIANTS]
    assert flops[0] < flops[1] < flops[2]

    for variant in VARIANTS:
        assert variant in result.table
    assert "eval loss" in result.table
    assert "±" in result.table  # mean ± std over the two seeds

    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["variant"] for r in rows] == VARIANTS
    assert float(rows[0]["eval_loss"]) == pytest.approx(by_name[VARIANTS[0]].mean["eval_loss"])

    data = json.loads((out / "results.json").read_text())
    assert [v["variant"] for v in data["variants"]] == VARIANTS
    assert all(len(v["runs"]) == 2 for v in data["variants"])
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "tokenizer.json").is_file()
    assert (out / "study.yaml").is_file()


def test_killed_study_resumes_without_redoing_finished_runs(killed_then_resumed):
    result, before, out = killed_then_resumed
    assert 1 <= len(before) < 6, "the kill should have come between the first and the last run"
    assert sorted(result.reused) == sorted(name.removesuffix(".json") for name in before)
    assert len(result.executed) == 6 - len(before)
    assert not set(result.executed) & set(result.reused)
    for name, mtime in before.items():
        assert (out / "runs" / name).stat().st_mtime_ns == mtime  # not rewritten
    assert not list((out / "runs").glob(".*.tmp"))  # nothing half-written

    again = run_study(out / "study.yaml", out, workers=0, progress=False, echo=None)
    assert again.executed == []
    assert len(again.reused) == 6


def test_changed_study_reruns_only_changed_runs(tmp_path, killed_then_resumed):
    _, _, out = killed_then_resumed
    copy = tmp_path / "out"
    subprocess.run(["cp", "-r", str(out), str(copy)], check=True)
    study = yaml.safe_load((copy / "study.yaml").read_text())
    study["base"] = str(out.parent / "tiny.yaml")
    study["train"]["seeds"] = [0, 1, 2]  # one more seed: only the new runs are done
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(study))
    result = run_study(changed, copy, workers=0, progress=False, echo=None)
    assert sorted(result.executed) == sorted(f"{r.split('__')[0]}__seed2" for r in result.reused if "seed0" in r)
    assert len(result.reused) == 6


# ------------------------------------------------------------------------------------------------- Ray
@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    # a small object store: the study's tensors are tiny, and CI's /dev/shm may be too
    ray.init(num_cpus=2, object_store_memory=100 * 2**20, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_executor_gives_the_same_results_as_local(killed_then_resumed, ray_instance, tmp_path):
    local, _, _ = killed_then_resumed
    study = write_study(tmp_path / "study")
    ray_result = run_study(study, tmp_path / "ray-out", executor="ray", progress=False, echo=None)
    assert len(ray_result.executed) == 6
    deterministic = ["params", "flops_per_token", "flops_per_token_counted", "peak_mem_mib", "train_loss", "eval_loss"]
    by_run = {(r["variant"], r["seed"]): r["metrics"] for r in local.records}
    for record in ray_result.records:
        expected = by_run[(record["variant"], record["seed"])]
        for metric in deterministic:
            assert record["metrics"][metric] == expected[metric], (record["variant"], record["seed"], metric)


def test_unreachable_ray_address_fails_clearly_and_writes_nothing(tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    study = write_study(tmp_path / "study")
    out = tmp_path / "out"
    with pytest.raises(StudyError, match=rf"cannot reach the Ray cluster at 127\.0\.0\.1:{port}"):
        run_study(study, out, executor="ray", ray_address=f"127.0.0.1:{port}", progress=False, echo=None)
    assert not out.exists()


def test_cli_reports_an_unreachable_ray_address_with_exit_1(tmp_path, capsys):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from bertblocks import cli

    study = write_study(tmp_path / "study")
    out = tmp_path / "out"
    code = cli.main(["ablate", str(study), "--out", str(out), "--executor", "ray", "--ray-address", "127.0.0.1:1"])
    assert code == 1
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in capsys.readouterr().err
    assert not out.exists()


def test_missing_ray_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    study = write_study(tmp_path / "study")
    with pytest.raises(StudyError, match=r"pip install -e '\.\[ray\]' in the bertblocks checkout"):
        run_study(study, tmp_path / "out", executor="ray", progress=False, echo=None)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- bad input
def test_varied_key_that_does_not_exist_names_the_path_and_the_closest_key(tmp_path):
    study = write_study(tmp_path, vary={"encoder.atention.num_heads": [2, 4]})
    with pytest.raises(StudyError) as info:
        load_study(study)
    message = str(info.value)
    assert "vary.encoder.atention.num_heads: 'encoder.atention.num_heads' is not a key of the config" in message
    assert "did you mean 'encoder.attention.num_heads'?" in message
    assert str(study) in message


def test_misspelt_component_option_in_a_named_variant_is_located(tmp_path):
    study = write_study(tmp_path, vary={}, variants={"wide": {"encoder.feedforward.intermediat_size": 64}})
    with pytest.raises(StudyError, match=r"variants\.wide\.encoder\.feedforward\.intermediat_size: .*not a key") as e:
        load_study(study)
    assert "did you mean 'encoder.feedforward.intermediate_size'?" in str(e.value)


def test_value_the_component_rejects_gives_the_config_error(tmp_path):
    study = write_study(
        tmp_path,
        vary={"encoder.attention.num_heads": [4, 5], "encoder.attention.backend": ["sdpa", "flash9"]},
    )
    with pytest.raises(StudyError) as info:
        load_study(study)
    message = str(info.value)
    assert "vary.encoder.attention.num_heads: variant 'num_heads=5,backend=sdpa'" in message
    assert "encoder.attention.num_heads: must divide hidden_size 32" in message
    assert "vary.encoder.attention.backend: variant 'num_heads=4,backend=flash9'" in message
    assert "unknown backend 'flash9'; available: eager, sdpa" in message


def test_per_layer_override_in_a_variant_is_validated_and_applied(tmp_path):
    overrides = [{"layers": "0-1", "attention": {"backend": "eager"}}]
    study = write_study(tmp_path, vary={}, variants={"eager": {"encoder.overrides": overrides}, "base": {}})
    loaded = load_study(study)
    eager = {v.name: v for v in loaded.variants}["eager"].config
    assert eager.encoder.layer_specs(1)[0].backend.name == "eager"
    bad = write_study(tmp_path / "bad", vary={}, variants={"x": {"encoder.overrides": [{"layers": "0-5"}]}})
    with pytest.raises(StudyError, match=r"variants\.x\.encoder\.overrides: .*layers \[2, 3, 4, 5\] do not exist"):
        load_study(bad)


def test_study_without_variants_is_an_error(tmp_path):
    study = write_study(tmp_path, vary={})
    with pytest.raises(StudyError, match="the study has no variants: give `vary:`"):
        load_study(study)


def test_unknown_study_field_and_bad_values_are_located(tmp_path):
    study = write_study(tmp_path, measure={"batch": 0, "seq_len": 16, "metric": ["params"]})
    with pytest.raises(StudyError) as info:
        load_study(study)
    message = str(info.value)
    assert "measure.batch: Input should be greater than 0" in message
    assert "measure.metric: unknown field" in message
    assert "did you mean 'metrics'?" in message


def test_measure_shape_longer_than_the_positions_is_an_error(tmp_path):
    study = write_study(tmp_path, measure={"batch": 1, "seq_len": 65})
    with pytest.raises(StudyError, match=r"measure\.seq_len: 65 tokens exceed max_position_embeddings=64"):
        load_study(study)


def test_base_that_is_neither_file_nor_preset(tmp_path):
    study = write_study(tmp_path, base="no-such-base")
    with pytest.raises(StudyError, match="base: no config file 'no-such-base' next to the study, and unknown preset"):
        load_study(study)


def test_base_can_be_a_preset_and_set_overrides_the_study(tmp_path):
    study = write_study(tmp_path, base="bert-tiny-uncased")
    loaded = load_study(study, ["measure.batch=3", "train.seeds=[5]"])
    assert loaded.base_config.hidden_size == bertblocks.load_config("bert-tiny-uncased").hidden_size
    assert loaded.spec.measure.batch == 3
    assert loaded.seeds == [5]


def test_missing_corpus_file_is_reported_before_anything_is_written(tmp_path):
    study = write_study(tmp_path, corpus={"kind": "file", "path": "nowhere.txt"})
    with pytest.raises(StudyError, match=r"corpus.path: file not found: .*nowhere.txt"):
        run_study(study, tmp_path / "out", progress=False, echo=None)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------- example studies
@pytest.mark.parametrize(
    ("name", "variants"),
    [
        ("positions", VARIANTS),
        ("backends", ["eager", "sdpa", "eager-layer-0"]),
        ("alibi-plugin", ["absolute", "relative_key", "alibi", "alibi-local"]),
        ("evidence", ["bert", "pre_ln-swiglu-rmsnorm-rope"]),
    ],
)
def test_example_studies_validate_and_start_with_a_comment(name, variants, monkeypatch):
    path = ROOT / "examples" / "studies" / f"{name}.yaml"
    header = path.read_text().splitlines()[:3]
    assert header[0].startswith(f"# {name}: ")
    assert any(f"bertblocks ablate examples/studies/{name}.yaml" in line for line in path.read_text().splitlines())
    if name == "alibi-plugin":
        pytest.importorskip("bertblocks_alibi", reason="the example plugin is not installed")
        import bertblocks.registry as registry

        monkeypatch.delenv(registry.DISABLE_AUTOLOAD_ENV)  # this study needs the plugin's entry point
        registry.set_registry(None)
    study = load_study(path)
    assert [v.name for v in study.variants] == variants
    if name == "backends":
        layer0, layer1 = (study.variants[2].config.encoder.layer_specs(i)[0].backend.name for i in (0, 1))
        assert (layer0, layer1) == ("eager", "sdpa")


# ----------------------------------------------------------------------------------------------- FLOPs
@pytest.mark.parametrize(
    "position", ["absolute", "relative_key", "relative_key_query", "rope", "none", "relative_bucket"]
)
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_analytic_flops_match_torch_flop_counter(position, backend):
    """Both count matrix products only, as 2 x multiply-adds: they must agree exactly (tolerance 1e-9)."""
    # a layer with other heads and width: the formula must follow per-layer overrides (relative_bucket shares
    # one bias over all layers' heads, so its layers keep the heads)
    heads = {} if position == "relative_bucket" else {"attention": {"num_heads": 2}}
    overrides = {
        "position.name": position,
        "encoder.attention.backend": backend,
        "encoder.overrides": [{"layers": 1, **heads, "feedforward": {"intermediate_size": 20}}],
    }
    config = bertblocks.load_config(TINY, overrides)
    model = bertblocks.create_model(config)
    for batch, length in [(2, 16), (1, 7)]:
        counted = counted_flops(model, batch, length, config.vocab_size) / (batch * length)
        analytic = analytic_flops_per_token(config, length)
        assert analytic.note == ""
        assert analytic.per_token == pytest.approx(counted, rel=1e-9)


def test_analytic_flops_follow_pruned_heads_and_a_missing_pooler():
    config = bertblocks.load_config(TINY, {"pruned_heads": {0: [0, 1]}, "pooler": None})
    model = bertblocks.create_model(config)
    counted = counted_flops(model, 2, 16, config.vocab_size) / 32
    assert analytic_flops_per_token(config, 16).per_token == pytest.approx(counted, rel=1e-9)


# -------------------------------------------------------------------------------------- corpus, tokenizer
def test_generated_corpus_is_a_function_of_its_seed():
    assert generate_sentences(50, seed=3) == generate_sentences(50, seed=3)
    assert generate_sentences(50, seed=3) != generate_sentences(50, seed=4)
    labelled = generate_labelled(400, seed=0)
    assert {label for _, label in labelled} == {0, 1}
    # negation flips the label: the same adjective appears under both labels
    assert any(" not " in text and label == 1 for text, label in labelled)
    assert any(" not " not in text and label == 1 for text, label in labelled)


def test_frequency_tokenizer_is_reproducible_and_spells_unseen_words():
    texts = generate_sentences(300, seed=0)
    first, second = train_tokenizer(texts, 200), train_tokenizer(texts, 200)
    assert first.get_vocab() == second.get_vocab()
    assert first.token_to_id("[PAD]") == 0
    assert first.encode("the cats see a dog .", add_special_tokens=False).tokens == [
        "the",
        "cats",
        "see",
        "a",
        "dog",
        ".",
    ]
    # a word outside the vocabulary is spelt with the character pieces, not [UNK]
    assert first.encode("dogcat", add_special_tokens=False).tokens == ["dog", "##c", "##a", "##t"]
    with pytest.raises(ValueError, match="below the"):
        train_tokenizer(texts, 10)


def test_classification_study_trains_and_reports_accuracy(tmp_path):
    study = write_study(
        tmp_path,
        vary={},
        variants={"base": {}},
        train={"task": "classification", "steps": 3, "batch_size": 8, "seq_len": 16, "eval_batches": 1},
        corpus={"sentences": 120},
        measure={"batch": 1, "seq_len": 8, "metrics": ["params"]},
    )
    result = run_study(study, tmp_path / "out", workers=0, progress=False, echo=None)
    metrics = result.records[0]["metrics"]
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert "perplexity" not in metrics
    assert set(metrics) >= {"params", "train_loss", "eval_loss"}
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))


def test_cli_json_output_summarises_a_costs_only_study(tmp_path, capsys):
    from bertblocks import cli

    study = write_study(tmp_path, train=None, measure={"batch": 2, "seq_len": 16, "metrics": ["params", "flops"]})
    out = tmp_path / "out"
    assert cli.main(["--json", "ablate", str(study), "--out", str(out), "--workers", "0", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [v["variant"] for v in data["variants"]] == VARIANTS
    assert data["variants"][0]["seeds"] == [0]  # no training: one run per variant
    assert set(data["variants"][0]["mean"]) == {"params", "params_used", "flops_per_token", "flops_per_token_counted"}
    assert len(list((out / "runs").glob("*.json"))) == 3
    assert not (out / "tokenizer.json").exists()


def test_without_matplotlib_and_tqdm_the_study_still_runs_and_says_so(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("matplotlib", "tqdm") else real(name, *a)
    )
    study = write_study(
        tmp_path, train=None, vary={}, variants={"one": {}}, measure={"seq_len": 8, "metrics": ["params"]}
    )
    lines: list[str] = []
    run_study(study, tmp_path / "out", workers=0, echo=lines.append)
    assert not (tmp_path / "out" / "results.png").exists()
    assert (tmp_path / "out" / "results.csv").is_file()
    assert "no plot: matplotlib is not installed (pip install -e '.[ablation]' in the bertblocks checkout)" in lines
    assert "tiny: 1/1 runs" in capsys.readouterr().err  # the plain progress line instead of tqdm's bar
