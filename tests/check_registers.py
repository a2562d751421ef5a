#!/usr/bin/env python3
"""The registers of the expanded layout's dispatch / combine kernels on sm_90, from ptxas: each must keep
three blocks of 256 threads resident per SM (at most 80 registers a thread), the occupancy the full-budget
grid (EpConfig::kAllSms) is sized by. One kernel over it shrinks every grid of the group by a third
(docs/performance-notes.md, perf-seam-1). The wide dispatch kernels (rocep_dispatch_wide and its
_scaled and _scale_runs_wide kin, each with its receive, and rocep_dispatch_send_wide) run only on a
budget's grid, one block per multiprocessor, and take up to a thread's 255 registers: they must not spill
(kWideExpansionItems tokens' loads held in registers at once).

    python3 tests/check_registers.py [--nvcc nvcc]
"""

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The kernels of an expanded group (host/gpu_backend.cpp loads them for its residency).
EXPANDED = {
    "rocep_dispatch", "rocep_dispatch_send", "rocep_dispatch_recv", "rocep_dispatch_scale_runs",
    "rocep_dispatch_recv_scale_runs", "rocep_dispatch_input_scales", "rocep_combine", "rocep_combine_send",
    "rocep_combine_recv", "rocep_combine_epilogue", "rocep_combine_recv_epilogue", "rocep_combine_fp8",
    "rocep_combine_send_fp8", "rocep_combine_recv_fp8", "rocep_combine_epilogue_fp8",
    "rocep_combine_recv_epilogue_fp8",
}
LIMIT = 80  # 65536 registers / (3 blocks x 256 threads), in the allocation's steps of 8
# The kernels of a budget's grid (LaunchGrid::wide), which must not spill.
WIDE = {
    "rocep_dispatch_wide", "rocep_dispatch_recv_wide", "rocep_dispatch_wide_scaled",
    "rocep_dispatch_recv_wide_scaled", "rocep_dispatch_scale_runs_wide", "rocep_dispatch_recv_scale_runs_wide",
    "rocep_dispatch_send_wide",
}


def kernel_registers(nvcc: str, source: pathlib.Path) -> tuple:
    """(registers, spilled bytes) of each kernel of `source`, by name."""
    with tempfile.TemporaryDirectory() as folder:
        result = subprocess.run(
            [nvcc, "-DROCEP_PLATFORM_NVIDIA", "-DROCEP_GPU_SOURCE", "-O3", "-DNDEBUG", "-arch=sm_90", "--fmad=false",
             "-std=c++17", "-Xptxas", "-v", f"-I{ROOT / 'include'}", f"-I{ROOT}", "-x", "cu", "-c", str(source),
             "-o", str(pathlib.Path(folder) / "kernel.o")],
            capture_output=True, text=True, check=True)
    registers, spills, kernel = {}, {}, None
    for line in result.stderr.splitlines():
        entry = re.search(r"Compiling entry function '([A-Za-z_0-9]+)'", line)
        if entry:
            kernel = entry.group(1)
        spilled = re.search(r"(\d+) bytes spill stores", line)
        if spilled and kernel:
            spills[kernel] = int(spilled.group(1))
        used = re.search(r"Used (\d+) registers", line)
        if used and kernel:
            registers[kernel] = int(used.group(1))
            kernel = None
    return registers, spills


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvcc", default="nvcc")
    arguments = parser.parse_args()
    registers, spills = {}, {}
    for source in ("hip/dispatch.hip", "hip/combine.hip"):
        source_registers, source_spills = kernel_registers(arguments.nvcc, ROOT / source)
        registers.update(source_registers)
        spills.update(source_spills)
    missing = (EXPANDED | WIDE) - registers.keys()
    if missing:
        print(f"check_registers: no ptxas report for {sorted(missing)}", file=sys.stderr)
        return 1
    failed = False
    for kernel in sorted(registers):
        over = kernel in EXPANDED and registers[kernel] > LIMIT
        spilling = kernel in WIDE and spills.get(kernel, 0) > 0
        failed = failed or over or spilling
        print(f"{kernel}: {registers[kernel]} registers, {spills.get(kernel, 0)} bytes spilled"
              + (f"  OVER {LIMIT}" if over else "") + ("  SPILLS" if spilling else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
