"""Benchmark suite: what PAP costs next to the attention calls it makes (``rpc-attention bench``).

Everything runs in one process and one run, interleaved, so every figure is a ratio against a
baseline measured beside it (the machine this was written on has 2 cores shared by several users;
absolute times drift, interleaved ratios much less).

Operator level (``(B, H, N, d)`` keys and values, forward and forward+backward):

* ``sdpa``: one plain symmetric attention on the fused kernel, ``softmax(s K K^T) V`` (the baseline);
* ``pap n``: :func:`rpc_attention.functional.pap_attention` with ``n`` iterations (the fused path);
* ``official n``: :func:`official_pap`, PAP the way the official code computes it (the kernel's
  explicit path: matmul-softmax-matmul per iteration, Y-form updates, plain autograd);
* options: ``ckpt`` (``checkpoint_iters=True``), ``compile`` (``torch.compile`` of the fused path,
  full runs only), ``tol`` (early stopping, forward only).

Model level: a training step (forward, cross-entropy, backward, AdamW step) and inference throughput
for SymViT-tiny, RPC-SymViT-tiny 6iter/layer1 and 2iter/all-layer, timm's DeiT-tiny (asymmetric),
FAN-tiny (asymmetric, the baseline of its family), SymFAN-tiny and RPC-FAN-tiny 4iter/layer1, and
Symlm-small vs RPC-Symlm-small (PAP in blocks 0-3, 4 iterations).

Time: :class:`torch.utils.benchmark.Timer` ``blocked_autorange`` after warm-up; ``repeats`` rounds over
all cases of a group, the median of each round recorded; tables give the median over rounds with
min-max, and ratios are taken round by round before their median.

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
import functools
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import functional as RF
from .files import atomic_write_text
from .markdown import markdown_table

logger = logging.getLogger(__name__)

__all__ = ["official_pap", "OpShape", "Config", "config", "run_suite", "to_markdown", "write_results"]


# ---------------------------------------------------------------------------------------------
# The official formulation (reference for speed and memory, written from docs/method.md#the-loop)
# ---------------------------------------------------------------------------------------------

def official_pap(k, v, n_iter: int = 6, lambd: float = 4.0, is_causal: bool = False,
                 model_dim: Optional[int] = None):
    """PAP as the official code computes it: the kernel's explicit path (``fused=False``).

    Every iteration materialises ``softmax(s K2 K2^T)``; Y-form dual updates; plain autograd through
    every operation. Global mu (``N C / (4 sum|k|)``), ``tau = lambd * mu``; with ``is_causal`` the
    mask applies in every iteration and mu is the per-position causal one.
    """
    return RF.pap_attention(k, v, n_iter=n_iter, lambd=lambd, is_causal=is_causal, model_dim=model_dim,
                            fused=False)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

@dataclass
class OpShape:
    name: str
    b: int
    h: int
    n: int
    d: int
    causal: bool = False
    pap_iters: Sequence[int] = (1, 2, 4, 6)
    official_iters: Sequence[int] = (1, 2, 4, 6)
    options: Sequence[str] = ("ckpt", "tol")  # on the largest n
    timed: bool = True  # False: memory only (too slow to time on small machines)


@dataclass
class Config:
    name: str
    shapes: List[OpShape]
    models: Sequence[str] = ("symvit", "rpc6_layer1", "rpc2_all", "deit")
    lms: Sequence[str] = ("symlm", "rpc_symlm")
    fans: Sequence[str] = ("fan", "symfan", "rpc_fan")
    img_size: int = 224
    vision_kwargs: Dict = field(default_factory=dict)
    fan_kwargs: Dict = field(default_factory=dict)
    train_batch: int = 8
    infer_batch: int = 16
    lm_kwargs: Dict = field(default_factory=dict)
    lm_batch: int = 8
    lm_context: int = 256
    repeats: int = 3
    min_run_time: float = 0.5
    model_min_run_time: float = 1.0
    compile: bool = False
    memory: bool = True


def config(name: str = "full") -> Config:
    """Named configurations: ``full`` (documented figures), ``quick`` (< 3 min on 2 cores) and
    ``smoke`` (seconds; exercises the machinery on toy shapes, used by the tests)."""
    if name == "full":
        return Config(
            "full",
            shapes=[
                OpShape("deit-b8", 8, 3, 197, 64, options=("ckpt", "compile", "tol")),
                OpShape("deit-b64", 64, 3, 197, 64, pap_iters=(1, 2, 6), official_iters=(2, 6), options=()),
                OpShape("lm", 8, 8, 256, 16, causal=True, official_iters=(2, 6)),
                OpShape("long-1024", 2, 3, 1024, 64, pap_iters=(1, 2, 6), official_iters=(1, 2, 6)),
                OpShape("long-4096", 1, 3, 4096, 64, pap_iters=(1, 2, 6), official_iters=(2,),
                        options=("ckpt",), timed=False),
            ],
            repeats=3, min_run_time=0.5, compile=True,
        )
    if name == "quick":
        return Config(
            "quick",
            shapes=[
                OpShape("deit-b8", 8, 3, 197, 64, pap_iters=(1, 2, 6), official_iters=(2, 6)),
                OpShape("lm", 8, 8, 256, 16, causal=True, pap_iters=(2, 4), official_iters=(2,), options=()),
                OpShape("long-1024", 1, 3, 1024, 64, pap_iters=(2,), official_iters=(2,), options=("ckpt",)),
                OpShape("long-4096", 1, 3, 4096, 64, pap_iters=(1, 6), official_iters=(), options=("ckpt",),
                        timed=False),
            ],
            models=("symvit", "rpc6_layer1", "rpc2_all", "deit"), lms=("symlm", "rpc_symlm"),
            img_size=224, train_batch=4, infer_batch=8, lm_batch=4, lm_context=128,
            repeats=2, min_run_time=0.2, model_min_run_time=0.2,
        )
    if name == "smoke":
        return Config(
            "smoke",
            shapes=[
                OpShape("tiny", 2, 2, 12, 8, pap_iters=(1, 3), official_iters=(3,), options=("ckpt", "tol")),
                OpShape("tiny-causal", 1, 2, 10, 4, causal=True, pap_iters=(2,), official_iters=(2,), options=()),
                OpShape("tiny-mem", 1, 1, 64, 8, pap_iters=(2,), official_iters=(2,), options=("ckpt",), timed=False),
            ],
            models=("symvit", "rpc6_layer1"), lms=("symlm",), img_size=32, train_batch=2, infer_batch=2,
            vision_kwargs=dict(embed_dim=32, depth=2, num_heads=2),
            fans=("fan", "rpc_fan"), fan_kwargs=dict(embed_dim=32, depth=2, num_heads=4, patch_size=8),
            lm_kwargs=dict(n_layer=1, d_model=16, n_head=2, d_inner=32), lm_batch=2, lm_context=16,
            repeats=1, min_run_time=0.01, model_min_run_time=0.01, memory=True,
        )
    raise ValueError(f"unknown benchmark configuration {name!r}; choose full, quick or smoke")


# ---------------------------------------------------------------------------------------------
# Environment and measurement helpers
# ---------------------------------------------------------------------------------------------

def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment(device: torch.device) -> dict:
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
        "load_average_start": _loadavg(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["amp"] = "bf16 autocast, SDPA flash backend"
    return env


_FLUSH_DENORMAL = [False]


def setup_process(threads: Optional[int] = None) -> None:
    """Flush denormals to zero (set before the thread pool starts, so its workers inherit it) and
    fix the thread count. PAP's cleaned keys make the attention nearly one-hot on random inputs;
    its backward then runs through denormal floats, which x86 processes 10-100x slower."""
    _FLUSH_DENORMAL[0] = bool(torch.set_flush_denormal(True))
    if threads:
        torch.set_num_threads(int(threads))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], object], min_run_time: float) -> float:
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


def _cpu_peak_supported(heap: Optional[HeapControl]) -> bool:
    if heap is None or not sys.platform.startswith("linux") or not heap.pin():
        return False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _rss_status()
        return True
    except OSError:
        return False


def peak_bytes(fn: Callable[[], object], device: torch.device, heap: Optional[HeapControl] = None) -> Optional[int]:
    """Extra memory at the high-water mark of ``fn()`` over what was live before (see module doc).

    On CPU it needs ``heap`` (without one, or off Linux, the result is None)."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    if not _cpu_peak_supported(heap):
        return None
    fn()  # warm: first-call allocations (thread buffers, kernels) are not the operator's
    heap.trim()  # give free heap pages back: reusing them during the call shows up in RSS again
    base = _rss_status()["VmRSS"]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
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


