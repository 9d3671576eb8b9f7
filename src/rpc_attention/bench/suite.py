"""One benchmark run: every case group in one process, then memory, ratios, targets and the report.

Everything runs in one process and one run, interleaved, so every figure is a ratio against a
baseline measured beside it (on a shared machine absolute times drift; interleaved ratios much less).
Time: :class:`torch.utils.benchmark.Timer` ``blocked_autorange`` after warm-up; ``repeats`` rounds over
all cases of a group, the median of each round recorded; tables give the median over rounds with
min-max, and ratios are taken round by round before their median.

A group of cases (:class:`CaseGroup`) measures, measures memory after all timings, finishes (summaries
and ratios) and renders its Markdown; :data:`CASE_GROUPS` lists them in run order, and a new benchmark
is one module with its four functions plus one line in that list.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .config import Config
from .measure import HeapControl, cpu_peak_supported, environment, load_average
from .models import bench_models, finish_models, model_memory
from .ops import bench_ops, finish_ops, op_memory
from .output import header_markdown, models_markdown, ops_markdown, targets_markdown, write_files
from .targets import targets


@dataclass(frozen=True)
class CaseGroup:
    """A part of the suite whose rows land in ``results[key]`` (``--only KEY`` runs it alone):
    ``measure(cfg, device, progress) -> rows`` times them, ``memory(rows, device, progress, heap)`` adds
    memory figures after all timings, ``finish(rows)`` adds summaries and ratios and leaves them JSON-ready,
    ``markdown(rows) -> lines`` renders them."""

    key: str
    measure: Callable[[Config, torch.device, bool], List[dict]]
    memory: Callable[[List[dict], torch.device, bool, Optional[HeapControl]], None]
    finish: Callable[[List[dict]], None]
    markdown: Callable[[List[dict]], List[str]]


CASE_GROUPS: List[CaseGroup] = [
    CaseGroup("ops", bench_ops, op_memory, finish_ops, ops_markdown),
    CaseGroup("models", bench_models, model_memory, finish_models, models_markdown),
]


def _memory_method(device: torch.device, heap: Optional[HeapControl]) -> str:
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated over the call, minus memory allocated before"
    if cpu_peak_supported(heap):
        return ("peak RSS (VmHWM reset via /proc/self/clear_refs) over the call minus RSS before, "
                "after malloc_trim(0), glibc mmap threshold pinned to 64 KiB; measured after all timings")
    if heap is None:
        return "peak not measured (CPU peak needs benchmarks/run.py's heap control); saved-tensor bytes only"
    return "unavailable on this platform (peak); saved-tensor bytes only"


def _selected(only: Optional[Sequence[str]]) -> List[CaseGroup]:
    known = [g.key for g in CASE_GROUPS]
    unknown = [k for k in (only or []) if k not in known]
    if unknown:
        raise ValueError(f"unknown benchmark group(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return [g for g in CASE_GROUPS if only is None or g.key in only]


def run_suite(cfg: Config, device="cpu", progress: bool = True, only: Optional[Sequence[str]] = None,
              heap: Optional[HeapControl] = None) -> dict:
    """Run the case groups (all, or the keys ``only`` names) and return a JSON-serialisable result dict.

    ``heap``: the C-heap control CPU peak memory needs (``benchmarks/run.py`` passes glibc's); without
    it CPU rows get saved-tensor bytes only."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    groups = _selected(only)
    results: Dict = {"config": cfg.name, "env": environment(device)}
    t0 = time.perf_counter()
    rows = {g.key: g.measure(cfg, device, progress) for g in groups}
    results["env"]["load_average_after_timing"] = load_average()
    mem_method = None
    if cfg.memory:
        mem_method = _memory_method(device, heap)
        try:
            for g in groups:
                g.memory(rows[g.key], device, progress, heap)
        finally:
            if heap is not None:
                heap.unpin()
    for g in groups:
        g.finish(rows[g.key])
    results.update({g.key: rows.get(g.key, []) for g in CASE_GROUPS})
    results["memory_method"] = mem_method
    results["targets"] = targets(results)
    results["env"]["load_average_end"] = load_average()
    results["env"]["wall_s"] = round(time.perf_counter() - t0, 1)
    return results


def to_markdown(results: dict) -> str:
    """The Markdown report of a suite run: environment, targets, then each case group's tables."""
    lines = header_markdown(results) + targets_markdown(results.get("targets") or [])
    for g in CASE_GROUPS:
        lines += g.markdown(results.get(g.key, []))
    return "\n".join(lines) + "\n"


def write_results(results: dict, out_dir: str) -> Dict[str, str]:
    """Write ``bench-<config>-<device>.json`` and ``.md`` into ``out_dir``; returns their paths."""
    return write_files(results, to_markdown(results), out_dir)
