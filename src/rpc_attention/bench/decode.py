"""Decoding benchmark: the per-token cost of cached generation with RPC layers against plain ones.

Two pairs, each measured at several context lengths t (a prefill of t tokens, then single-token
steps over the cache, the two models' steps interleaved; the median of ``tokens`` steps):

- Symlm: ``symlm-small``'s body (16 blocks x 128 wide, 8 heads, d_inner 2048) with symmetric
  attention, against RPC-Symlm (PAP with 4 iterations in blocks 0-3). The step is the transformer's
  forward for one token (hidden states); the output softmax, the same for both, is left out.
- Hugging Face: a tiny Llama (4 layers x 128 wide, 4 heads) with ``attn_implementation="sdpa"``
  against the ``"rpc"`` backend with RPC in every layer (4 iterations); a step is one
  ``model(input_ids, past_key_values=...)`` call (logits included, the same for both).

Also the prefill time and the bytes each cache holds. Device-agnostic: ``device="cuda"`` runs the
same cases on a GPU (float32, synchronised timing).
"""

from __future__ import annotations

import functools
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch


@dataclass
class DecodeConfig:
    """What the decoding benchmark measures."""

    contexts: Sequence[int] = (128, 512, 2048, 4096)
    tokens: int = 5                 # timed steps after the prefill (median reported)
    symlm: dict = field(default_factory=lambda: dict(n_layer=16, d_model=128, n_head=8, d_inner=2048))
    rpc_layers: str = "0-3"
    n_iter: int = 4
    hf: dict = field(default_factory=lambda: dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                                  num_attention_heads=4, num_key_value_heads=4))
    vocab: int = 1000


def decode_config(name: str = "full") -> DecodeConfig:
    """``full`` (contexts 128-4096), ``quick`` (128-2048) or ``smoke`` (toy sizes, seconds)."""
    if name == "full":
        return DecodeConfig()
    if name == "quick":
        return DecodeConfig(contexts=(128, 512, 2048))
    if name == "smoke":
        return DecodeConfig(contexts=(16, 32), tokens=2, symlm=dict(n_layer=4, d_model=32, n_head=4, d_inner=64),
                            rpc_layers="0-1", n_iter=2,
                            hf=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=4), vocab=64)
    raise ValueError(f"unknown decode benchmark configuration {name!r}: full, quick or smoke")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _tensor_bytes(obj) -> int:
    """Bytes of every tensor reachable through dicts, lists, dataclasses and HF cache layers."""
    seen, total, todo = set(), 0, [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, (torch.nn.Module, type)):
            todo.extend(vars(item).values())
    return total


def _measure_pair(cases: Dict[str, tuple], tokens: int, device) -> Dict[str, dict]:
    """Prefill every case once (timed), then ``tokens`` rounds of one timed step per case, the cases
    interleaved so that a change in the machine's load falls on all of them alike.

    ``cases``: name -> ``(prefill, step, extra_bytes)``; ``prefill()`` returns the cache, ``step(cache)``
    decodes one token, ``extra_bytes(cache)`` counts state kept beside the cache object. Returns per
    case the prefill time, the median step time, every step time and the cache's bytes after the prefill.
    """
    caches, out = {}, {}
    for name, (prefill, _, extra_bytes) in cases.items():
        state: Dict[str, object] = {}
        prefill_s = _timed(functools.partial(_keep, state, prefill), device)
        caches[name] = state["cache"]
        out[name] = {"prefill_s": prefill_s, "steps_s": [],
                     "cache_bytes": _tensor_bytes(caches[name]) + extra_bytes(caches[name])}
    for _ in range(tokens):
        for name, (_, step, _) in cases.items():
            out[name]["steps_s"].append(_timed(functools.partial(step, caches[name]), device))
    for row in out.values():
        row["step_s"] = statistics.median(row["steps_s"])
    return out


def _keep(state: dict, prefill: Callable[[], object]) -> None:
    state["cache"] = prefill()


def _no_bytes(cache) -> int:
    return 0


def _symlm_models(cfg: DecodeConfig, device: torch.device) -> Dict[str, torch.nn.Module]:
    from ..models.lm import build_lm

    common = dict(cfg.symlm, vocab_size=cfg.vocab, context=max(cfg.contexts) + cfg.tokens + 1, dropout=0.0,
                  adaptive=False)
    models = {}
    for name, extra in (("symlm", {}), ("rpc-symlm", dict(rpc_layers=cfg.rpc_layers, n_iter=cfg.n_iter))):
        torch.manual_seed(0)
        models[name] = build_lm(None, **common, **extra).to(device).eval()
    return models


def bench_symlm(cfg: DecodeConfig, device: torch.device, progress: Callable[[str], None]) -> List[dict]:
    rows = []
    models = _symlm_models(cfg, device)
    for t in cfg.contexts:
        prompt = torch.randint(0, cfg.vocab, (1, t), generator=torch.Generator().manual_seed(t)).to(device)
        nxt = prompt[:, -1:]
        progress(f"[decode] symlm pair t={t}")
        cases = {}
        for name, model in models.items():
            def prefill(model=model, prompt=prompt):
                cache = model.new_cache()
                model(prompt, cache=cache)
                return cache

            def step(cache, model=model, nxt=nxt):
                model(nxt, cache=cache)

            cases[name] = (prefill, step, _no_bytes)
        with torch.no_grad():
            measured = _measure_pair(cases, cfg.tokens, device)
        rows += [{"family": "symlm", "model": name, "context": t, **row} for name, row in measured.items()]
    return rows


