"""The harness of the long-context benchmarks (``bench_longformer.py``, ``bench_nystrom.py``,
``bench_block_sparse.py``): each names its contenders and how to build one forward pass; this module times them,
measures their peak memory and prints one table.

- **Time** (:func:`interleaved_medians`, also ``bench_varlen.py``'s loop): one warm-up call each, then
  ``repeats`` rounds with the contenders' order rotating every round (no contender always runs right after the same
  other one: caches, a warmed allocator), medians in ms.
- **Memory** (:func:`peak_added_mib`, run by :func:`peaks` in fresh processes): the peak the forward pass adds
  above the resident set just before it. On CPU the kernel's high-water mark (``VmHWM``) is reset after the model is
  built (``/proc/self/clear_refs``, Linux 4.0+), so building does not count; on CUDA,
  ``torch.cuda.max_memory_allocated`` over the pass. Each contender runs in two fresh processes, interleaved, and
  the smaller peak is kept (the other had noise).
- **The table** (:func:`print_table`): per length and contender, ms and peak MiB with their ratios to the base
  contender (the long-context attention the script is about).

A script calls :func:`main` with its argument parser and a ``build(name, length, args)`` that returns the
contender's forward pass; the child processes are the same script with the same arguments and a hidden
``--child NAME LENGTH``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from machine import machine_line  # the scripts' own folder is on sys.path

#: one contender's forward pass, built for a length (the model and inputs made outside the timing)
Build = Callable[[str, int, argparse.Namespace], Callable[[], object]]


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; the CPU needs nothing)."""
    if device == "cuda":
        torch.cuda.synchronize()


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int, device: str = "cpu") -> dict[str, float]:
    """Median ms of each function over ``repeats`` rounds after one warm-up call each, the order rotating every
    round so that machine noise hits all alike."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        # rotating order: no contender always runs right after the same other one (caches, a warmed allocator)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            sync(device)
            start = time.perf_counter()
            fns[name]()
            sync(device)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def status_mib(field: str) -> float:
    """A memory field of ``/proc/self/status`` (kB there), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"/proc/self/status has no {field}")


def peak_added_mib(forward: Callable[[], object], device: str = "cpu") -> float:
    """MiB the call ``forward()`` adds at its peak above what is resident (allocated, on CUDA) just before it.
    Run it in a fresh process (:func:`peaks` does): a high-water mark covers the whole process."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.max_memory_allocated()
        forward()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    before = status_mib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    forward()
    return status_mib("VmHWM") - before


def peaks(script: str, argv: Sequence[str], contenders: Sequence[str], length: int) -> dict[str, float]:
    """Each contender's :func:`peak_added_mib` at ``length``: the script run again (its arguments ``argv`` and
    ``--child NAME LENGTH``) in two fresh processes per contender, interleaved; the smaller peak of the two."""
    names = list(contenders)
    mib: dict[str, float] = {}
    for r in range(2):
        for name in names[r:] + names[:r]:
            command = [sys.executable, script, *argv, "--child", name, str(length)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            value = float(json.loads(out.strip().splitlines()[-1])["peak_added_mib"])
            mib[name] = min(mib.get(name, value), value)
    return mib


def print_header(base: str) -> None:
    """The column names of :func:`print_table`'s rows."""
    ratio = f"x {base}"
    print(f"{'L':>6} {'contender':<16} {'ms':>10} {ratio:>16} {'peak MiB':>9} {ratio:>16}")


def print_table(length: int, ms: dict[str, float], mib: dict[str, float], base: str) -> None:
    """One row per contender: ms and peak MiB, each with its ratio to ``base``'s."""
    for name in ms:
        print(
            f"{length:>6} {name:<16} {ms[name]:>10.1f} {ms[name] / ms[base]:>16.2f} "
            f"{mib[name]:>9.1f} {mib[name] / max(mib[base], 1e-9):>16.2f}"
        )


def add_arguments(parser: argparse.ArgumentParser, threads: int | None = None) -> None:
    """The options every long-context benchmark has: ``--lengths``, ``--repeats``, ``--device``, ``--threads``
    (``threads`` its default; ``None``: torch's own choice), and the hidden ``--child NAME LENGTH`` of the memory
    processes."""
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=threads, help="torch threads")
    parser.add_argument("--child", nargs=2, metavar=("CONTENDER", "LENGTH"), help=argparse.SUPPRESS)


def main(
    script: str,
    parser: argparse.ArgumentParser,
    contenders: Sequence[str],
    build: Build,
    describe: Callable[[argparse.Namespace], str],
    argv: Sequence[str] | None = None,
) -> None:
    """Run a long-context benchmark: parse ``argv`` (the command line's by default), then either be one memory
    process (``--child``) or time every contender at every length, measure their peaks and print the table, the
    first contender the base of the ratios.

    Args:
        script: the script's path (its ``__file__``): what the memory processes run.
        parser: the script's parser, :func:`add_arguments` already applied, plus its model's options.
        contenders: the contenders' names, the base first.
        build: ``build(name, length, args)`` → the contender's forward pass (model and inputs built once).
        describe: ``describe(args)`` → one line of the model's settings, printed above the table.
        argv: the arguments (tests pass them; the child processes get the same ones).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.child:
        name, length = args.child[0], int(args.child[1])
        if name not in contenders:
            parser.error(f"--child: unknown contender {name!r} (one of {', '.join(contenders)})")
        print(json.dumps({"peak_added_mib": peak_added_mib(build(name, length, args), args.device)}))
        return
    base = contenders[0]
    print(f"machine: {machine_line() if args.device == 'cpu' else torch.cuda.get_device_name()}")
    print(f"model: {describe(args)}; batch 1; fp32 eval; median of {args.repeats} interleaved repeats")
    print_header(base)
    for length in args.lengths:
        ms = interleaved_medians({name: build(name, length, args) for name in contenders}, args.repeats, args.device)
        print_table(length, ms, peaks(script, argv, contenders, length), base)
