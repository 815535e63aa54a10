"""Start-up time: ``import torch``, ``import bertblocks`` and ``bertblocks --help``, each in a fresh process.

Each command runs ``--runs`` times in a new Python interpreter (the three interleaved, so that a busy spell of
the machine hits all of them alike); the wall time of the whole process is measured from here, interpreter
start-up included. Bytecode is cached (in a temporary ``PYTHONPYCACHEPREFIX``, written by an untimed first
run), as for an installed package: a setting of ``PYTHONDONTWRITEBYTECODE`` would otherwise recompile every
bertblocks module on every start. Prints the median of each and the difference to ``import torch``: bertblocks
needs torch, so what it adds on top is the figure it controls.

Usage:
    python benchmarks/bench_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS: dict[str, list[str]] = {
    "import torch": [sys.executable, "-c", "import torch"],
    "import bertblocks": [sys.executable, "-c", "import bertblocks"],
    # what the console script runs (`bertblocks --help`), without depending on where it is installed
    "bertblocks --help": [
        sys.executable,
        "-c",
        "import sys; from bertblocks.cli import main; sys.exit(main())",
        "--help",
    ],
}


def _time(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (default 7)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        for command in COMMANDS.values():  # once untimed: bytecode written, the modules in the file-system cache
            _time(command, env)
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(args.runs):
            for name, command in COMMANDS.items():
                times[name].append(_time(command, env))
    torch_median = statistics.median(times["import torch"])
    print(f"{'command':<20} {'median s':>9} {'min s':>7} {'vs import torch':>16}   ({args.runs} runs each)")
    for name, runs in times.items():
        median = statistics.median(runs)
        extra = "" if name == "import torch" else f"{median - torch_median:+.2f} s"
        print(f"{name:<20} {median:>9.2f} {min(runs):>7.2f} {extra:>16}")


if __name__ == "__main__":
    main()
