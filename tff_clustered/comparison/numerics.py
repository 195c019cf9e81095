"""What a table's numbers depend on besides the code, the command and the seed.

What a table's numbers depend on besides the code, the command and the seed: the CPU's
instruction sets and TensorFlow's numerics settings (oneDNN, thread counts). A comparison
table records them in its header (`machine_lines`); `binaries/check_results.py` reads them
back (`machine_fields`) and says when a rerun's differ from the committed table's, since
TensorFlow's CPU kernels round differently by instruction set and setting
(docs/reproducibility.md, "On another machine").

Importing this module does not load TensorFlow; `machine_lines` does.
"""

from __future__ import annotations

import os
import platform
import re
from typing import Optional

# The /proc/cpuinfo flags that decide which kernels (and so which rounding) TensorFlow's and
# oneDNN's CPU code picks: vector widths, fused multiply-add, and the reduced-precision dot
# products (bf16, fp16, int8 VNNI; AMX tiles).
NUMERIC_CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# The environment variables TensorFlow reads for them when it starts (oneDNN's graph rewrites
# and kernels; the intra- and inter-op thread pools of a session left at 0 threads).
NUMERICS_VARIABLES = ("TF_ENABLE_ONEDNN_OPTS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
# The header fields: `- cpu: ...` and `- numerics: ...`.
MACHINE_FIELDS = ("cpu", "numerics")
_FIELD = re.compile(r"^- (cpu|numerics): (.*?)\s*$", re.MULTILINE)
# `TF_ENABLE_ONEDNN_OPTS=0` or `TF_NUM_INTRAOP_THREADS unset` in a `- numerics:` line.
_VARIABLE = re.compile(r"\b(TF_[A-Z_]+)(?:=([^,)\s]*)| unset\b)")


def cpuinfo_fields(cpuinfo: Optional[str] = None) -> dict[str, str]:
    """The first CPU's fields of /proc/cpuinfo (or of `cpuinfo` given), by name (`model name`,
    `flags`, ...); none where there is no /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_text(cpuinfo: Optional[str] = None) -> str:
    """The CPU's model name and its `NUMERIC_CPU_FLAGS` (from /proc/cpuinfo, or `cpuinfo`
    given), e.g. `Intel(R) Xeon(R) Processor (x86_64); sse4_2 avx avx2 fma avx512f`; the
    machine type and `flags not known` where there is no /proc/cpuinfo."""
    fields = cpuinfo_fields(cpuinfo)
    model = fields.get("model name") or platform.processor() or "unknown CPU"
    if "flags" not in fields:
        return f"{model} ({platform.machine()}); flags not known"
    present = set(fields["flags"].split())
    flags = " ".join(f for f in NUMERIC_CPU_FLAGS if f in present) or "none of them"
    return f"{model} ({platform.machine()}); {flags}"


def numerics_text(tensorflow_version: str, onednn_on: bool) -> str:
    """TensorFlow's version, whether its oneDNN optimizations are on, the numerics variables
    as set (or unset) and the CPUs this process may use."""
    variables = ", ".join(
        f"{v}={os.environ[v]}" if v in os.environ else f"{v} unset" for v in NUMERICS_VARIABLES
    )
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"TensorFlow {tensorflow_version}, oneDNN {'on' if onednn_on else 'off'} ({variables}); "
        f"{usable} CPUs usable"
    )


def machine_lines() -> list[str]:
    """The header lines of a table written in this process (TensorFlow loaded here)."""
    import tensorflow as tf
    from tensorflow.python.util import _pywrap_util_port

    # IsMklEnabled: whether TensorFlow's oneDNN optimizations are on in this process (x86
    # Linux builds: on unless TF_ENABLE_ONEDNN_OPTS=0).
    onednn_on = bool(_pywrap_util_port.IsMklEnabled())
    return [f"- cpu: {cpu_text()}", f"- numerics: {numerics_text(tf.__version__, onednn_on)}"]


def machine_fields(markdown: str) -> dict[str, str]:
    """The `MACHINE_FIELDS` a table's header records (absent in tables written before they
    were recorded)."""
    header = markdown.split("\n|", 1)[0]  # the lines before the first table
    return {m.group(1): m.group(2) for m in _FIELD.finditer(header)}


def recorded_variables(numerics: str) -> dict[str, Optional[str]]:
    """The `NUMERICS_VARIABLES` a `- numerics:` line records, each with its value (None:
    unset), so that a rerun can run under the settings the table was written with."""
    return {
        m.group(1): m.group(2)
        for m in _VARIABLE.finditer(numerics)
        if m.group(1) in NUMERICS_VARIABLES
    }
