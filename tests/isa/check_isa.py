#!/usr/bin/env python3
"""The ISA contract of rocep's cross-GPU signalling primitives on AMD.

Reads the device assembly of tests/isa/signal_primitives.hip for one target and checks that every kernel
holds, in order, the instructions the AMDGPU memory model (LLVM's AMDGPUUsage, "Memory Model GFX90A" and
"Memory Model GFX942") requires for what rocep relies on: a peer GPU that sees the flag also sees the
payload. Exit status 0 when every kernel holds its sequence, 1 with the kernel and the missing step named.

  check_isa.py TARGET FILE.s        check one compiled target (gfx90a, gfx940, gfx941, gfx942, gfx950)
  check_isa.py --mutants TARGET FILE.s
                                    check that the checker rejects weakened copies of FILE.s (each
                                    instruction of the contract removed, each of its cache bits dropped)

Cache-policy bits, as the assembler prints them:
  GFX940 family (gfx940-942, gfx950): sc0 sc1 on a load or store = system scope (both L1 and L2 are
    bypassed or written through for memory other agents see); on an atomic read-modify-write sc1 = system
    scope and sc0 = "returns the old value". buffer_wbl2 sc0 sc1 writes dirty L2 lines back so that other
    agents can see them; buffer_inv sc0 sc1 invalidates L1 and the L2 lines another agent may have changed.
  GFX90A: glc on a load bypasses L1; buffer_wbl2 writes back L2; buffer_invl2 then buffer_wbinvl1_vol
    invalidate L2's non-coherent lines and L1; fine-grained memory keeps atomics coherent without bits.
"""

import re
import sys

CACHE_BITS = {"sc0", "sc1", "nt", "glc", "slc", "scc", "dlc"}


class Step:
    """One instruction the contract requires: a mnemonic (regular expression), its exact set of cache bits
    (None: any) and, for s_waitcnt, a counter that must be waited to zero."""

    def __init__(self, mnemonic, bits=None, waits=None, why=""):
        self.mnemonic = re.compile(mnemonic)
        self.bits = None if bits is None else frozenset(bits.split())
        self.waits = waits
        self.why = why

    def matches(self, instruction):
        mnemonic, operands, bits = instruction
        if not self.mnemonic.fullmatch(mnemonic):
            return False
        if self.bits is not None and bits != self.bits:
            return False
        return self.waits is None or f"{self.waits}(0)" in operands

    def describe(self):
        bits = "" if self.bits is None else (" " + " ".join(sorted(self.bits)) if self.bits else " (no cache bits)")
        waits = f" {self.waits}(0)" if self.waits else ""
        return f"{self.mnemonic.pattern}{waits}{bits}: {self.why}"


def gfx940_family():
    payload_store = Step(r"global_store_dwordx2", "", why="the payload store, plain")
    wait_stores = Step(r"s_waitcnt", waits="vmcnt", why="earlier stores and the write-back complete")
    write_back = Step(r"buffer_wbl2", "sc0 sc1", why="L2 written back for every agent (system scope)")
    invalidate = Step(r"buffer_inv", "sc0 sc1", why="L1 and L2 invalidated at system scope: later loads miss")
    acquire_load = Step(r"global_load_dwordx2", "sc0 sc1", why="the flag loaded at system scope")
    wait_load = Step(r"s_waitcnt", waits="vmcnt", why="the flag's value has arrived before the invalidate")
    payload_load = Step(r"global_load_dwordx2", "", why="the payload load, after the invalidate")
    arrival_add = Step(r"global_atomic_add_x2", "sc1", why="system-scope add that returns nothing (no sc0)")
    return {
        "isa_store_release_system": [
            payload_store, write_back, wait_stores,
            Step(r"global_store_dwordx2", "sc0 sc1", why="the flag stored at system scope"),
        ],
        "isa_load_acquire_system": [acquire_load, wait_load, invalidate, payload_load],
        "isa_fence_then_arrival_add": [payload_store, write_back, wait_stores, invalidate, arrival_add],
        "isa_add_relaxed_system": [arrival_add],
        "isa_wait_until_at_least": [
            Step(r"s_memrealtime", why="the deadline's start on the constant-rate clock"),
            acquire_load, wait_load, invalidate,
            Step(r"s_memrealtime", why="the deadline checked inside the loop"),
            payload_load,
        ],
    }


def gfx90a():
    payload_store = Step(r"global_store_dwordx2", "", why="the payload store, plain")
    write_back = Step(r"buffer_wbl2", "", why="L2 written back for other agents")
    wait_stores = Step(r"s_waitcnt", waits="vmcnt", why="earlier stores and the write-back complete")
    acquire_load = Step(r"global_load_dwordx2", "glc", why="the flag loaded past L1")
    wait_load = Step(r"s_waitcnt", waits="vmcnt", why="the flag's value has arrived before the invalidates")
    invalidate_l2 = Step(r"buffer_invl2", "", why="L2's non-coherent lines invalidated")
    invalidate_l1 = Step(r"buffer_wbinvl1_vol", "", why="L1 invalidated")
    payload_load = Step(r"global_load_dwordx2", "", why="the payload load, after the invalidates")
    arrival_add = Step(r"global_atomic_add_x2", "", why="an add that returns nothing (no glc)")
    return {
        "isa_store_release_system": [
            payload_store, write_back, wait_stores,
            Step(r"global_store_dwordx2", "", why="the flag store, after the write-back"),
        ],
        "isa_load_acquire_system": [acquire_load, wait_load, invalidate_l2, invalidate_l1, payload_load],
        "isa_fence_then_arrival_add": [
            payload_store, write_back, wait_stores, invalidate_l2, invalidate_l1, arrival_add,
        ],
        "isa_add_relaxed_system": [arrival_add],
        "isa_wait_until_at_least": [
            Step(r"s_memrealtime", why="the deadline's start on the constant-rate clock"),
            acquire_load, wait_load, invalidate_l2, invalidate_l1,
            Step(r"s_memrealtime", why="the deadline checked inside the loop"),
            payload_load,
        ],
    }


