"""One line saying which machine a benchmark figure came from: CPU model and int8/vector flags, the vector ISA
ATen runs, threads, load average, and any variable that holds the CPU to a lower ISA (an emulation).

Every benchmark prints it next to its figures (``docs/explanation/performance.md`` quotes it), so that a figure
taken on an AVX-512 VNNI machine is never read as one for an AVX2 machine, and a busy machine shows.
"""

from __future__ import annotations

import os
from pathlib import Path

#: flags of /proc/cpuinfo worth naming, as docs write them
FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX-512 VNNI", "avx_vnni": "AVX-VNNI", "amx_int8": "AMX"}
#: variables that cap the ISA a library uses (set together to emulate an AVX2-only CPU)
EMULATION = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS", "MKL_ENABLE_INSTRUCTIONS")


def cpu_line() -> str:
    """``"AMD EPYC, 2 logical CPUs, AVX2 AVX-512 AVX-512 VNNI AVX-VNNI, no AMX"`` (from /proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "CPU unknown (no /proc/cpuinfo)"
    model, flags = "unknown CPU", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    have = [name for flag, name in FLAGS.items() if flag in flags]
    lacks = [name for flag, name in FLAGS.items() if flag not in flags]
    lacking = f", no {', no '.join(lacks)}" if lacks else ""
    return f"{model}, {os.cpu_count()} logical CPUs, {' '.join(have) or 'no AVX2'}{lacking}"


def machine_line() -> str:
    """The CPU, ATen's ISA, torch's threads, the load average now, and the emulation variables set (if any)."""
    import torch

    emulated = [f"{name}={os.environ[name]}" for name in EMULATION if name in os.environ]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{cpu_line()}; torch {torch.__version__} running {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads; load average {load}"
        + (f"; emulating: {' '.join(emulated)}" if emulated else "")
    )


if __name__ == "__main__":
    print(machine_line())
