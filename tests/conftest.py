"""Shared fixtures: tiny HF models saved to disk, and a registry without third-party plugins."""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# The test models are tiny: a second thread only adds synchronisation (measured 30x slower per step on a
# loaded 2-core machine). Parity does not depend on the thread count.
torch.set_num_threads(1)


def _ieee_float32_on_gpus() -> None:
    """float32 means IEEE float32 in the parity tests, on a GPU too.

    cuDNN convolutions default to TF32 on Ampere and newer GPUs (a 10-bit mantissa): transformers' SqueezeBERT
    convolutions then moved ~1e-3 from the same model's float32 numbers (seen on an H100), a rounding of the
    reference, not a bug; matrix products are IEEE by default already. No effect on a CPU.
    """
    # the one switch for convolutions and RNNs alike: setting only the newer per-operator one
    # (cudnn.conv.fp32_precision) leaves the two apart, and torch then refuses to answer allow_tf32 (as the ONNX
    # exporter asks)
    torch.backends.cudnn.allow_tf32 = False


_ieee_float32_on_gpus()


def _quiet_torch_structured_trace() -> None:
    """Keep torch.compile's structured trace out of the captured logs, unless TORCH_TRACE asks for it.

    torch's ``torch.__trace`` logger is always at DEBUG and builds a record for each compile step whenever
    it has a handler (its own handler removes itself on the first record when ``TORCH_TRACE`` is unset).
    pytest attaches its capture handler to every logger that does not propagate, which that one does
    not: each compile test then built the trace payloads and a failure printed ~700 empty DEBUG lines
    above the summary. Without a handler and propagating, torch skips the trace entirely.
    """
    if os.environ.get("TORCH_TRACE") or os.environ.get("TORCH_DTRACE") or os.environ.get("TORCH_COMPILE_DEBUG") == "1":
        return
    trace = logging.getLogger("torch.__trace")
    for handler in list(trace.handlers):
        trace.removeHandler(handler)
    trace.propagate = True


_quiet_torch_structured_trace()


def _devices() -> list[object]:
    """``cpu`` always; ``cuda`` (marked ``cuda``, so ``pytest -m cuda`` selects it) when a GPU is present."""
    devices: list[object] = [pytest.param("cpu", id="cpu")]
    if torch.cuda.is_available():
        devices.append(pytest.param("cuda", id="cuda", marks=pytest.mark.cuda))
    return devices


#: the devices a device-parametrised test runs on (see :func:`device`)
DEVICES = _devices()


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """The device a test runs on: ``cpu`` every time, and ``cuda`` too when ``torch.cuda.is_available()``.

    One test body for both, so the GPU cases cannot rot between the (rare) runs on a GPU: a test that asks for
    ``device`` moves its models and inputs there. ``python -m pytest -q -m cuda`` runs the CUDA cases only
    (docs/explanation/performance.md, "GPU").
    """
    return str(request.param)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """``pytest -m cuda`` on a machine without a GPU selects nothing: say so and exit 0, not 5 (no tests)."""
    markexpr = session.config.getoption("markexpr", default="") or ""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and "cuda" in markexpr and not torch.cuda.is_available():
        session.exitstatus = pytest.ExitCode.OK
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("no CUDA device: the cuda cases are collected only where torch.cuda.is_available()")


#: test files whose tests start process groups of their own (gloo rendezvous, torchrun, a local Ray instance): one
#: such file runs at a time on the machine, across xdist workers and the floor job beside the main suite (a lock
#: file, :func:`one_process_group_at_a_time`). Two of them at once on CI's two cores, beside the other tests, once
#: aborted a torchrun rank (SIGABRT in gloo) that passes alone.
PROCESS_GROUP_FILES = frozenset({"tests/test_ddp.py", "tests/test_ablation_scale.py"})
#: test files whose tests must run in one process, in file order, under pytest-xdist (see
#: :func:`pytest_xdist_make_scheduler`): a doc page's blocks share the page's scratch folder and build on each other;
#: a process-group file's module fixture (DDP and FSDP trainings) is then built once, not once per worker
ONE_WORKER_FILES = frozenset({"tests/test_doc_blocks.py"}) | PROCESS_GROUP_FILES


