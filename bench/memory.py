"""Peak-RSS measurement from /proc, without psutil.

Linux resets a process's high-water mark (VmHWM) when "5" is written to /proc/self/clear_refs,
so one process can measure the peak of each phase: trim the heap, reset, run, read VmHWM.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re

_FIELD = re.compile(r"^(VmHWM|VmRSS):\s+(\d+) kB", re.M)


def status() -> dict[str, int]:
    """Current and peak resident set size in bytes."""
    with open("/proc/self/status") as f:
        return {k: int(v) * 1024 for k, v in _FIELD.findall(f.read())}


def rss() -> int:
    return status()["VmRSS"]


def reset_peak() -> int:
    """Collect garbage, give free heap back to the OS, reset VmHWM; returns the RSS baseline."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss()


def peak() -> int:
    return status()["VmHWM"]
