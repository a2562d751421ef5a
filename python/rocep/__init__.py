"""rocep: expert-parallel MoE dispatch and combine, on AMD and NVIDIA GPUs or the CPU reference.

The native API mirrors the C++ one (include/rocep/ep_group.hpp): ``EpConfig``, ``Group`` created over a
bootstrap (``rocep.bootstrap``) in either layout, its fused and split dispatch / combine on arrays, and
``silu_and_quantize``; the submodules ``bootstrap``, ``bf16`` (bf16 bits in numpy) and ``accuracy``
(``calc_diff``) come with ``import rocep``.
``rocep.EpDispatchCombineConfig`` / ``rocep.EpDispatchCombineOp`` (module ``rocep.mori``) are a MoRI-shaped
op. Exceptions are ``rocep.Error`` and its subclasses. ``rocep.build_info()`` says what the installed build
is (its version, ``rocep.__version__``, and its GPU platform: "none" runs every group on the CPU reference).
"""

from ._rocep import (
    ALL_SMS,
    DEFAULT_SMS,
    Backend,
    BootstrapError,
    CombineDtype,
    CallOrderError,
    ConfigError,
    EpConfig,
    Error,
    Fp8Encoding,
    GpuRuntimeError,
    InvalidInputError,
    Layout,
    TimeoutError,
    TokenFormat,
    build_info,
    format_input_row_bytes,
    format_payload_bytes,
    format_scale_bytes,
    format_scale_tensor_bytes,
    silu_and_quantize,
)
from . import accuracy, bf16, bootstrap  # rocep.bootstrap.from_torch() etc. after a bare `import rocep`
from .group import DispatchResult, ExpandedResult, Group, RecordedError
from .mori import EpDispatchCombineConfig, EpDispatchCombineOp

__version__ = build_info()["version"]

__all__ = [
    "ALL_SMS",
    "DEFAULT_SMS",
    "Backend",
    "BootstrapError",
    "CombineDtype",
    "CallOrderError",
    "ConfigError",
    "DispatchResult",
    "EpDispatchCombineConfig",
    "EpDispatchCombineOp",
    "ExpandedResult",
    "EpConfig",
    "Error",
    "Fp8Encoding",
    "GpuRuntimeError",
    "Group",
    "InvalidInputError",
    "Layout",
    "RecordedError",
    "TimeoutError",
    "TokenFormat",
    "accuracy",
    "bf16",
    "bootstrap",
    "build_info",
    "format_input_row_bytes",
    "format_payload_bytes",
    "format_scale_bytes",
    "format_scale_tensor_bytes",
    "silu_and_quantize",
]
