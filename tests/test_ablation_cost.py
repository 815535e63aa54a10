"""Cost beside quality: training throughput in the run records, the Pareto front, and its plot."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from test_ablation import write_study

from bertblocks.ablation import load_study, run_study
from bertblocks.ablation.data import get_tokenizer, load_texts, prepare
from bertblocks.ablation.pareto import (
    ParetoError,
    downstream_qualities,
    lower_is_better,
    main,
    pareto_front,
    pareto_points,
    write_pareto_plot,
)
from bertblocks.ablation.study import TrainSpec, expand_variants
from bertblocks.ablation.training import task_model, train_model

PNG = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------ the front
def test_front_of_a_known_set():
    # (cost, loss): a staircase a-b-c, d and e dominated, f equal to b (both stay), g not finite
    costs = [1.0, 2.0, 4.0, 3.0, 2.0, 2.0, math.nan]
    losses = [5.0, 3.0, 1.0, 3.5, 4.0, 3.0, 0.0]
    assert pareto_front(costs, losses) == [True, True, True, False, False, True, False]


def test_front_follows_the_direction_of_each_axis():
    costs = [1.0, 2.0, 3.0]
    accuracy = [0.5, 0.7, 0.6]  # higher is better: c (dearer, worse than b) is dominated
    assert pareto_front(costs, accuracy, lower_quality=False) == [True, True, False]
    assert pareto_front(costs, accuracy, lower_quality=True) == [True, False, False]  # as if it were a loss
    throughput = [100.0, 300.0, 200.0]  # higher is better on the cost axis too
    assert pareto_front(throughput, accuracy, lower_cost=False, lower_quality=False) == [False, True, False]
    # negating an axis and flipping its direction is the same front
    negated = [-a for a in accuracy]
    assert pareto_front(costs, negated) == pareto_front(costs, accuracy, lower_quality=False)


def test_every_point_off_a_random_front_is_dominated_by_one_on_it():
    generator = torch.Generator().manual_seed(0)
    costs = torch.rand(200, generator=generator).tolist()
    losses = torch.rand(200, generator=generator).tolist()
    front = pareto_front(costs, losses)
    on = [(c, q) for c, q, f in zip(costs, losses, front, strict=True) if f]
    assert 1 <= len(on) < 200
    # on the front: strictly decreasing loss with increasing cost
    on.sort()
    assert all(a[1] > b[1] for a, b in itertools.pairwise(on))
    for c, q, f in zip(costs, losses, front, strict=True):
        if not f:
            assert any(oc <= c and oq <= q and (oc, oq) != (c, q) for oc, oq in on)


def test_direction_of_the_built_in_and_downstream_metrics():
    assert lower_is_better("eval_loss")
    assert lower_is_better("perplexity")
    assert lower_is_better("latency_ms")
    assert lower_is_better("flops_per_token")
    assert lower_is_better("params_used")
    assert not lower_is_better("accuracy")
    assert not lower_is_better("train_tokens_per_s")
    assert not lower_is_better("sst2_f1")  # a downstream score


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ParetoError, match="3 costs but 2 quality values"):
        pareto_front([1, 2, 3], [1, 2])


def _summary(name: str, **mean: float) -> dict:
    return {"variant": name, "mean": mean, "std": {}, "intervals": {"eval_loss": {"half_width": 0.1}}}


def test_points_skip_variants_without_the_metrics_and_keep_error_bars():
    variants = [
        _summary("a", flops_per_token=1.0, eval_loss=4.0),
        _summary("b", flops_per_token=2.0, eval_loss=3.0),
        _summary("costs-only", flops_per_token=0.5),
        _summary("c", flops_per_token=3.0, eval_loss=3.5),
    ]
    points = pareto_points(variants, "flops_per_token", "eval_loss")
    assert [(p.variant, p.on_front) for p in points] == [("a", True), ("b", True), ("c", False)]
    assert points[0].quality_err == 0.1
    assert points[0].cost_err == 0.0


def test_plot_needs_a_quality_metric_and_names_a_missing_one(tmp_path):
    costs_only = [_summary("a", flops_per_token=1.0), _summary("b", flops_per_token=2.0)]
    for v in costs_only:
        v["intervals"] = {}
    assert write_pareto_plot(tmp_path / "p.png", "t", costs_only) is False
    assert not (tmp_path / "p.png").exists()
    with pytest.raises(ParetoError, match=r"no variant has 'accuracy'; the results hold: flops_per_token"):
        write_pareto_plot(tmp_path / "p.png", "t", costs_only, quality="accuracy")


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # the IHDR chunk


def _with_downstream(name: str, flops: float, loss: float, acc: float, half: float | None) -> dict:
    summary = _summary(name, flops_per_token=flops, eval_loss=loss)
    interval = {"half_width": half} if half is not None else None
    summary["downstream"] = {
        "number/accuracy": {"mean": acc, "interval": interval},
        "number/f1": {"mean": acc - 0.01, "interval": interval},
        "sts/spearman": {"mean": acc / 2, "interval": interval},
    }
    return summary


def test_a_downstream_metric_is_a_higher_better_quality_with_its_interval_as_error_bar():
    variants = [
        _with_downstream("cheap-good", 1.0, 4.0, 0.9, 0.05),
        _with_downstream("dear-better", 2.0, 4.5, 0.95, None),  # an unknown interval: no error bar
        _with_downstream("dear-worse", 3.0, 3.0, 0.8, 0.02),  # best eval loss, worst accuracy
        _summary("no-downstream", flops_per_token=0.5, eval_loss=5.0),
    ]
    points = pareto_points(variants, "flops_per_token", "number/accuracy")
    # higher accuracy is better: the dearest variant is dominated on accuracy, though not on eval loss
    assert [(p.variant, p.quality, p.on_front) for p in points] == [
        ("cheap-good", 0.9, True),
        ("dear-better", 0.95, True),
        ("dear-worse", 0.8, False),
    ]
    assert [p.quality_err for p in points] == [0.05, 0.0, 0.02]
    # on eval loss the same variants make another front: dear-better is dominated, dear-worse is not
    on_loss = pareto_points(variants, "flops_per_token", "eval_loss")
    assert [p.on_front for p in on_loss] == [True, False, True, True]
    assert downstream_qualities(variants) == ["number/accuracy", "sts/spearman"]  # each task's first metric


def test_plot_adds_a_row_of_panels_per_downstream_task(tmp_path):
    plain = [_summary("a", flops_per_token=1.0, eval_loss=4.0), _summary("b", flops_per_token=2.0, eval_loss=3.0)]
    assert write_pareto_plot(tmp_path / "plain.png", "t", plain)
    width, height = _png_size(tmp_path / "plain.png")
    variants = [_with_downstream("a", 1.0, 4.0, 0.9, 0.05), _with_downstream("b", 2.0, 3.0, 0.8, 0.05)]
    assert write_pareto_plot(tmp_path / "ds.png", "t", variants)
    ds_width, ds_height = _png_size(tmp_path / "ds.png")  # eval loss, number, sts: three rows
    # (within a pixel: matplotlib versions round a figure's size in pixels differently)
    assert ds_width == width
    assert abs(ds_height - 3 * height) <= 1
    assert write_pareto_plot(tmp_path / "one.png", "t", variants, quality="number/accuracy")
    assert _png_size(tmp_path / "one.png") == (width, height)
    with pytest.raises(ParetoError, match=r"no variant has 'number/acc'; .*number/accuracy"):
        write_pareto_plot(tmp_path / "bad.png", "t", variants, quality=["eval_loss", "number/acc"])


def test_a_cost_equal_for_every_variant_gets_no_panel(tmp_path, monkeypatch):
    import bertblocks.ablation.pareto as pareto

    drawn: list[str] = []
    original = pareto._panel
    monkeypatch.setattr(
        pareto, "_panel", lambda ax, dicts, cost, *rest: drawn.append(cost) or original(ax, dicts, cost, *rest)
    )
    variants = [
        _summary("a", params=10.0, flops_per_token=1.0, eval_loss=4.0),
        _summary("b", params=10.0, flops_per_token=2.0, eval_loss=3.0),
    ]
    assert write_pareto_plot(tmp_path / "p.png", "t", variants)
    assert drawn == ["flops_per_token"]  # params is 10 for both: a panel that ranks nothing
    drawn.clear()
    assert write_pareto_plot(tmp_path / "q.png", "t", variants, costs=["params"]) is False
    assert drawn == []


def test_control_rows_are_drawn_as_lines_in_their_task_s_panels(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from bertblocks.ablation.downstream import ControlRow, DownstreamSummary

    lines: list[tuple[float, str]] = []
    original = Axes.axhline
    monkeypatch.setattr(Axes, "axhline", lambda ax, y, **kw: lines.append((y, kw["label"])) or original(ax, y, **kw))
    variants = [_with_downstream("a", 1.0, 4.0, 0.9, 0.05), _with_downstream("b", 2.0, 3.0, 0.8, 0.05)]
    row = ControlRow(
        "majority / mean", {"number/accuracy": DownstreamSummary("number", "accuracy", [0], 0.53, None)}, ""
    )
    assert write_pareto_plot(tmp_path / "p.png", "t", variants, controls=[row])
    assert lines == [(0.53, "majority / mean")]  # the number row's one panel; not the eval-loss or sts rows


def test_cli_prints_the_front_of_a_downstream_metric(tmp_path, capsys):
    variants = [_with_downstream("a", 1.0, 4.0, 0.9, 0.05), _with_downstream("b", 2.0, 3.0, 0.8, 0.05)]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"study": "s", "variants": variants}))
    args = [str(results), "--cost", "flops_per_token", "--quality", "eval_loss", "--quality", "number/accuracy"]
    assert main([*args, "--out", str(tmp_path / "p.png")]) == 0
    text = capsys.readouterr().out
    assert "eval_loss against flops_per_token:\n  front  a:" in text
    assert "  front  b: flops_per_token 2, eval_loss 3\n" in text
    # on accuracy, b (dearer and worse) is dominated by a
    assert "number/accuracy against flops_per_token:\n  front  a: flops_per_token 1, number/accuracy 0.9\n" in text
    assert "         b: flops_per_token 2, number/accuracy 0.8" in text
    assert _png_size(tmp_path / "p.png")[1] > 0


# ------------------------------------------------------------------------------- throughput in training
def test_tokens_per_second_is_the_real_tokens_of_the_steps_over_their_time(tmp_path):
    study = load_study(
        write_study(
            tmp_path, train={"task": "classification", "steps": 3, "batch_size": 4, "seq_len": 32, "seeds": [0]}
        )
    )
    texts, labels = load_texts(study)
    data = prepare(study, get_tokenizer(study, texts, saved=tmp_path / "tok.json"), texts, labels)
    assert data.train_mask.float().mean() < 1  # reviews are padded: real tokens differ from batch × length
    spec = TrainSpec.model_validate(study.spec.train.model_dump())
    extra = {"vocab_size": data.vocab_size, "pad_token_id": data.pad_id, "num_labels": 2, "id2label": None}
    config = expand_variants(study, {**extra, "label2id": None})[0].config
    torch.manual_seed(0)
    metrics = train_model(task_model("classification", config), data, spec, seed=0)
    # the rows the loop drew: the same generator, the same draws (rows, then nothing else for classification)
    generator = torch.Generator().manual_seed(0)
    expected = sum(
        int(data.train_mask[torch.randint(0, len(data.train_ids), (4,), generator=generator)].sum()) for _ in range(3)
    )
    assert metrics["train_tokens"] == expected < 3 * 4 * 32
    assert metrics["train_tokens_per_s"] == metrics["train_tokens"] / metrics["train_seconds"]


# ------------------------------------------------------------------------------------ a study end to end
@pytest.fixture(scope="module")
def trained_study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pareto")
    study = write_study(
        folder,
        train={"task": "mlm", "steps": 2, "batch_size": 4, "seq_len": 16, "seeds": [0], "eval_batches": 1},
    )
    out = folder / "out"
    return run_study(study, out, workers=0, progress=False, echo=None), out


def test_study_records_throughput_and_draws_the_pareto_plot(trained_study):
    result, out = trained_study
    for record in result.records:
        metrics = record["metrics"]
        assert metrics["train_tokens"] == 2 * 4 * 16  # mlm blocks are full: every position is a token
        assert metrics["train_tokens_per_s"] == metrics["train_tokens"] / metrics["train_seconds"]
    assert all("train_tokens_per_s" in s.mean for s in result.summaries)
    assert "train tok/s" in result.table
    assert (out / "results-pareto.png").read_bytes()[:8] == PNG
    data = json.loads((out / "results.json").read_text())
    assert all("train_tokens_per_s" in v["mean"] for v in data["variants"])


def test_cli_prints_the_front_from_results_json(trained_study, tmp_path, capsys):
    result, out = trained_study
    assert main([str(out / "results.json"), "--cost", "flops_per_token", "--out", str(tmp_path / "p.png")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("eval_loss against flops_per_token:")
    by_name = {s.variant: s.mean for s in result.summaries}
    front = pareto_front([m["flops_per_token"] for m in by_name.values()], [m["eval_loss"] for m in by_name.values()])
    for (name, _), on in zip(by_name.items(), front, strict=True):
        assert (f"  front  {name}:" in text) == on
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG


def test_cli_names_a_metric_the_results_do_not_hold(trained_study, capsys):
    _, out = trained_study
    assert main([str(out / "results.json"), "--quality", "f1"]) == 1
    assert "no variant has 'f1'; the results hold: " in capsys.readouterr().err


def _timed(variant: str, seed: int, latency: float, load: float) -> dict:
    return {
        "variant": variant,
        "seed": seed,
        "fingerprint": "x",
        "status": "ok",
        "metrics": {"params": 10.0, "flops_per_token": 1.0 if variant == "a" else 2.0, "latency_ms": latency},
        "load_average": [load, load],
        "cpus": 2,
    }


def test_timings_whose_spread_exceeds_their_differences_are_marked_and_left_off_the_front():
    from bertblocks.ablation.pareto import _costs_present
    from bertblocks.ablation.report import format_table, summarize, summary_dict

    # latency: 10 ± ~7 against 12 ± ~7 under a load of 5 on 2 CPUs: the spread swamps the difference
    noisy = [_timed("a", 0, 4.0, 5.0), _timed("a", 1, 16.0, 5.0), _timed("b", 0, 6.0, 5.0), _timed("b", 1, 18.0, 5.0)]
    summaries = summarize([("a", {}), ("b", {})], noisy)
    table = format_table("t", summaries)
    assert "latency ms ~" in table.splitlines()[1]
    assert "timings measured at a load average up to 5.0 on 2 CPUs" in table
    assert "latency ms (marked ~): the spread over seeds is at least the differences" in table
    assert "latency_ms" not in _costs_present([summary_dict(s) for s in summaries])
    assert summary_dict(summaries[0])["load_average"] == 5.0

    # the same difference measured quietly: a figure that ranks, kept
    quiet = [_timed("a", 0, 10.0, 0.5), _timed("a", 1, 10.2, 0.5), _timed("b", 0, 12.0, 0.5), _timed("b", 1, 12.1, 0.5)]
    summaries = summarize([("a", {}), ("b", {})], quiet)
    table = format_table("t", summaries)
    assert "~" not in table
    assert "load average" not in table
    assert "latency_ms" in _costs_present([summary_dict(s) for s in summaries])
