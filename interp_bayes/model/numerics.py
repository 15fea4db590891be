"""The numeric mode of float32 matrix products on the CPU: strict IEEE float32, or oneDNN's path with its
floating-point math mode at bf16 (``torch.backends.mkldnn.matmul.fp32_precision = "bf16"``).

What that mode computes (docs/performance.md, "Numeric modes", with sources): torch sends a float32 matrix product
(``mm``, ``addmm`` and so ``F.linear``, ``bmm``, ``baddbmm``) larger than 16**3 multiply-adds to oneDNN instead of
MKL only where the CPU has AVX-512 (F, BW, VL, DQ) or AVX-NE-CONVERT; elsewhere the setting changes nothing. oneDNN
takes the mode as a permission, not an order: its matmul rounds the float32 inputs to bfloat16 only on AMX
(Sapphire Rapids and later); on other CPUs it runs its own float32 kernel, IEEE products and float32 sums in its
own blocking order. ``auto`` therefore takes the oneDNN path where torch sends products to it and oneDNN keeps
float32 (the speed there is the kernel's: 1.55-1.65x on AMD EPYC, issue 37), and strict IEEE elsewhere, AMX included:
bfloat16 inputs are never the default (DESIGN.md, "Numerics on the CPU").
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from pathlib import Path

import torch

from ..core.errors import ConfigError

REQUESTS = ("auto", "ieee", "fast")  # what a user asks for (``--float32``)
IEEE, ONEDNN = "ieee", "onednn-bf16"  # what ran: the resolved mode, recorded in env.json and the cache keys
ENV = "INTERP_BAYES_FLOAT32"  # a machine-wide answer for ``auto`` (``ieee`` or ``fast``), e.g. a CI's strict IEEE
_AVX512_CORE = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux names them (/proc/cpuinfo); empty where that file is not there."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def onednn_routes() -> bool:
    """Whether torch sends float32 matrix products to oneDNN under the mode: mkldnn built in, and AVX-512 core or
    AVX-NE-CONVERT (``ideep::has_bf16_type_support``; without /proc/cpuinfo, torch's own AVX512 capability)."""
    if not torch.backends.mkldnn.is_available():
        return False
    flags = cpu_flags()
    if not flags:
        return torch.backends.cpu.get_cpu_capability() == "AVX512"
    return _AVX512_CORE <= flags or "avx_ne_convert" in flags


def onednn_rounds_to_bf16() -> bool:
    """Whether oneDNN's matmul would round float32 inputs to bfloat16 under the mode (its bf32 path needs AMX)."""
    return "amx_bf16" in cpu_flags()


def resolve_float32(requested: str, device: str | None = None) -> str:
    """The mode that runs for ``requested`` (``auto``, ``ieee`` or ``fast``) on this machine: ``onednn-bf16`` where
    the setting reaches a product (a CPU model and a CPU that torch sends to oneDNN; ``auto`` also needs oneDNN to
    keep float32, i.e. no AMX, and ``INTERP_BAYES_FLOAT32`` not ``ieee``), else ``ieee``. A mode that changes nothing
    resolves to ``ieee``, so that it shares the IEEE run's cache."""
    if requested not in REQUESTS:
        raise ConfigError(f"The float32 mode must be one of {', '.join(REQUESTS)}, not {requested!r}.")
    if requested == "auto":
        forced = os.environ.get(ENV, "").strip().lower()
        if forced not in ("", "ieee", "fast"):
            raise ConfigError(f"{ENV} must be ieee or fast (or unset), not {forced!r}.")
        requested = forced or ("ieee" if onednn_rounds_to_bf16() else "fast")
    # the loader's default device: cuda when there is one
    on_cpu = torch.device(device).type == "cpu" if device else not torch.cuda.is_available()
    return ONEDNN if requested == "fast" and on_cpu and onednn_routes() else IEEE


@contextmanager
def float32_mode(mode: str = "auto"):
    """Run float32 matrix products (and convolutions) on the CPU in ``mode`` (``auto``, ``ieee``, ``fast``, or a
    resolved name) while the context lasts; yields the resolved mode. The previous settings come back on exit,
    an exception included. ``with ib.float32_mode("ieee"):`` pins strict IEEE float32 for a comparison."""
    resolved = mode if mode in (IEEE, ONEDNN) else resolve_float32(mode)
    mkldnn = torch.backends.mkldnn
    before = mkldnn.matmul.fp32_precision, mkldnn.conv.fp32_precision
    value = "bf16" if resolved == ONEDNN else "ieee"
    try:
        mkldnn.matmul.fp32_precision = mkldnn.conv.fp32_precision = value
        yield resolved
    finally:
        mkldnn.matmul.fp32_precision, mkldnn.conv.fp32_precision = before
