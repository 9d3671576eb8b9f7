"""What a benchmark run measures: operator shapes, model lists, timing budgets (``full``, ``quick``, ``smoke``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence


@dataclass
class OpShape:
    """``(B, H, N, d)`` keys and values of one operator group and the cases run on them."""

    name: str
    b: int
    h: int
    n: int
    d: int
    causal: bool = False
    pap_iters: Sequence[int] = (1, 2, 4, 6)
    official_iters: Sequence[int] = (1, 2, 4, 6)
    options: Sequence[str] = ("ckpt", "tol")  # on the largest n: ckpt, compile, tol
    timed: bool = True  # False: memory only (too slow to time on small machines)


@dataclass
class Config:
    """One benchmark configuration: operator shapes, the model cases of each family (keys of
    :mod:`rpc_attention.bench.models`), their sizes and the timing budgets."""

    name: str
    shapes: List[OpShape]
    models: Sequence[str] = ("symvit", "rpc6_layer1", "rpc2_all", "rpc_robust", "deit")
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


def _full() -> Config:
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


def _quick() -> Config:
    return Config(
        "quick",
        shapes=[
            OpShape("deit-b8", 8, 3, 197, 64, pap_iters=(1, 2, 6), official_iters=(2, 6)),
            OpShape("lm", 8, 8, 256, 16, causal=True, pap_iters=(2, 4), official_iters=(2,), options=()),
            OpShape("long-1024", 1, 3, 1024, 64, pap_iters=(2,), official_iters=(2,), options=("ckpt",)),
            OpShape("long-4096", 1, 3, 4096, 64, pap_iters=(1, 6), official_iters=(), options=("ckpt",),
                    timed=False),
        ],
        models=("symvit", "rpc6_layer1", "rpc2_all", "rpc_robust", "deit"), lms=("symlm", "rpc_symlm"),
        img_size=224, train_batch=4, infer_batch=8, lm_batch=4, lm_context=128,
        repeats=2, min_run_time=0.2, model_min_run_time=0.2,
    )


def _smoke() -> Config:
    return Config(
        "smoke",
        shapes=[
            OpShape("tiny", 2, 2, 12, 8, pap_iters=(1, 3), official_iters=(3,), options=("ckpt", "tol")),
            OpShape("tiny-causal", 1, 2, 10, 4, causal=True, pap_iters=(2,), official_iters=(2,), options=()),
            OpShape("tiny-mem", 1, 1, 64, 8, pap_iters=(2,), official_iters=(2,), options=("ckpt",), timed=False),
        ],
        models=("symvit", "rpc6_layer1", "rpc_robust"), lms=("symlm",), img_size=32, train_batch=2, infer_batch=2,
        vision_kwargs=dict(embed_dim=32, depth=2, num_heads=2),
        fans=("fan", "rpc_fan"), fan_kwargs=dict(embed_dim=32, depth=2, num_heads=4, patch_size=8),
        lm_kwargs=dict(n_layer=1, d_model=16, n_head=2, d_inner=32), lm_batch=2, lm_context=16,
        repeats=1, min_run_time=0.01, model_min_run_time=0.01, memory=True,
    )


def config(name: str = "full") -> Config:
    """Named configurations: ``full`` (documented figures), ``quick`` (< 3 min on 2 cores) and
    ``smoke`` (seconds; exercises the machinery on toy shapes, used by the tests)."""
    builders = {"full": _full, "quick": _quick, "smoke": _smoke}
    if name not in builders:
        raise ValueError(f"unknown benchmark configuration {name!r}; choose full, quick or smoke")
    return builders[name]()