def _summary(values: List[float]) -> dict:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _sdpa_backend(device: torch.device):
    if device.type == "cuda":
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    return contextlib.nullcontext()


def _progress(msg: str, enabled: bool) -> None:
    if enabled:
        logger.info(msg)


# ---------------------------------------------------------------------------------------------
# Operator level
# ---------------------------------------------------------------------------------------------

def _op_cases(shape: OpShape, compile_ok: bool) -> List[dict]:
    causal = shape.causal
    cases = [{"case": "sdpa", "kind": "sdpa", "n": 1}]
    cases += [{"case": f"pap {n}", "kind": "pap", "n": n} for n in shape.pap_iters]
    cases += [{"case": f"official {n}", "kind": "official", "n": n} for n in shape.official_iters]
    top = max(shape.pap_iters)
    for opt in shape.options:
        if opt == "compile" and not compile_ok:
            continue
        cases.append({"case": f"pap {top} {opt}", "kind": "pap", "n": top, "option": opt})
    for c in cases:
        c["causal"] = causal
    return cases


def _op_callable(case: dict, k, v, grad_out, mode: str, device: torch.device, compiled: dict):
    kind, n, opt, causal = case["kind"], case["n"], case.get("option"), case["causal"]
    if kind == "sdpa":
        def f(a, b):
            return RF.symmetric_attention(a, b, is_causal=causal)
    elif kind == "official":
        def f(a, b):
            return official_pap(a, b, n_iter=n, is_causal=causal)
    else:
        kw = dict(n_iter=n, is_causal=causal)
        if opt == "ckpt":
            kw["checkpoint_iters"] = True
        if opt == "tol":
            kw["tol"] = 1e-2
        f = functools.partial(RF.pap_attention, **kw)
        if opt == "compile":
            key = (n, causal)
            if key not in compiled:
                compiled[key] = torch.compile(f)
            f = compiled[key]

    if mode == "fwd":
        def run():
            with torch.no_grad(), _autocast(device), _sdpa_backend(device):
                return f(k, v)
    else:
        def run():
            with _autocast(device), _sdpa_backend(device):
                out = f(k, v)
            return torch.autograd.grad(out, (k, v), grad_out.to(out.dtype))
    return run, f


