"""``import bertblocks`` and ``bertblocks --help`` leave the heavy modules alone: they are imported where they
are used (the compiler when compiling, transformers when converting, ...). Checked on ``sys.modules`` in a
fresh interpreter; how long start-up takes is measured by ``benchmarks/bench_startup.py``, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: modules that cost a second or more to import, or that are optional dependencies
HEAVY = (
    *("torch._dynamo", "torch._inductor", "transformers", "onnx", "onnxruntime", "matplotlib", "ray"),
    # the study machinery (a quarter of a second): `--help` describes `ablate` from its parser alone
    *("bertblocks.ablation.runner", "bertblocks.ablation.study", "bertblocks.ablation.downstream"),
)


STEPS = {
    "import bertblocks": "import bertblocks",
    "bertblocks --help": (
        "import contextlib, io\n"
        "from bertblocks.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--help']) == 0\n"
    ),
}


def _loaded_after(code: str) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("step", STEPS)
def test_start_up_imports_no_heavy_module(step):
    assert _loaded_after(STEPS[step]) == []


def test_the_probe_sees_a_heavy_module_when_one_is_imported():
    # the check above could pass by looking at the wrong process; importing one must show
    assert "torch._dynamo" in _loaded_after("import bertblocks, torch._dynamo")


@pytest.mark.parametrize("enabled", [True, False])
def test_import_leaves_the_garbage_collector_as_it_found_it(enabled):
    """bertblocks pauses the collector while it imports (start-up time); the caller's setting survives."""
    setting = "gc.enable()" if enabled else "gc.disable()"
    probe = f"import gc\n{setting}\nimport bertblocks\nprint(gc.isenabled())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(enabled)
