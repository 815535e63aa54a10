"""Data-parallel training of one variant: two local processes (gloo, CPU) must keep identical weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_ablation import write_study

from bertblocks.ablation import StudyError
from bertblocks.ablation.ddp import main, prepare_job, train_ddp

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
    assert 0 < record["metrics"]["eval_loss"] < 10
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
