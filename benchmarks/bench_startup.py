"""Start-up time: ``import torch``, ``import bertblocks`` and ``bertblocks --help``, each in a fresh process.

Each command runs ``--runs`` times in a new Python interpreter (the three interleaved, so that a busy spell of
the machine hits all of them alike); the wall time of the whole process is measured from here, interpreter
start-up included, and so is its CPU time (user + system, from ``wait4``), which a busy machine inflates
less than the wall time. Bytecode is cached (in a temporary ``PYTHONPYCACHEPREFIX``, written by an untimed first
run), as for an installed package: a setting of ``PYTHONDONTWRITEBYTECODE`` would otherwise recompile every
bertblocks module on every start. Prints the median of each and the difference to ``import torch``: bertblocks
needs torch, so what it adds on top is the figure it controls.

Run it from the checkout being measured: ``python -c`` puts the current directory first on ``sys.path``, so
the children import the ``bertblocks`` found there.

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


def _time(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run of ``command``."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command)
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (default 7)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        for command in COMMANDS.values():  # once untimed: bytecode written, the modules in the file-system cache
            _time(command, env)
        walls: dict[str, list[float]] = {name: [] for name in COMMANDS}
        cpus: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(args.runs):
            for name, command in COMMANDS.items():
                wall, cpu = _time(command, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
    wall_torch, cpu_torch = statistics.median(walls["import torch"]), statistics.median(cpus["import torch"])
    print(f"{args.runs} runs each; medians in seconds, and the difference to `import torch`")
    print(f"{'command':<20} {'wall':>6} {'vs torch':>9} {'cpu':>6} {'vs torch':>9}")
    for name in COMMANDS:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        extra_wall = "" if name == "import torch" else f"{wall - wall_torch:+.2f}"
        extra_cpu = "" if name == "import torch" else f"{cpu - cpu_torch:+.2f}"
        print(f"{name:<20} {wall:>6.2f} {extra_wall:>9} {cpu:>6.2f} {extra_cpu:>9}")


if __name__ == "__main__":
    main()