@pytest.fixture(scope="module", autouse=True)
def one_process_group_at_a_time(request: pytest.FixtureRequest):
    """Hold a machine-wide lock while a :data:`PROCESS_GROUP_FILES` module runs (its module fixtures included:
    autouse, so set up before them); other modules pass straight through."""
    path = Path(str(request.path)).resolve()
    if not any(path.as_posix().endswith(name) for name in PROCESS_GROUP_FILES):
        yield
        return
    with open(Path(tempfile.gettempdir()) / "bertblocks-tests-process-groups.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def one_worker_scope(nodeid: str) -> str:
    """The unit a test is scheduled in under pytest-xdist: its file for :data:`ONE_WORKER_FILES`, else itself."""
    path = nodeid.split("::", 1)[0]
    return path if path in ONE_WORKER_FILES else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under pytest-xdist's default distribution (``-n N`` alone, as CI runs the suite: ``--dist load``), each test
    is its own unit, sent to whichever worker is free, except that a file of :data:`ONE_WORKER_FILES` is one unit:
    its tests run in one worker, in order, however the suite is started.

    xdist's own ``xdist_group`` marks cannot say this here: ``--dist loadgroup`` groups by a suffix it writes into
    ``item._nodeid``, which pytest 9 no longer reads (a node's id is ``item._id``), so the groups were silently
    ignored. Another ``--dist`` asked for by name is left as it is. Not called without xdist.
    """
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerFiles(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return one_worker_scope(nodeid)

    return OneWorkerFiles(config, log)


def to_device(inputs: dict[str, torch.Tensor], device: str | torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of a batch on ``device`` (what a device-parametrised test feeds its models)."""
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}


FIXTURES = Path(__file__).parent / "fixtures"
V4 = FIXTURES / "v4"

TINY_HF = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    # A wide initialiser makes attention sharply non-uniform, so a wrong query/key/mask shows in the numbers.
    "initializer_range": 0.2,
}

TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "max_position_embeddings": 64,
    "encoder": {"num_layers": 2, "attention": {"num_heads": 4}, "feedforward": {"intermediate_size": 37}},
}


@pytest.fixture(autouse=True)
def _no_third_party_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see the built-ins only, unless a test installs its own registry."""
    import bertblocks.registry as registry

    monkeypatch.setenv(registry.DISABLE_AUTOLOAD_ENV, "1")
    registry.set_registry(None)


@pytest.fixture
def hf_checkpoint(tmp_path: Path) -> Callable[..., Path]:
    """Save a random transformers BertModel (or task model) and return its directory."""
    import transformers

    def make(cls: str = "BertModel", seed: int = 0, **overrides: object) -> Path:
        torch.manual_seed(seed)
        config = transformers.BertConfig(**{**TINY_HF, **overrides})
        model = getattr(transformers, cls)(config).eval()
        directory = tmp_path / f"{cls}-{seed}"
        logging.getLogger("transformers").setLevel(logging.ERROR)
        model.save_pretrained(directory)
        return directory

    return make


@pytest.fixture
def init_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, ...]]]:
    """Every in-place random initialisation of a real (non-meta) tensor: a load must run none on weights it
    then overwrites (tests/test_loading.py, tests/test_load_path.py)."""
    calls: list[tuple[str, tuple[int, ...]]] = []
    for name in ("normal_", "uniform_"):
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            if not self.is_meta:
                calls.append((_name, tuple(self.shape)))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return calls


def batch(seed: int = 0, b: int = 3, length: int = 9, vocab: int = 99) -> dict[str, torch.Tensor]:
    """A padded batch: row 1 loses its last 3 tokens, row 2 its last 5."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (b, length), generator=g)
    mask = torch.ones(b, length, dtype=torch.long)
    mask[1, -3:] = 0
    if b > 2:
        mask[2, -5:] = 0
    types = torch.randint(0, 2, (b, length), generator=g)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()


# --- The floor job (.ci/floor): the oldest versions pyproject.toml claims, without the reference libraries ---
#: libraries the tests compare against or integrate with; the library itself never needs them
REFERENCE_LIBRARIES = frozenset(
    {"transformers", "peft", "sentence_transformers", "accelerate", "datasets", "onnx", "onnxruntime", "onnxscript"}
    | {"matplotlib", "ray", "tqdm"}
)
#: set by .ci/floor only: a full run must fail loudly when a reference library is missing, never skip
REFERENCES_OPTIONAL = os.environ.get("BERTBLOCKS_TEST_FLOOR") == "1"


def _missing_reference(error: BaseException) -> str | None:
    if isinstance(error, ModuleNotFoundError) and error.name and error.name.split(".")[0] in REFERENCE_LIBRARIES:
        return error.name.split(".")[0]
    return None


if REFERENCES_OPTIONAL:

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(collector: pytest.Collector):
        report = yield
        error = getattr(getattr(report.longrepr, "reprcrash", None), "message", "") or str(report.longrepr or "")
        if report.failed and isinstance(collector, pytest.Module):
            for name in REFERENCE_LIBRARIES:
                if f"No module named '{name}" in error:
                    report.outcome = "skipped"
                    report.longrepr = (str(collector.path), 0, f"Skipped: needs {name}, absent in the floor job")
                    break
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(item: pytest.Item):
        try:
            return (yield)
        except ModuleNotFoundError as error:
            if name := _missing_reference(error):
                pytest.skip(f"needs {name}, absent in the floor job")
            raise

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(item: pytest.Item):
        try:
            return (yield)
        except ModuleNotFoundError as error:
            if name := _missing_reference(error):
                pytest.skip(f"needs {name}, absent in the floor job")
            raise


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Doc blocks marked ``slow`` run only when asked for by name (``-m docs_slow``), never in the default run."""
    if "docs_slow" in (config.option.markexpr or ""):
        return
    slow = [item for item in items if item.get_closest_marker("docs_slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("docs_slow")]
