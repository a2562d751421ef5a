#!/usr/bin/env python3
"""The registers of the expanded layout's dispatch / combine kernels on sm_90, from ptxas: each must keep
three blocks of 256 threads resident per SM (at most 80 registers a thread), the occupancy the full-budget
grid (EpConfig::kAllSms) is sized by. One kernel over it shrinks every grid of the group by a third
(docs/performance-notes.md, perf-seam-1). The wide dispatch kernels (rocep_dispatch_wide and its
_scaled and _scale_runs_wide kin, each with its receive, and rocep_dispatch_send_wide) run only on a
budget's grid, one block per multiprocessor, and take up to a thread's 255 registers: they must not spill
(kWideExpansionItems tokens' loads held in registers at once).

On AMD (`--amd-build DIR`, a configured and built AMD build folder, each of its targets) the same rules in
that hardware's terms, read from the code objects' metadata: a compute unit holds 3 blocks of 256 threads
when each wave64 takes at most 168 of a SIMD's 512 vector registers (architectural and accumulation ones
together), which `__launch_bounds__(256, 3)` asks of the compiler as 3 waves per SIMD; and the wide
dispatch kernels must not spill vector registers to scratch. Other kernels' spills are printed, not
failed.

    python3 tests/check_registers.py [--nvcc nvcc]
    python3 tests/check_registers.py --amd-build build/amd [--amd-build build/amd-clang]
"""

import argparse
import os
import pathlib
import re
import shutil
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
AMD_LIMIT = 168  # 512 vector registers / 3 waves per SIMD, in the allocation's steps of 8
# The kernels of a budget's grid (LaunchGrid::wide), which must not spill.
WIDE = {
    "rocep_dispatch_wide", "rocep_dispatch_recv_wide", "rocep_dispatch_wide_scaled",
    "rocep_dispatch_recv_wide_scaled", "rocep_dispatch_scale_runs_wide", "rocep_dispatch_recv_scale_runs_wide",
    "rocep_dispatch_send_wide",
}


def broken_rules(kernel: str, registers: int, spilled: int, limit: int) -> str:
    """The rules `kernel` breaks with `registers` (`limit` the expanded kernels' most) and `spilled` (bytes or
    registers), as marks for the end of its line: "" where it breaks none."""
    return ((f"  OVER {limit}" if kernel in EXPANDED and registers > limit else "")
            + ("  SPILLS" if kernel in WIDE and spilled > 0 else ""))


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


def llvm_tools(name: str) -> list:
    """Every `name` found: the PATH's, then those of the LLVM install folders (/usr/lib/llvm-NN/bin), newest
    LLVM first."""
    found = [shutil.which(name)] + sorted(map(str, pathlib.Path("/usr/lib").glob(f"llvm-*/bin/{name}")),
                                          key=lambda path: int(re.search(r"llvm-(\d+)", path).group(1)),
                                          reverse=True)
    tools = list(dict.fromkeys(tool for tool in found if tool and os.access(tool, os.X_OK)))
    if not tools:
        raise SystemExit(f"check_registers: no {name} found (installed with the AMD toolchains: clang-tools-NN, "
                         "llvm-NN)")
    return tools


def unbundle(bundle: pathlib.Path, folder: pathlib.Path) -> dict:
    """{target: code object file} of an offload bundle, by the first clang-offload-bundler that reads its
    format (a bundler reads the bundles of its own LLVM and older, not always newer ones)."""
    errors = []
    for bundler in llvm_tools("clang-offload-bundler"):
        listed = subprocess.run([bundler, "--list", "--type=o", f"--input={bundle}"], capture_output=True,
                                text=True)
        code_objects = {}
        for entry in (entry for entry in listed.stdout.split() if entry.startswith("hipv4-amdgcn-")):
            code_object = folder / f"{bundle.stem}-{entry.rsplit('--', 1)[1]}.co"
            unbundled = subprocess.run([bundler, "--unbundle", "--type=o", f"--input={bundle}",
                                        f"--targets={entry}", f"--output={code_object}"], capture_output=True,
                                       text=True)
            if unbundled.returncode != 0:
                errors.append(f"{bundler}: {unbundled.stderr.strip()}")
                break
            code_objects[entry.rsplit("--", 1)[1]] = code_object
        else:
            if code_objects:
                return code_objects
            errors.append(f"{bundler}: no AMD code object listed ({listed.stderr.strip()})")
    raise SystemExit(f"check_registers: cannot unbundle {bundle}: " + "; ".join(errors))


def amd_kernels(build: pathlib.Path) -> dict:
    """{(target, kernel): metadata} of the device code of rocep's HIP sources in `build`: the code objects
    bundled into each source's object file, read by llvm-readelf from their AMDGPU metadata notes."""
    readelf = llvm_tools("llvm-readelf")[0]
    kernels = {}
    with tempfile.TemporaryDirectory() as folder:
        for source in ("dispatch", "combine"):
            compiled = build / "CMakeFiles" / "rocep.dir" / "hip" / f"{source}.hip.o"
            if not compiled.exists():
                raise SystemExit(f"check_registers: {compiled} not found: build {build} first")
            bundle = pathlib.Path(folder) / f"{source}.bundle"
            subprocess.run(["objcopy", "-O", "binary", "--only-section=.hip_fatbin", str(compiled), str(bundle)],
                           check=True)
            for target, code_object in unbundle(bundle, pathlib.Path(folder)).items():
                notes = subprocess.run([readelf, "--notes", str(code_object)], capture_output=True, text=True,
                                       check=True).stdout
                # amdhsa.kernels, a YAML list: each kernel's entry starts with "  - .key: value", its own
                # keys 4 spaces in, those of its arguments deeper
                for entry_text in re.split(r"\n(?=  - \.)", notes)[1:]:
                    fields = dict(re.findall(r"^(?:  - |    )\.([a-z_]+):[ \t]+(\S+)", entry_text, re.MULTILINE))
                    if "vgpr_count" in fields and "name" in fields:
                        kernels[(target, fields["name"])] = fields
    return kernels


def check_amd(builds: list) -> int:
    failed = False
    for build in builds:
        kernels = amd_kernels(pathlib.Path(build))
        targets = sorted({target for target, _ in kernels})
        missing = [(target, kernel) for target in targets for kernel in sorted(EXPANDED | WIDE)
                   if (target, kernel) not in kernels]
        if not targets or missing:
            print(f"check_registers: no metadata in {build} for {missing or 'any AMD target'}", file=sys.stderr)
            return 1
        for (target, kernel), fields in sorted(kernels.items()):
            vgprs, spilled = int(fields["vgpr_count"]), int(fields.get("vgpr_spill_count", 0))
            broken = broken_rules(kernel, vgprs, spilled, AMD_LIMIT)
            failed = failed or bool(broken)
            print(f"{target} {kernel}: {vgprs} vector registers ({fields.get('agpr_count', 0)} accumulation), "
                  f"{spilled} spilled, {fields.get('private_segment_fixed_size', 0)} bytes of scratch{broken}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvcc", default="nvcc")
    parser.add_argument("--amd-build", action="append", default=[],
                        help="an AMD build folder whose code objects to check instead of compiling for sm_90")
    arguments = parser.parse_args()
    if arguments.amd_build:
        return check_amd(arguments.amd_build)
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
        broken = broken_rules(kernel, registers[kernel], spills.get(kernel, 0), LIMIT)
        failed = failed or bool(broken)
        print(f"{kernel}: {registers[kernel]} registers, {spills.get(kernel, 0)} bytes spilled{broken}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
