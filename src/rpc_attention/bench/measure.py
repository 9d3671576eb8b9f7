"""How the suite measures: process set-up, timing, peak and saved-for-backward memory, summaries.

Memory (documented in ``docs/performance.md``):

* ``peak``: extra memory at the high-water mark of one call over what was allocated before it.
  CUDA: ``torch.cuda.max_memory_allocated``. CPU: the process's peak resident set (``VmHWM``, reset
  through ``/proc/self/clear_refs``) after ``malloc_trim(0)`` returned free heap pages, with glibc's
  mmap threshold pinned to 64 KiB so that large buffers are mapped on allocation and unmapped on
  free; measured after all timings. The heap settings are the runner's (``benchmarks/run.py`` passes a
  :class:`HeapControl`); without one, CPU peak is not measured.
* ``saved``: bytes of the distinct tensors autograd keeps for backward (``saved_tensors_hooks``),
  excluding the inputs themselves: the activation memory a forward leaves behind.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import math
import os
import platform
import statistics
import sys
from typing import Callable, Dict, List, Optional, Protocol, Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

logger = logging.getLogger("rpc_attention.bench")

_FLUSH_DENORMAL = [False]


def setup_process(threads: Optional[int] = None) -> None:
    """Flush denormals to zero (set before the thread pool starts, so its workers inherit it) and
    fix the thread count. PAP's cleaned keys make the attention nearly one-hot on random inputs;
    its backward then runs through denormal floats, which x86 processes 10-100x slower."""
    _FLUSH_DENORMAL[0] = bool(torch.set_flush_denormal(True))
    if threads:
        torch.set_num_threads(int(threads))


def load_average() -> Optional[List[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment(device: torch.device) -> dict:
    """Date, versions, processor, threads and load: what a reader needs to compare two result files."""
    env = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "flush_denormal": _FLUSH_DENORMAL[0],
        "load_average_start": load_average(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["amp"] = "bf16 autocast, SDPA flash backend"
    return env


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], min_run_time: float) -> float:
    """Median seconds per call of ``fn()`` (``torch.utils.benchmark.Timer.blocked_autorange``)."""
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


class HeapControl(Protocol):
    """Control of the C heap that CPU peak memory needs (``benchmarks/glibc_heap.py`` has glibc's).

    ``pin`` makes freed tensor buffers go back to the OS so that RSS tracks live memory (True when it
    worked), ``trim`` hands free heap pages back before a measurement, ``unpin`` restores the
    allocator's usual behaviour once the memory measurements are done.
    """

    def pin(self) -> bool: ...

    def trim(self) -> None: ...

    def unpin(self) -> None: ...


def _rss_status() -> Dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, val = line.split(":")
                out[key] = int(val.split()[0]) * 1024
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def cpu_peak_supported(heap: Optional[HeapControl]) -> bool:
    """Whether CPU peak memory can be measured: Linux, a heap control that pinned, a resettable VmHWM."""
    if heap is None or not sys.platform.startswith("linux") or not heap.pin():
        return False
    try:
        _reset_peak()
        _rss_status()
        return True
    except OSError:
        return False


def peak_bytes(fn: Callable[[], object], device: torch.device, heap: Optional[HeapControl] = None) -> Optional[int]:
    """Extra memory at the high-water mark of ``fn()`` over what was live before (see module doc).

    On CPU it needs ``heap`` (without one, or off Linux, the result is None)."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    if not cpu_peak_supported(heap):
        return None
    fn()  # warm: first-call allocations (thread buffers, kernels) are not the operator's
    heap.trim()  # give free heap pages back: reusing them during the call shows up in RSS again
    base = _rss_status()["VmRSS"]
    _reset_peak()
    fn()
    return max(0, _rss_status()["VmHWM"] - base)


def saved_bytes(forward: Callable[[], object], exclude: Sequence[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saves for backward during ``forward()``."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: Dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in skip and ptr not in seen:
                seen[ptr] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return int(sum(seen.values()))


def summary(values: Sequence[Optional[float]]) -> dict:
    """Median, min, max and count of the finite values (all None when there are none)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def autocast(device: torch.device):
    """bf16 autocast on CUDA, nothing on CPU."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sdpa_backend(device: torch.device):
    """The flash / memory-efficient SDPA kernels on CUDA (math as the fallback), torch's choice on CPU."""
    if device.type == "cuda":
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    return contextlib.nullcontext()


def error_text(exc: BaseException, limit: int = 200) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters: a failed case's note."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:limit] if str(exc) else ''}"


def progress(msg: str, enabled: bool) -> None:
    if enabled:
        logger.info(msg)
