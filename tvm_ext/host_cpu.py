"""The host CPU as the OS describes it: its model and its cache sizes (Linux sysfs, /proc/cpuinfo).

Schedules and the tuner's features size tiles against the caches of the machine that runs
the kernels, and tuning records name the CPU that measured them. LLVM's CPU name (``znver4``)
says which instructions exist, not how large the caches are: those come from here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class Caches:
    """Bytes of one core's L1 data and L2 caches, and of the L3 slice a core shares."""

    l1d: int
    l2: int
    l3: int


def _size(text: str) -> int:
    """sysfs's "48K" / "1024K" / "32M" in bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


@functools.lru_cache(maxsize=1)
def host_caches() -> Caches | None:
    """The host's cache sizes, or None where the OS does not say (not Linux, a container
    without sysfs): callers then keep their defaults."""
    sizes: dict[int, int] = {}
    try:
        for index in sorted(_SYSFS.glob("index*")):
            kind = (index / "type").read_text().strip()
            if kind in ("Data", "Unified"):
                sizes[int((index / "level").read_text())] = _size((index / "size").read_text())
    except (OSError, ValueError):
        return None
    if 1 not in sizes or 2 not in sizes:
        return None
    return Caches(l1d=sizes[1], l2=sizes[2], l3=sizes.get(3, sizes[2]))


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo; empty where the OS does not say."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if not sep:
                if fields:
                    break  # the first processor's block is enough
                continue
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return {}
    return fields


def host_cpu_name() -> str:
    """The host CPU's model, e.g. "AMD EPYC (family 26, model 2)": a hypervisor may shorten the
    model name, so the family and model numbers are added; "" where the OS does not say."""
    fields = _cpuinfo()
    name = fields.get("model name", "")
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name.strip()


def host_cpu_flags() -> frozenset[str]:
    """The instruction-set flags the OS reports for the host CPU (``avx2``, ``avx512f``, ...);
    empty where it does not say."""
    return frozenset(_cpuinfo().get("flags", "").split())


__all__ = ["Caches", "host_caches", "host_cpu_flags", "host_cpu_name"]
