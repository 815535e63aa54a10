"""Data-parallel training of one variant: two local processes (gloo, CPU) must keep identical weights, with
DDP and with FSDP (sharded), and FSDP must train the same model as DDP."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_ablation import write_study
from tolerances import assert_close

from bertblocks.ablation import StudyError
from bertblocks.ablation.ddp import main, prepare_job, train_ddp
from bertblocks.ablation.study import TrainSpec
from bertblocks.ablation.training import task_model, train_and_evaluate
from bertblocks.config_files import load_config

VARIANT = "position=relative_key"  # relative: no unused parameter, which DDP would reject


def test_two_processes_keep_equal_weights_that_move_away_from_the_initial_ones(tmp_path):
    study = write_study(tmp_path / "study")
    out = tmp_path / "out"
    job = prepare_job(study, VARIANT, seed=0, out_dir=out, overrides=["train.steps=3"])
    job.save_weights = True
    record = train_ddp(job, world_size=2)

    weights = out / "ddp" / "weights"
    initial = [load_file(weights / f"rank{r}-initial.safetensors") for r in (0, 1)]
    final = [load_file(weights / f"rank{r}-final.safetensors") for r in (0, 1)]
    assert set(final[0]) == set(final[1]) == set(initial[0])
    for name in final[0]:
        assert torch.equal(initial[0][name], initial[1][name]), name  # DDP started both from rank 0's weights
        assert torch.equal(final[0][name], final[1][name]), name  # same averaged gradient, same step
    moved = [name for name in final[0] if not torch.equal(final[0][name], initial[0][name])]
    assert "bert.encoder.layer.0.attention.self.distance_embedding.weight" in moved
    assert len(moved) == len(final[0])  # every parameter trained (no unused one)

    assert record["world_size"] == 2
    assert record["variant"] == VARIANT
    assert record["strategy"] == "ddp"
    assert 0 < record["metrics"]["eval_loss"] < 10
    # the throughput of the group: every token of the 3 global batches (8 full blocks of 32), once
    assert record["metrics"]["train_tokens"] == 3 * 8 * 32
    assert record["metrics"]["params_per_rank"] == parameters(job)  # DDP replicates the whole model
    saved = json.loads(next((out / "ddp").glob("*__seed0__ddp2.json")).read_text())
    assert saved == record


def test_unknown_variant_names_the_known_ones(tmp_path):
    study = write_study(tmp_path / "study")
    with pytest.raises(StudyError, match=r"variant: no variant 'relative'; the study has: position=absolute, "):
        prepare_job(study, "relative", seed=0, out_dir=tmp_path / "out")


def test_study_without_training_cannot_run_ddp(tmp_path):
    study = write_study(tmp_path / "study", train=None)
    with pytest.raises(StudyError, match="DDP training needs a `train:` section"):
        prepare_job(study, VARIANT, seed=0, out_dir=tmp_path / "out")


def test_entry_point_outside_torchrun_says_how_to_start_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    assert main(["x.yaml", "--variant", "v", "--out", str(tmp_path)]) == 2
    assert "python -m torch.distributed.run --nproc_per_node N -m bertblocks.ablation.ddp" in capsys.readouterr().out


def parameters(job) -> int:
    """The variant's parameters (a tied weight once)."""
    return sum(p.numel() for p in task_model(job.data.task, load_config(job.config)).parameters())


@pytest.fixture(scope="module")
def ddp_and_fsdp(tmp_path_factory):
    """The same variant, seed and steps trained with DDP and with FSDP, two processes each."""
    folder = tmp_path_factory.mktemp("strategies")
    study = write_study(folder / "study")
    runs = {}
    for strategy in ("ddp", "fsdp"):
        out = folder / strategy
        job = prepare_job(study, VARIANT, seed=0, out_dir=out, overrides=["train.steps=3"])
        job.save_weights = True
        job.strategy = strategy
        runs[strategy] = (train_ddp(job, world_size=2), out / "ddp" / "weights", job)
    return runs


def test_fsdp_shards_the_parameters_and_keeps_the_ranks_one_model(ddp_and_fsdp):
    record, weights, job = ddp_and_fsdp["fsdp"]
    initial = [load_file(weights / f"rank{r}-initial.safetensors") for r in (0, 1)]
    final = [load_file(weights / f"rank{r}-final.safetensors") for r in (0, 1)]  # gathered from the shards
    for name in final[0]:
        assert torch.equal(initial[0][name], initial[1][name]), name  # the same seed: the same model
        assert torch.equal(final[0][name], final[1][name]), name
    assert all(not torch.equal(final[0][n], initial[0][n]) for n in final[0])  # every parameter trained
    assert record["strategy"] == "fsdp"
    total = parameters(job)
    # rank 0 holds its half of each tensor (rounded up per tensor), not the whole model
    assert total / 2 <= record["metrics"]["params_per_rank"] < total / 2 + 200
    assert record["metrics"]["train_tokens"] == 3 * 8 * 32


def test_fsdp_trains_the_same_model_as_ddp(ddp_and_fsdp):
    ddp, ddp_weights, _ = ddp_and_fsdp["ddp"]
    fsdp, fsdp_weights, _ = ddp_and_fsdp["fsdp"]
    a = load_file(ddp_weights / "rank0-final.safetensors")
    b = load_file(fsdp_weights / "rank0-final.safetensors")
    assert set(a) == set(b)
    for name in a:
        # the same averaged gradient, reduce-scattered instead of all-reduced: equal up to summation order
        assert_close(b[name], a[name], what=name)
    for metric in ("train_loss", "eval_loss"):
        assert_close(torch.tensor(fsdp["metrics"][metric]), torch.tensor(ddp["metrics"][metric]), what=metric)


def test_data_parallel_loss_is_close_to_the_single_process_run(ddp_and_fsdp):
    record, _, job = ddp_and_fsdp["fsdp"]
    single = train_and_evaluate(load_config(job.config), job.data, TrainSpec.model_validate(job.train), job.seed)
    # Not equal, by design: each rank draws its own dropout masks for its half of the batch, and the group
    # minimises the mean of the two halves' mean losses, not the mean over all masked tokens. After 3 steps
    # from the same initial weights the eval losses differ by 0.004 nats (the bound: 0.05, about 1%).
    assert abs(record["metrics"]["eval_loss"] - single["eval_loss"]) < 0.05
    assert record["metrics"]["eval_loss"] != single["eval_loss"]  # a real second computation, not a copy


def test_unknown_strategy_is_refused_by_the_entry_point(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["x.yaml", "--variant", "v", "--out", str(tmp_path), "--strategy", "zero3"])
    err = capsys.readouterr().err
    assert "--strategy: invalid choice: 'zero3'" in err
    assert "'ddp', 'fsdp'" in err


def test_unknown_strategy_from_python_is_refused_before_any_process_starts(tmp_path):
    job = prepare_job(write_study(tmp_path / "study"), VARIANT, seed=0, out_dir=tmp_path / "out")
    job.strategy = "zero3"  # type: ignore[assignment]
    with pytest.raises(StudyError, match=r"strategy: unknown strategy 'zero3'; choose ddp or fsdp"):
        train_ddp(job, world_size=2)
    assert not (tmp_path / "out" / "ddp").exists()