CONTRACTS = {
    "gfx90a": gfx90a,
    "gfx940": gfx940_family,
    "gfx941": gfx940_family,
    "gfx942": gfx940_family,
    "gfx950": gfx940_family,
}

# Kernels whose flag load must sit in a loop (a label before it, a branch back to that label after it).
POLLING_KERNELS = {"isa_wait_until_at_least"}


def parse(assembly):
    """Kernel name -> list of (text, (mnemonic, operands, cache bits) or None for a label, line number)."""
    kernels = {}
    current = None
    for number, line in enumerate(assembly.splitlines()):
        text = line.split(";", 1)[0].rstrip()
        label = re.fullmatch(r"([A-Za-z_.$][\w.$]*):", text.strip())
        if label and not text.startswith(("\t", " ")):
            name = label.group(1)
            if name.startswith("isa_"):
                current = name
                kernels[current] = []
            elif current is not None:
                kernels[current].append((name + ":", None, number))
            continue
        if current is None or not text.startswith(("\t", " ")):
            continue
        text = text.strip()
        if not text or text.startswith("."):
            continue
        if text == "s_endpgm":
            current = None
            continue
        mnemonic, _, rest = text.partition(" ")
        tokens = [token for token in re.split(r"[\s,]+", rest) if token]
        bits = frozenset(token for token in tokens if token in CACHE_BITS)
        kernels[current].append((text, (mnemonic, rest, bits), number))
    return kernels


def find_steps(body, steps):
    """Indices in `body` of `steps` matched in order, or the index of the first step not found."""
    position = 0
    matched_at = []
    for number, step in enumerate(steps):
        while position < len(body) and (body[position][1] is None or not step.matches(body[position][1])):
            position += 1
        if position == len(body):
            return matched_at, number
        matched_at.append(position)
        position += 1
    return matched_at, None


def check_kernel(name, body, steps):
    """Returns None when `steps` occur in order in `body`, else what is missing."""
    matched_at, missing = find_steps(body, steps)
    if missing is not None:
        after = f" after '{body[matched_at[-1]][0]}'" if matched_at else ""
        return f"{name}: missing {steps[missing].describe()}{after}"
    if name in POLLING_KERNELS:
        flag_load = matched_at[1]
        labels = [body[i][0][:-1] for i in range(flag_load) if body[i][1] is None]
        branches_back = any(
            body[i][1] is not None and body[i][1][0].startswith("s_") and "branch" in body[i][1][0]
            and body[i][1][1].strip() in labels
            for i in range(flag_load + 1, len(body)))
        if not branches_back:
            return f"{name}: the system-scope flag load is not inside a loop (no branch back above it)"
    return None


def check(target, assembly):
    if target not in CONTRACTS:
        return [f"no ISA contract for {target}: allowed targets are {', '.join(sorted(CONTRACTS))}"]
    contract = CONTRACTS[target]()
    kernels = parse(assembly)
    failures = []
    for name, steps in contract.items():
        if name not in kernels:
            failures.append(f"{name}: kernel not found in the assembly")
            continue
        failure = check_kernel(name, kernels[name], steps)
        if failure:
            failures.append(failure)
    return failures


def mutants(target, assembly):
    """Weakened copies of the assembly, each with what was weakened: every instruction the contract relies
    on (the payload accesses aside) removed, and each of its cache bits dropped. The checker must reject
    every one."""
    lines = assembly.splitlines()
    kernels = parse(assembly)
    for name, steps in CONTRACTS[target]().items():
        body = kernels[name]
        matched_at, _ = find_steps(body, steps)
        for step, index in zip(steps, matched_at):
            if "payload" in step.why:
                continue
            text, (_, _, bits), line = body[index]
            yield f"{name}: '{text}' removed", "\n".join(lines[:line] + lines[line + 1:])
            for bit in sorted(bits):
                copy = list(lines)
                copy[line] = re.sub(rf"\s{bit}\b", "", lines[line], count=1)
                yield f"{name}: {bit} dropped from '{text}'", "\n".join(copy)


def main(argv):
    check_mutants = len(argv) > 1 and argv[1] == "--mutants"
    args = argv[2:] if check_mutants else argv[1:]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    target, path = args
    with open(path, encoding="utf-8") as file:
        assembly = file.read()
    failures = check(target, assembly)
    if not check_mutants:
        for failure in failures:
            print(f"{target}: {failure}", file=sys.stderr)
        if not failures:
            print(f"{target}: {len(CONTRACTS[target]())} signalling kernels hold the ISA contract")
        return 1 if failures else 0
    if failures:
        print(f"{target}: the unmodified assembly already fails: {failures[0]}", file=sys.stderr)
        return 1
    accepted = []
    total = 0
    for what, weakened in mutants(target, assembly):
        total += 1
        if not check(target, weakened):
            accepted.append(what)
    for what in accepted:
        print(f"{target}: the checker accepted a weakened primitive: {what}", file=sys.stderr)
    if total == 0:
        print(f"{target}: no weakened copies could be made: the assembly holds none of the expected steps",
              file=sys.stderr)
        return 1
    print(f"{target}: {total - len(accepted)} of {total} weakened copies rejected")
    return 1 if accepted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
