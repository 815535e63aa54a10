"""``benchmarks/bench_gpu.py``, the one command a contributor with a GPU runs: without a GPU it says so in one line
and exits 0; its every code path (the contenders, the interleaved timing, the tables and ratios) runs on CPU with a
tiny model (``--device cpu --tiny``), so the script cannot rot between GPU runs."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


def test_without_a_gpu_it_exits_0_with_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU even on a machine that has one
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "bench_gpu: no CUDA GPU here (torch.cuda.is_available() is False): nothing measured"
    ]
    assert "Traceback" not in done.stderr


@pytest.mark.compile
def test_every_section_runs_on_cpu_with_a_tiny_model(capsys):
    bench = runpy.run_path(str(SCRIPT))  # not as __main__: main() is called below
    try:
        args = ["--device", "cpu", "--tiny", "--compile-backend", "eager", "--repeats", "1"]
        assert bench["main"](args) == 0
    finally:
        torch._dynamo.reset()
    out = capsys.readouterr().out
    assert re.match(r"machine: CPU .*; torch \S+, no CUDA, transformers \S+\n", out)
    sections = re.findall(r"^(inference, padded|inference, uniform|fine-tuning step|MLM pre-training step)", out, re.M)
    assert sections == ["inference, padded", "inference, uniform", "fine-tuning step", "MLM pre-training step"]
    rows = re.findall(r"^  (.+?)\s+([\d.]+) ms .* peak\s+(\S+)\s+x\s*([\d.]+) vs (.+)$", out, re.M)
    names = [name for name, *_ in rows]
    inference = ["bertblocks eager", "bertblocks compiled", "transformers sdpa", "transformers compiled"]
    training = ["bertblocks padded", "bertblocks packed", "transformers sdpa"]
    mlm = ["bertblocks packed + sparse", "transformers sparse (fair)", "transformers as shipped"]
    assert names == inference + inference + training + mlm
    for name, ms, peak, ratio, baseline in rows:
        assert float(ms) > 0
        assert peak == "n/a"  # no allocator statistics on CPU
        if name == baseline:
            assert float(ratio) == 1.0