def _hf_models(cfg: DecodeConfig, device: torch.device) -> Dict[str, torch.nn.Module]:
    import transformers

    from ..integrations import transformers as rpc_hf

    rpc_hf.register()
    models = {}
    for name, impl, extra in (("llama-sdpa", "sdpa", {}),
                              ("llama-rpc", "rpc", dict(rpc_layers="all", rpc_n_iter=cfg.n_iter))):
        conf = transformers.LlamaConfig(vocab_size=cfg.vocab, max_position_embeddings=max(cfg.contexts) + 64,
                                        **cfg.hf, **extra)
        torch.manual_seed(0)
        models[name] = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation=impl).to(device).eval()
    return models


def bench_hf(cfg: DecodeConfig, device: torch.device, progress: Callable[[str], None]) -> List[dict]:
    from ..integrations import transformers as rpc_hf

    rows = []
    models = _hf_models(cfg, device)
    for t in cfg.contexts:
        prompt = torch.randint(0, cfg.vocab, (1, t), generator=torch.Generator().manual_seed(t)).to(device)
        nxt = prompt[:, -1:]
        progress(f"[decode] hf pair t={t}")
        cases = {}
        for name, model in models.items():
            def prefill(model=model, prompt=prompt):
                return model(prompt, use_cache=True).past_key_values

            def step(cache, model=model, nxt=nxt):
                model(nxt, past_key_values=cache, use_cache=True)

            cases[name] = (prefill, step, rpc_hf.decoding_cache_bytes)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # past_key_values: renamed in newer releases
            measured = _measure_pair(cases, cfg.tokens, device)
        rows += [{"family": "hf", "model": name, "context": t, **row} for name, row in measured.items()]
    return rows


def _ratios(rows: List[dict], base: str, other: str) -> List[dict]:
    by = {(r["model"], r["context"]): r for r in rows}
    out = []
    for (model, t), r in sorted(by.items(), key=lambda kv: kv[0][1]):
        if model != other or (base, t) not in by:
            continue
        b = by[(base, t)]
        out.append({"context": t, "base": base, "model": other, "step_ratio": r["step_s"] / b["step_s"],
                    "prefill_ratio": r["prefill_s"] / b["prefill_s"],
                    "cache_ratio": r["cache_bytes"] / max(b["cache_bytes"], 1)})
    return out


def _environment(device: torch.device) -> dict:
    env = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__, "device": str(device),
           "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
           "load_average_start": [round(x, 2) for x in os.getloadavg()]}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def run_decode(cfg: DecodeConfig, device="cpu", hf: bool = True, progress: bool = True) -> dict:
    """Run the decoding benchmark; returns ``{"env", "rows", "ratios"}``."""
    import sys

    device = torch.device(device)
    say = (lambda msg: print(msg, flush=True, file=sys.stderr)) if progress else (lambda msg: None)
    env = _environment(device)
    rows = bench_symlm(cfg, device, say)
    ratios = _ratios(rows, "symlm", "rpc-symlm")
    if hf:
        hf_rows = bench_hf(cfg, device, say)
        rows += hf_rows
        ratios += _ratios(hf_rows, "llama-sdpa", "llama-rpc")
    env["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"env": env, "config": {"contexts": list(cfg.contexts), "tokens": cfg.tokens, "n_iter": cfg.n_iter,
                                   "rpc_layers": cfg.rpc_layers, "symlm": cfg.symlm, "hf": cfg.hf},
            "rows": rows, "ratios": ratios}


def decode_markdown(results: dict) -> str:
    """The results as a markdown table (ms per token, prefill seconds, cache MiB, ratios)."""
    env = results["env"]
    lines = [f"Decoding: {env['device']}, {env['threads']} thread(s), torch {env['torch']}, load average "
             f"{env.get('load_average_start')} -> {env.get('load_average_end')}; median of "
             f"{results['config']['tokens']} tokens after a prefill.", "",
             "| pair | context | base ms/token | RPC ms/token | ratio | base prefill s | RPC prefill s | "
             "base cache MiB | RPC cache MiB |", "|---|---|---|---|---|---|---|---|---|"]
    by = {(r["model"], r["context"]): r for r in results["rows"]}
    for q in results["ratios"]:
        b, r = by[(q["base"], q["context"])], by[(q["model"], q["context"])]
        lines.append(f"| {q['model']} / {q['base']} | {q['context']} | {1e3 * b['step_s']:.1f} | "
                     f"{1e3 * r['step_s']:.1f} | {q['step_ratio']:.2f} | {b['prefill_s']:.2f} | "
                     f"{r['prefill_s']:.2f} | {b['cache_bytes'] / 2**20:.1f} | {r['cache_bytes'] / 2**20:.1f} |")
    return "\n".join(lines) + "\n"


def write_decode_results(results: dict, out_dir: str, name: str) -> Dict[str, str]:
    """Write ``bench-decode-<name>-<device>.json`` and ``.md`` into ``out_dir`` (atomically)."""
    import json

    from ..files import atomic_write_text

    dev = results["env"]["device"].split(":")[0]
    stem = os.path.join(out_dir, f"bench-decode-{name}-{dev}")
    paths = {"json": stem + ".json", "md": stem + ".md"}
    atomic_write_text(paths["json"], json.dumps(results, indent=1, default=str) + "\n")
    atomic_write_text(paths["md"], decode_markdown(results))
    return paths


def main_decode(name: str, device: str, out_dir: Optional[str], hf: bool = True, progress: bool = True) -> dict:
    """Run, print the table and write the results (the ``rpc-attention bench --only decode`` body)."""
    results = run_decode(decode_config(name), device=device, hf=hf, progress=progress)
    print(decode_markdown(results))
    if out_dir:
        paths = write_decode_results(results, out_dir, name)
        print(f"wrote {paths['md']} and {paths['json']}")
    return results
