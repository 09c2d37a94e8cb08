"""What this machine can run fast: CPU instruction sets, accelerators, and
the precision / XLA setting chosen for `precision="auto"` and
`jit_compile="auto"`.

The choice is a rule, not a timing taken at start-up: a timing of a few steps
varies by +-10% on a shared machine and would make the same recipe train in
different precisions from one run to the next. The rule encodes what
`bench/throughput.py` measured side by side on each CPU kind (README,
Performance):

- AVX-512 with AVX512_BF16 or AMX (e.g. AMD Zen 4, Intel Sapphire Rapids):
  oneDNN runs bfloat16 matmuls at about twice the float32 rate, but XLA's CPU
  dot emitter does not use those instructions, so bfloat16 without XLA wins
  (Ti/16 at 224: train 24.9 vs 18.1 img/s for float32 with XLA; infer 92.3
  vs 62).
- AVX2 without native bfloat16 (e.g. AMD Zen 3): bfloat16 is emulated and
  slower than float32 (126 vs 134 GFLOP/s); float32 with XLA is the fastest
  setting measured for training and inference (12.3 and 50.4 img/s).
- Float32 on an AVX-512 CPU: without XLA is level in training (17.1 vs 16.5
  img/s) and faster in inference (52.3 vs 50.5): oneDNN fuses the
  projections with their bias and GELU.
- Models too small for their matmuls to dominate (the digits recipe's: under
  `SMALL_MODEL_MACS` multiply-adds per image) are bound by per-op overhead,
  where bfloat16's casts cost more than its matmuls save: float32 there.
- GPUs: bfloat16 where the GPU has it (compute capability >= 8.0), else
  float16; XLA on.

Imports nothing of keras_vit; TensorFlow only when asked about devices.
"""

from __future__ import annotations

import functools
import os
import platform

# Flags that decide the setting, as /proc/cpuinfo names them.
CPU_FEATURES = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
)
# Multiply-adds per image under which a model counts as overhead-bound. The
# digits recipe's model is ~8e6, ViT-Ti/16 at 224 is ~1.26e9.
SMALL_MODEL_MACS = 1e8
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


@functools.cache
def cpu_name() -> str:
    for line in _cpuinfo_lines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo (empty on
    systems without it)."""
    for line in _cpuinfo_lines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _cpuinfo_lines() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
            return file.read().splitlines()
    except OSError:
        return []


# What a oneDNN ISA cap (ONEDNN_MAX_CPU_ISA, oneDNN's own variable) takes
# away. Under a cap below AVX512_CORE_BF16 on a CPU that reports bfloat16,
# TensorFlow still hands bfloat16 ops to oneDNN, which then refuses them
# (measured on Zen 4 with the cap at AVX2: the process aborts), so keras_vit's
# automatic choices follow the cap, not /proc/cpuinfo.
_AVX512 = frozenset({"avx512f", "avx512_vnni", "avx512_bf16"})
_AMX = frozenset({"amx_tile", "amx_bf16"})
_ONEDNN_CAPS = {
    "SSE41": _AVX512 | _AMX | {"avx2", "fma"},
    "AVX": _AVX512 | _AMX | {"avx2", "fma"},
    "AVX2": _AVX512 | _AMX,
    "AVX2_VNNI": _AVX512 | _AMX,
    "AVX2_VNNI_2": _AVX512 | _AMX,
    "AVX512_CORE": frozenset({"avx512_vnni", "avx512_bf16"}) | _AMX,
    "AVX512_CORE_VNNI": frozenset({"avx512_bf16"}) | _AMX,
    "AVX512_CORE_BF16": _AMX,
    "AVX512_CORE_FP16": _AMX,
    "AVX10_1_512": _AMX,
}


def onednn_isa_cap() -> str | None:
    """ONEDNN_MAX_CPU_ISA when it is set to a cap (not DEFAULT / ALL)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    return cap if cap and cap not in ("DEFAULT", "ALL") else None


def usable_cpu_flags(flags: frozenset[str] | None = None) -> frozenset[str]:
    """`flags` (default: this CPU's) less what a oneDNN ISA cap forbids."""
    flags = cpu_flags() if flags is None else flags
    return flags - _ONEDNN_CAPS.get(onednn_isa_cap() or "", frozenset())


