"""Scale on one machine: a study whose runs fan out over a local Ray instance, and one of its variants
trained again under ``torchrun`` with two processes (FSDP), into the same output folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_ablation import write_study

from bertblocks.ablation import run_study

VARIANT = "position=relative_key"


def test_study_on_local_ray_and_one_variant_under_torchrun(tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    study = write_study(
        tmp_path / "study",
        train={"task": "mlm", "steps": 4, "batch_size": 8, "seq_len": 32, "seeds": [0], "eval_batches": 2},
    )
    out = tmp_path / "out"
    # every run a Ray task, on a Ray instance of 2 CPUs this call starts and stops
    result = run_study(study, out, executor="ray", workers=2, progress=False, echo=None)
    assert sorted(result.executed) == sorted(r["run_id"] for r in result.records)
    assert len(result.executed) == 3

    # the same variant, from the study as it ran (its saved study.yaml and tokenizer), under torchrun
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "bertblocks.ablation.ddp", str(out / "study.yaml"), "--variant", VARIANT, "--seed", "0",
        "--out", str(out), "--strategy", "fsdp",
    ]  # fmt: skip
    env = {**os.environ, "BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = (out / "ddp").glob("*__seed0__fsdp2.json")
    record = json.loads(path.read_text())
    printed = json.loads(done.stdout[done.stdout.index("{") :])
    assert printed == {k: v for k, v in record.items() if k != "eval_samples"}  # rank 0 printed what it wrote

    ray_run = next(r for r in result.records if r["variant"] == VARIANT)
    assert record["world_size"] == 2
    assert record["strategy"] == "fsdp"
    # the same token ids (the saved tokenizer), batches and eval rows as the Ray run of that seed
    assert record["metrics"]["train_tokens"] == ray_run["metrics"]["train_tokens"] == 4 * 8 * 32
    assert record["metrics"]["eval_rows"] == ray_run["metrics"]["eval_rows"]
    assert len(record["eval_samples"]["loss"]) == len(ray_run["eval_samples"]["loss"])
    # close, not equal: per-rank dropout masks and a mean of per-rank means (see tests/test_ddp.py)
    assert abs(record["metrics"]["eval_loss"] - ray_run["metrics"]["eval_loss"]) < 0.05