def _op_inputs(shape: OpShape, device: torch.device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randn(shape.b, shape.h, shape.n, shape.d, generator=g).to(device).requires_grad_()
    v = torch.randn(shape.b, shape.h, shape.n, shape.d, generator=g).to(device).requires_grad_()
    grad_out = torch.randn(shape.b, shape.h, shape.n, shape.d, generator=g).to(device)
    return k, v, grad_out


def bench_ops(cfg: Config, device: torch.device, progress: bool = True) -> List[dict]:
    compile_ok = cfg.compile
    compiled: dict = {}
    groups = []
    for shape in cfg.shapes:
        k, v, grad_out = _op_inputs(shape, device)
        cases = _op_cases(shape, compile_ok)
        for mode in ("fwd", "fwd+bwd"):
            rows = []
            for case in cases:
                if case.get("option") == "tol" and mode != "fwd":
                    continue  # an inference option
                row = dict(case, mode=mode, times=[], compile_s=None)
                run, _ = _op_callable(case, k, v, grad_out, mode, device, compiled)
                t0 = time.perf_counter()
                try:
                    run()  # warm-up (and compilation)
                    _sync(device)
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                if case.get("option") == "compile":
                    row["compile_s"] = time.perf_counter() - t0
                row["_run"] = run
                rows.append(row)
            if shape.timed:
                for r in range(cfg.repeats):
                    _progress(f"[bench] {shape.name} {mode} round {r + 1}/{cfg.repeats}", progress)
                    for row in rows:
                        if "error" in row:
                            continue
                        row["times"].append(_time(row["_run"], cfg.min_run_time))
            if mode == "fwd" and "tol" in shape.options:
                for row in rows:
                    if row.get("option") == "tol":
                        with torch.no_grad():
                            st = RF.pap_decompose(k.detach(), v.detach(), n_iter=row["n"], tol=1e-2,
                                                  is_causal=shape.causal)
                        row["n_iter_run"] = st.n_iter_run
            groups.append({"shape": shape.name, "b": shape.b, "h": shape.h, "n": shape.n, "d": shape.d,
                           "causal": shape.causal, "mode": mode, "rows": rows, "k": k, "v": v})
    return groups


def _op_memory(groups: List[dict], device: torch.device, progress: bool, heap: Optional[HeapControl]) -> None:
    for grp in groups:
        if grp["mode"] != "fwd+bwd":
            continue
        _progress(f"[bench] memory {grp['shape']}", progress)
        k, v = grp["k"], grp["v"]
        for row in grp["rows"]:
            if "error" in row or row.get("option") == "compile":
                continue
            try:
                row["peak_bytes"] = peak_bytes(row["_run"], device, heap)
                fwd = _op_forward(row, k, v, device)
                row["saved_bytes"] = saved_bytes(fwd, exclude=(k, v))
            except RuntimeError as exc:  # e.g. out of memory
                row["mem_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def _op_forward(row: dict, k, v, device):
    run, f = _op_callable(row, k, v, None, "fwd", device, {})

    def forward():
        with _autocast(device), _sdpa_backend(device):
            return f(k, v)
    return forward


def _finish_ops(groups: List[dict]) -> None:
    """Summaries and ratios, computed round by round against the rows measured beside them."""
    for grp in groups:
        rows = {r["case"]: r for r in grp["rows"]}
        base = rows.get("sdpa")
        for row in grp["rows"]:
            row["time"] = _summary(row["times"])
            ratios = {}
            if base and base["times"] and row["times"]:
                ratios["vs_n_sdpa"] = _summary([t / (row["n"] * b) for t, b in zip(row["times"], base["times"])])
            if row["kind"] == "official":
                ours = rows.get(f"pap {row['n']}")
                if ours and ours["times"] and row["times"]:
                    ratios["official_over_pap"] = _summary([o / p for o, p in zip(row["times"], ours["times"])])
                if ours and ours.get("peak_bytes") is not None and row.get("peak_bytes"):
                    ratios["pap_peak_over_official"] = ours["peak_bytes"] / row["peak_bytes"]
                if ours and ours.get("saved_bytes") and row.get("saved_bytes"):
                    ratios["pap_saved_over_official"] = ours["saved_bytes"] / row["saved_bytes"]
            if row["kind"] == "pap" and row.get("option"):
                plain = rows.get(f"pap {row['n']}")
                if plain and plain["times"] and row["times"]:
                    ratios["vs_plain_pap"] = _summary([t / p for t, p in zip(row["times"], plain["times"])])
                if plain and plain.get("saved_bytes") and row.get("saved_bytes"):
                    ratios["saved_vs_plain_pap"] = row["saved_bytes"] / plain["saved_bytes"]
            if row["kind"] == "pap":
                one = rows.get("pap 1")
                if one and one.get("saved_bytes") and row.get("saved_bytes"):
                    ratios["saved_vs_pap1"] = row["saved_bytes"] / one["saved_bytes"]
                if one and one.get("peak_bytes") and row.get("peak_bytes"):
                    ratios["peak_vs_pap1"] = row["peak_bytes"] / one["peak_bytes"]
            row["ratios"] = ratios
        for row in grp["rows"]:
            row.pop("_run", None)
        grp.pop("k", None)
        grp.pop("v", None)


# ---------------------------------------------------------------------------------------------
# Model level
# ---------------------------------------------------------------------------------------------

_VISION = {
    "symvit": ("SymViT-tiny", "symvit_tiny_patch16_224", {}),
    "rpc6_layer1": ("RPC-SymViT-tiny 6iter/layer1", "rpc_symvit_tiny_patch16_224", dict(rpc_layers=[0], n_iter=6)),
    "rpc2_all": ("RPC-SymViT-tiny 2iter/all-layer", "rpc_symvit_tiny_patch16_224", dict(rpc_layers="all", n_iter=2)),
    "rpc6_layer1_ckpt": ("RPC-SymViT-tiny 6iter/layer1 ckpt", "rpc_symvit_tiny_patch16_224",
                         dict(rpc_layers=[0], n_iter=6)),
    "deit": ("DeiT-tiny (timm, asymmetric)", "deit_tiny_patch16_224", {}),
}


def _build_vision(key: str, cfg: Config, device: torch.device):
    import timm

    from . import models  # noqa: F401  (registers the SymViT family)

    label, name, kw = _VISION[key]
    kwargs = dict(kw, num_classes=1000, img_size=cfg.img_size, **cfg.vision_kwargs)
    if name == "deit_tiny_patch16_224":
        kwargs.pop("rpc_layers", None)
    model = timm.create_model(name, pretrained=False, **kwargs).to(device)
    if key.endswith("_ckpt"):
        for m in model.modules():
            if hasattr(m, "checkpoint_iters"):
                m.checkpoint_iters = True
    return label, model


_FAN = {
    "fan": ("FAN-tiny (asymmetric)", "fan_tiny_12_p16_224"),
    "symfan": ("SymFAN-tiny", "symfan_tiny_12_p16_224"),
    "rpc_fan": ("RPC-FAN-tiny 4iter/layer1", "rpc_fan_tiny_12_p16_224"),
}


def _build_fan(key: str, cfg: Config, device: torch.device):
    import timm

    from . import models  # noqa: F401  (registers the FAN family)

    label, name = _FAN[key]
    model = timm.create_model(name, pretrained=False, num_classes=1000, img_size=cfg.img_size, **cfg.fan_kwargs)
    return label, model.to(device)


def _build_lm(key: str, cfg: Config, device: torch.device):
    from .models.lm import build_lm

    kw = dict(vocab_size=10000, cutoffs=[2000, 6000], context=cfg.lm_context, dropout=0.0)
    kw.update(cfg.lm_kwargs)
    if key == "rpc_symlm":
        layers = list(range(min(4, kw.get("n_layer", 16))))
        kw.update(rpc_layers=layers, n_iter=4)
        label = f"RPC-Symlm-small (PAP 4 iter, blocks {layers[0]}-{layers[-1]})"
    else:
        label = "Symlm-small"
    return label, build_lm("symlm-small", **kw).to(device)


def _step_pair(model, device: torch.device, train_loss, infer_forward):
    """``(train, infer)`` closures: one optimizer step on ``train_loss()``, one no-grad ``infer_forward()``."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def train():
        model.train()
        with _autocast(device), _sdpa_backend(device):
            loss = train_loss()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        model.eval()
        with torch.no_grad(), _autocast(device), _sdpa_backend(device):
            return infer_forward()
    return train, infer


def _vision_steps(model, cfg: Config, device: torch.device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg.train_batch, 3, cfg.img_size, cfg.img_size, generator=g).to(device)
    y = torch.randint(0, 1000, (cfg.train_batch,), generator=g).to(device)
    xi = torch.randn(cfg.infer_batch, 3, cfg.img_size, cfg.img_size, generator=g).to(device)
    train, infer = _step_pair(model, device, lambda: F.cross_entropy(model(x), y), lambda: model(xi))
    return train, infer, cfg.train_batch, cfg.infer_batch


def _lm_steps(model, cfg: Config, device: torch.device):
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    idx = torch.randint(0, vocab, (cfg.lm_batch, cfg.lm_context + 1), generator=g).to(device)
    loss = lambda: model.loss(idx[:, :-1], idx[:, 1:])  # noqa: E731
    train, infer = _step_pair(model, device, loss, loss)
    ntok = cfg.lm_batch * cfg.lm_context
    return train, infer, ntok, ntok


def bench_models(cfg: Config, device: torch.device, progress: bool = True) -> List[dict]:
    families = []
    plan = (("vision", cfg.models, "images", "symvit", _build_vision, _vision_steps),
            ("fan", cfg.fans, "images", "fan", _build_fan, _vision_steps),
            ("lm", cfg.lms, "tokens", "symlm", _build_lm, _lm_steps))
    for family, keys, unit, base_key, build, steps in plan:
        if not keys:
            continue
        rows = []
        note = None
        for key in keys:
            try:
                label, model = build(key, cfg, device)
            except (ImportError, KeyError, RuntimeError, ValueError) as exc:
                note = f"{key} skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                _progress(f"[bench] {note}", progress)
                continue
            train, infer, n_train, n_infer = steps(model, cfg, device)
            row = {"key": key, "model": label, "unit": unit, "train_batch_items": n_train,
                   "infer_batch_items": n_infer, "train_times": [], "infer_times": [],
                   "params": sum(p.numel() for p in model.parameters())}
            try:
                train()
                infer()
                _sync(device)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            row["_train"], row["_infer"], row["_model"] = train, infer, model
            rows.append(row)
        for r in range(cfg.repeats):
            _progress(f"[bench] models ({family}) round {r + 1}/{cfg.repeats}", progress)
            for row in rows:
                if "error" in row:
                    continue
                row["train_times"].append(_time(row["_train"], cfg.model_min_run_time))
                row["infer_times"].append(_time(row["_infer"], cfg.model_min_run_time))
        families.append({"family": family, "unit": unit, "baseline": base_key, "rows": rows, "note": note})
    return families


def _model_memory(families: List[dict], device: torch.device, progress: bool, heap: Optional[HeapControl]) -> None:
    for fam in families:
        _progress(f"[bench] memory models ({fam['family']})", progress)
        for row in fam["rows"]:
            if "error" in row:
                continue
            try:
                row["train_peak_bytes"] = peak_bytes(row["_train"], device, heap)
            except RuntimeError as exc:
                row["mem_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def _finish_models(families: List[dict]) -> None:
    for fam in families:
        base = next((r for r in fam["rows"] if r["key"] == fam["baseline"] and "error" not in r), None)
        for row in fam["rows"]:
            row["train"] = _summary(row["train_times"])
            row["infer"] = _summary(row["infer_times"])
            row["train_throughput"] = (row["train_batch_items"] / row["train"]["median"]) if row["train"]["median"] else None
            row["infer_throughput"] = (row["infer_batch_items"] / row["infer"]["median"]) if row["infer"]["median"] else None
            ratios = {}
            if base is not None and base["train_times"] and row["train_times"]:
                ratios["train_vs_base"] = _summary([t / b for t, b in zip(row["train_times"], base["train_times"])])
                ratios["infer_vs_base"] = _summary([t / b for t, b in zip(row["infer_times"], base["infer_times"])])
            if base is not None and base.get("train_peak_bytes") and row.get("train_peak_bytes"):
                ratios["train_peak_vs_base"] = row["train_peak_bytes"] / base["train_peak_bytes"]
            row["ratios"] = ratios
        for row in fam["rows"]:
            for key in ("_train", "_infer", "_model"):
                row.pop(key, None)


# ---------------------------------------------------------------------------------------------
# Targets, suite, output
# ---------------------------------------------------------------------------------------------

def _find(groups, shape, mode, case):
    for g in groups:
        if g["shape"] == shape and g["mode"] == mode:
            for r in g["rows"]:
                if r["case"] == case:
                    return r
    return None


def targets(results: dict) -> List[dict]:
    """The ISSUE 4 targets, evaluated on this run (missing measurements are reported as such)."""
    groups, fams = results.get("ops", []), results.get("models", [])
    out = []

    def add(name, goal, value, ok):
        out.append({"target": name, "goal": goal, "measured": value,
                    "met": None if value is None else bool(ok(value))})

    for n in (2, 6):
        r = _find(groups, "deit-b8", "fwd+bwd", f"pap {n}")
        val = r["ratios"].get("vs_n_sdpa", {}).get("median") if r else None
        add(f"PAP {n} iter fwd+bwd / ({n} x SDPA), DeiT-tiny B=8", "<= 1.3", val, lambda x: x <= 1.3)
    for shape in ("deit-b8", "long-1024"):
        r = _find(groups, shape, "fwd+bwd", "official 6") or _find(groups, shape, "fwd+bwd", "official 2")
        val = r["ratios"].get("official_over_pap", {}).get("median") if r else None
        add(f"speed-up over official, fwd+bwd, {shape} ({r['case'] if r else '-'})", ">= 1.8", val,
            lambda x: x >= 1.8)
    for shape in ("long-1024", "long-4096"):
        r = _find(groups, shape, "fwd+bwd", "official 2") or _find(groups, shape, "fwd+bwd", "official 6")
        val = r["ratios"].get("pap_peak_over_official") if r else None
        add(f"backward peak memory PAP / official, {shape} ({r['case'] if r else '-'})", "<= 0.5", val,
            lambda x: x <= 0.5)
    for case in ("pap 6", "pap 6 ckpt"):
        r = _find(groups, "long-4096", "fwd+bwd", case)
        val = r["ratios"].get("saved_vs_pap1") if r else None
        add(f"saved-for-backward of {case} / pap 1, N=4096", "close to 1 (ckpt)", val, lambda x: x <= 2.0)
    for fam in fams:
        if fam["family"] != "vision":
            continue
        for key, goal in (("rpc6_layer1", 1.25), ("rpc2_all", 2.2)):
            r = next((x for x in fam["rows"] if x["key"] == key), None)
            val = r["ratios"].get("train_vs_base", {}).get("median") if r else None
            add(f"{r['model'] if r else key} train step / SymViT-tiny", f"<= {goal}", val,
                lambda x, goal=goal: x <= goal)
    return out


def run_suite(cfg: Config, device="cpu", progress: bool = True, ops: bool = True, models: bool = True,
              heap: Optional[HeapControl] = None) -> dict:
    """Run the benchmark suite and return a JSON-serialisable result dict.

    ``heap``: the C-heap control CPU peak memory needs (``benchmarks/run.py`` passes glibc's); without
    it CPU rows get saved-tensor bytes only."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    results = {"config": cfg.name, "env": environment(device)}
    t0 = time.perf_counter()
    groups = bench_ops(cfg, device, progress) if ops else []
    fams = bench_models(cfg, device, progress) if models else []
    results["env"]["load_average_after_timing"] = _loadavg()
    mem_method = None
    if cfg.memory:
        if device.type == "cuda":
            mem_method = "torch.cuda.max_memory_allocated over the call, minus memory allocated before"
        elif _cpu_peak_supported(heap):
            mem_method = ("peak RSS (VmHWM reset via /proc/self/clear_refs) over the call minus RSS before, "
                          "after malloc_trim(0), glibc mmap threshold pinned to 64 KiB; measured after all timings")
        elif heap is None:
            mem_method = "peak not measured (CPU peak needs benchmarks/run.py's heap control); saved-tensor bytes only"
        else:
            mem_method = "unavailable on this platform (peak); saved-tensor bytes only"
        try:
            _op_memory(groups, device, progress, heap)
            _model_memory(fams, device, progress, heap)
        finally:
            if heap is not None:
                heap.unpin()
    _finish_ops(groups)
    _finish_models(fams)
    results["ops"] = groups
    results["models"] = fams
    results["memory_method"] = mem_method
    results["targets"] = targets(results)
    results["env"]["load_average_end"] = _loadavg()
    results["env"]["wall_s"] = round(time.perf_counter() - t0, 1)
    return results


def _ms(s):
    return "-" if s is None else f"{s * 1e3:.2f}"


def _range_ms(summary):
    if not summary or summary.get("median") is None:
        return "-"
    return f"{_ms(summary['median'])} ({_ms(summary['min'])}-{_ms(summary['max'])})"


def _ratio(summary, digits=2):
    if summary is None:
        return ""
    if isinstance(summary, (int, float)):
        return f"{summary:.{digits}f}"
    if summary.get("median") is None:
        return ""
    if summary["n"] > 1:
        return f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"
    return f"{summary['median']:.{digits}f}"


def _mib(b):
    return "-" if b is None else f"{b / 2**20:.1f}"


def _targets_markdown(targets: List[dict]) -> List[str]:
    rows = []
    for t in targets:
        val = "-" if t["measured"] is None else f"{t['measured']:.2f}"
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
        rows.append([t["target"], t["goal"], val, met])
    return ["## Targets", ""] + markdown_table(["target", "goal", "measured", "met"], rows) + [""]


def _op_row(case: str, rf: dict, rb: dict) -> List[str]:
    """One operator table row: the forward and forward+backward measurements of ``case``."""
    notes = []
    for r in (rf, rb):
        if r.get("error"):
            notes.append(r["error"])
        if r.get("mem_error"):
            notes.append(r["mem_error"])
    if rf.get("n_iter_run") is not None:
        notes.append(f"stopped after {rf['n_iter_run']} iterations (tol 1e-2)")
    if rf.get("compile_s") is not None:
        notes.append(f"compile {rf['compile_s']:.0f} s")
    ratios_b = rb.get("ratios", {})
    if ratios_b.get("pap_peak_over_official") is not None:
        notes.append(f"pap/official peak {ratios_b['pap_peak_over_official']:.2f}")
    if ratios_b.get("saved_vs_pap1") is not None and case != "pap 1":
        notes.append(f"saved vs pap 1: {ratios_b['saved_vs_pap1']:.2f}")
    return [case, _range_ms(rf.get("time")), _ratio(rf.get("ratios", {}).get("vs_n_sdpa")),
            _range_ms(rb.get("time")), _ratio(ratios_b.get("vs_n_sdpa")), _ratio(ratios_b.get("official_over_pap")),
            _mib(rb.get("peak_bytes")), _mib(rb.get("saved_bytes")), "; ".join(notes)]


def _ops_markdown(groups: List[dict]) -> List[str]:
    by_shape: Dict[str, List[dict]] = {}
    for g in groups:
        by_shape.setdefault(g["shape"], []).append(g)
    lines = ["## Operator level", ""] if by_shape else []
    header = ["case", "fwd ms", "fwd x n*sdpa", "fwd+bwd ms", "fwd+bwd x n*sdpa", "official/pap (fwd+bwd)",
              "peak MiB", "saved MiB", "note"]
    for shape, grps in by_shape.items():
        g0 = grps[0]
        lines += [f"### {shape}: B={g0['b']} H={g0['h']} N={g0['n']} d={g0['d']}" + (" causal" if g0["causal"] else ""), ""]
        fwd = {r["case"]: r for g in grps if g["mode"] == "fwd" for r in g["rows"]}
        bwd = {r["case"]: r for g in grps if g["mode"] == "fwd+bwd" for r in g["rows"]}
        cases = list(dict.fromkeys(list(fwd) + list(bwd)))
        lines += markdown_table(header, [_op_row(c, fwd.get(c, {}), bwd.get(c, {})) for c in cases]) + [""]
    return lines


def _models_markdown(families: List[dict]) -> List[str]:
    lines = []
    for fam in families:
        unit = fam["unit"]
        lines += [f"## Model level ({fam['family']})", ""]
        if fam.get("note"):
            lines += [f"Note: {fam['note']}", ""]
        header = ["model", "params (M)", "train step ms", "train x base", f"train {unit}/s", "inference ms",
                  "infer x base", f"infer {unit}/s", "train peak MiB", "peak x base"]
        rows = []
        for r in fam["rows"]:
            rat = r.get("ratios", {})
            tp = "-" if r.get("train_throughput") is None else f"{r['train_throughput']:.1f}"
            ip = "-" if r.get("infer_throughput") is None else f"{r['infer_throughput']:.1f}"
            err = f" ({r['error']})" if r.get("error") else ""
            rows.append([f"{r['model']}{err}", f"{r['params'] / 1e6:.2f}", _range_ms(r.get("train")),
                         _ratio(rat.get("train_vs_base")), tp, _range_ms(r.get("infer")), _ratio(rat.get("infer_vs_base")),
                         ip, _mib(r.get("train_peak_bytes")), _ratio(rat.get("train_peak_vs_base"))])
        lines += markdown_table(header, rows)
        first = fam["rows"][0] if fam["rows"] else None
        if first:
            lines += ["", f"Train batch {first['train_batch_items']} {unit}, inference batch "
                          f"{first['infer_batch_items']} {unit} per call."]
        lines.append("")
    return lines


def to_markdown(results: dict) -> str:
    """The Markdown report of a suite run: environment, targets, operator and model tables."""
    env = results["env"]
    lines = [f"# rpc-attention benchmark ({results['config']}, {env['device']})", ""]
    lines.append(
        f"{env['date']} - torch {env['torch']}, {env['threads']} threads, {env['cpu_count']} CPUs "
        f"({env['processor']}), flush denormals: {env['flush_denormal']}"
        + (f", GPU {env['gpu']} ({env['amp']})" if env.get("gpu") else "")
    )
    lines.append(f"load average: start {env['load_average_start']}, after timing "
                 f"{env.get('load_average_after_timing')}, end {env.get('load_average_end')}; "
                 f"wall {env.get('wall_s')} s")
    lines.append("")
    lines.append("Times: median over rounds (min-max) in ms. Ratios are taken round by round against the "
                 "baseline measured beside them. `x n*sdpa`: time / (n x one symmetric SDPA). "
                 "`official/pap`: official formulation's time over ours with the same n. "
                 f"Memory ({results.get('memory_method')}): `peak` MiB above the live memory before the call; "
                 "`saved`: MiB autograd keeps for backward (inputs excluded).")
    lines.append("")
    if results.get("targets"):
        lines += _targets_markdown(results["targets"])
    lines += _ops_markdown(results.get("ops", []))
    lines += _models_markdown(results.get("models", []))
    return "\n".join(lines) + "\n"


def write_results(results: dict, out_dir: str) -> Dict[str, str]:
    """Write ``bench-<config>-<device>.json`` and ``.md`` into ``out_dir``; returns their paths."""
    dev = results["env"]["device"].split(":")[0]
    stem = os.path.join(out_dir, f"bench-{results['config']}-{dev}")
    paths = {"json": stem + ".json", "md": stem + ".md"}
    atomic_write_text(paths["json"], json.dumps(results, indent=1, default=str) + "\n")
    atomic_write_text(paths["md"], to_markdown(results))
    return paths