def cpu_has_fast_bfloat16(flags: frozenset[str] | None = None) -> bool:
    flags = usable_cpu_flags() if flags is None else flags
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bfloat16_refused_by_onednn() -> bool:
    """Whether a oneDNN ISA cap forbids bfloat16 on a CPU that has it: then
    TensorFlow, which reads the CPU and not the cap, hands bfloat16 ops to
    oneDNN, which refuses them and the process aborts (a real AVX2 CPU runs
    them in Eigen instead)."""
    return cpu_has_fast_bfloat16(cpu_flags()) and not cpu_has_fast_bfloat16()


def gpu_compute_capabilities() -> list[tuple[int, int]]:
    """One `(major, minor)` per visible GPU; empty without GPUs."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    found = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        found.append(tuple(details.get("compute_capability", (0, 0))))
    return found


def describe() -> dict:
    """The machine facts a result depends on, for metadata and benchmarks."""
    flags = cpu_flags()
    return {
        "cpu": cpu_name(),
        "cpu_flags": [f for f in CPU_FEATURES if f in flags],
        "onednn_max_cpu_isa": onednn_isa_cap(),
        "cpu_count": os.cpu_count(),
        "gpus": [list(cc) for cc in gpu_compute_capabilities()],
    }


def choose_settings(
    macs_per_image: float,
    precision: str = "auto",
    jit_compile: bool | str = "auto",
    *,
    gpus: list[tuple[int, int]] | None = None,
    flags: frozenset[str] | None = None,
) -> dict:
    """Resolves `"auto"` in `precision` and `jit_compile` for a model doing
    `macs_per_image` multiply-adds per image (training and inference follow
    the same rule; a setting given explicitly is kept, and XLA is then chosen
    for the precision in force).

    Returns `{"precision", "jit_compile", "reason", "auto": [keys resolved]}`.
    """
    if precision != "auto" and precision not in PRECISIONS:
        raise ValueError(
            f"precision must be 'auto' or one of {list(PRECISIONS)}, got {precision!r}."
        )
    if jit_compile not in ("auto", True, False):
        raise ValueError(
            f"jit_compile must be 'auto', true or false, got {jit_compile!r}."
        )
    on_this_cpu = flags is None
    gpus = gpu_compute_capabilities() if gpus is None else gpus
    flags = usable_cpu_flags() if flags is None else flags
    if precision == "mixed_bfloat16" and not gpus and on_this_cpu:
        if bfloat16_refused_by_onednn():
            raise ValueError(
                f"precision 'mixed_bfloat16' cannot run here: ONEDNN_MAX_CPU_ISA="
                f"{onednn_isa_cap()} caps oneDNN below bfloat16 on a CPU that has "
                "it, and TensorFlow would hand bfloat16 to oneDNN, which aborts; "
                "use precision float32 (or auto), or unset ONEDNN_MAX_CPU_ISA."
            )
    resolved = []
    if precision == "auto":
        resolved.append("precision")
        if gpus:
            precision = "mixed_bfloat16" if min(gpus) >= (8, 0) else "mixed_float16"
        elif macs_per_image >= SMALL_MODEL_MACS and cpu_has_fast_bfloat16(flags):
            precision = "mixed_bfloat16"
        else:
            precision = "float32"
    if gpus:
        reason = f"GPU compute capability {'.'.join(map(str, min(gpus)))}"
        best_jit = True
    elif macs_per_image < SMALL_MODEL_MACS:
        # Only what was chosen here: a given precision is not "float32".
        chosen = ["float32"] if "precision" in resolved else []
        chosen += ["without XLA"] if jit_compile == "auto" else []
        reason = (
            f"{macs_per_image / 1e6:.1f}M MACs per image: per-op overhead "
            "dominates" + (", " + " ".join(chosen) if chosen else "")
        )
        best_jit = False
    elif precision != "float32":
        reason = "CPU with native bfloat16 (oneDNN); XLA's CPU dots do not use it"
        best_jit = False
    elif "avx512f" in flags:
        reason = "AVX-512 CPU, float32: oneDNN's fused matmuls match or beat XLA"
        best_jit = False
    else:
        reason = "AVX2 CPU, float32: XLA fuses the element-wise work around the dots"
        best_jit = True
    if jit_compile == "auto":
        jit_compile = best_jit
        resolved.append("jit_compile")
    return {
        "precision": precision,
        "jit_compile": bool(jit_compile),
        "reason": reason,
        "auto": resolved,
    }


__all__ = [
    "CPU_FEATURES",
    "bfloat16_refused_by_onednn",
    "SMALL_MODEL_MACS",
    "choose_settings",
    "cpu_flags",
    "cpu_has_fast_bfloat16",
    "cpu_name",
    "describe",
    "gpu_compute_capabilities",
    "onednn_isa_cap",
    "usable_cpu_flags",
]
