"""bf16 in numpy, which has no bfloat16 type: the bits as uint16, as rocep's calls take them on the CPU
reference."""

import numpy as np


def from_float(values) -> np.ndarray:
    """bf16 bits of float values (rounded to float32 first), to nearest, ties to even. Finite values only:
    a NaN's payload is not kept."""
    words = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((words + 0x7FFF + ((words >> 16) & 1)) >> 16).astype(np.uint16)


def to_float(bits) -> np.ndarray:
    """The float32 values of bf16 bits (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
