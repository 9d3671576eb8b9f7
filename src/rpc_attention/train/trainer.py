"""The task-generic training loop: single process, ``torchrun`` (DDP) single- or multi-node.

:func:`run_training` drives any registered task (:mod:`rpc_attention.train.tasks`). Properties:

* Distributed when launched by ``torchrun`` (``WORLD_SIZE`` > 1): NCCL on GPUs, gloo on CPU, one
  process per device, per-rank RNG seeds; only rank 0 writes files.
* Data order is a function of ``(seed, epoch)`` only: :class:`StepSampler` cuts a seeded permutation
  into *global* batches and gives rank ``r`` the items ``r::world`` of each, and augmentations are
  seeded per sample. So N processes see exactly the global batches one process sees, and a run can
  resume from any step.
* Checkpoints (:mod:`rpc_attention.train.checkpoint`) every ``train.save_every`` steps and at the end
  carry everything needed to continue bit-identically (weights, optimizer, scheduler, scaler, EMA,
  every rank's RNG states, step).
* A non-finite loss stops the run before the optimizer step (:class:`TrainingDiverged`), leaving the
  last good checkpoint untouched.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler

from .checkpoint import (CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint, rng_state,
                         save_checkpoint, save_safetensors_atomic, set_rng_state)
from ..io import atomic_write_bytes
from .config import (OptimConfig, ScheduleConfig, TrainConfig, dump_config, load_config_file,
                     resolve_config)
from .tasks import primary_metric

__all__ = ["run_training", "TrainingDiverged", "RunExistsError", "StepSampler", "MetricsLogger", "RUN_FILES"]

RUN_FILES = ("config.yaml", "metrics.jsonl", "model.safetensors", "model_ema.safetensors", "final_metrics.json",
             "checkpoints", "tb")


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; the message names the step and the last good checkpoint."""


class RunExistsError(FileExistsError):
    """``out_dir`` already holds a run and neither ``resume`` nor ``force`` was given."""


# -------------------------------------------------------------------------------------- sampling
class StepSampler(Sampler):
    """Batch sampler over *global* batches: epoch ``e`` uses a permutation seeded by ``(seed, e)``.

    Each global batch of ``global_batch`` positions is split across ranks as ``batch[rank::world]``.
    With ``repeats > 1`` every sampled index is repeated consecutively (repeated augmentation, DeiT),
    keeping the epoch length at ``len(dataset)``; copies land on different ranks. Yields lists of
    ``(index, epoch, position)`` when ``positions=True`` (for seeded augmentation) or of ints.
    ``set_epoch(epoch, start_step)`` resumes inside an epoch.
    """

    def __init__(self, n: int, global_batch: int, rank: int = 0, world: int = 1, seed: int = 0,
                 repeats: int = 1, positions: bool = True) -> None:
        if global_batch < 1:
            raise ValueError(f"train.batch_size must be >= 1, got {global_batch}")
        if global_batch % world:
            raise ValueError(f"train.batch_size ({global_batch}) must be divisible by the number of processes ({world})")
        if n < global_batch:
            raise ValueError(f"the training set has {n} items, fewer than one batch of {global_batch}")
        self.n, self.global_batch, self.rank, self.world = n, global_batch, rank, world
        self.seed, self.repeats, self.positions = int(seed), max(1, int(repeats)), positions
        self.steps_per_epoch = n // global_batch
        self.epoch, self.start_step = 0, 0

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start_step = int(epoch), int(start_step)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        if self.repeats > 1:
            perm = torch.randperm(math.ceil(self.n / self.repeats), generator=g)
            return perm.repeat_interleave(self.repeats)[: self.n]
        return torch.randperm(self.n, generator=g)

    def __iter__(self) -> Iterator[List[Any]]:
        order = self.epoch_order(self.epoch).tolist()
        b = self.global_batch
        for step in range(self.start_step, self.steps_per_epoch):
            pos = list(range(step * b + self.rank, (step + 1) * b, self.world))
            if self.positions:
                yield [(order[p], self.epoch, p) for p in pos]
            else:
                yield [order[p] for p in pos]

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start_step


# --------------------------------------------------------------------------------------- logging
class MetricsLogger:
    """Appends JSON lines to ``DIR/metrics.jsonl`` and scalars to TensorBoard (``DIR/tb``), rank 0 only."""

    def __init__(self, run_dir: Optional[Path], enabled: bool = True, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.enabled = enabled and self.run_dir is not None
        self._tb = None
        self._tb_wanted = tensorboard

    @property
    def path(self) -> Optional[Path]:
        return self.run_dir / "metrics.jsonl" if self.run_dir is not None else None

    def _writer(self):
        if self._tb is None and self._tb_wanted:
            try:
                from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is heavy
                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))
            except Exception as exc:  # noqa: BLE001
                print(f"warning: TensorBoard logging disabled ({exc})", file=sys.stderr)
                self._tb_wanted = False
        return self._tb

    def log(self, record: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        rec = {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        tb = self._writer()
        if tb is not None and "step" in rec:
            split = rec.get("split", "train")
            for k, v in rec.items():
                if k not in ("step", "split") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    tb.add_scalar(f"{split}/{k}", v, rec["step"])

    def truncate_after(self, step: int) -> None:
        """Drop records logged after ``step`` (written by a run that was killed after its last checkpoint)."""
        if not self.enabled or not self.path.is_file():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except ValueError:
                continue  # a torn last line
        atomic_write_bytes(self.path, ("\n".join(keep) + ("\n" if keep else "")).encode())

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


# ---------------------------------------------------------------------------------------- helpers
def _dist_env() -> Dict[str, int]:
    return {"world": int(os.environ.get("WORLD_SIZE", "1")), "rank": int(os.environ.get("RANK", "0")),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}


def _resolve_device(spec: str, local_rank: int) -> torch.device:
    spec = str(spec or "auto")
    if spec == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(spec)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"train.device={spec!r} but CUDA is not available (use train.device=cpu or auto)")
        if dev.index is None:
            dev = torch.device(f"cuda:{local_rank}")
    return dev


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _progress_enabled(rank: int) -> bool:
    if rank != 0 or os.environ.get("RPC_ATTENTION_NO_PROGRESS", "") not in ("", "0"):
        return False
    return sys.stderr.isatty()


def _amp_context(amp: Any, device: torch.device):
    if amp in (False, None, "none", "off", "fp32", "false"):
        return nullcontext, None
    dtype = {"bf16": torch.bfloat16, True: torch.bfloat16, "true": torch.bfloat16, "fp16": torch.float16}.get(amp)
    if dtype is None:
        raise ValueError(f"train.amp must be false, 'bf16' or 'fp16', got {amp!r}")
    if dtype is torch.float16 and device.type != "cuda":
        raise ValueError("train.amp=fp16 needs a CUDA device; use train.amp=bf16 on CPU")
    scaler = torch.amp.GradScaler("cuda") if dtype is torch.float16 else None
    return (lambda: torch.autocast(device_type=device.type, dtype=dtype)), scaler


def _fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _prepare_run_dir(out: Path, resume: bool, force: bool) -> None:
    holds_run = out.exists() and any((out / f).exists() for f in RUN_FILES)
    if resume:
        if not (out / "config.yaml").is_file():
            raise FileNotFoundError(f"cannot resume: {out} holds no run (expected {out / 'config.yaml'})")
        return
    if holds_run:
        if not force:
            raise RunExistsError(f"{out} already holds a run; use --resume {out} to continue it or --force to "
                                 f"start over")
        for f in RUN_FILES:
            p = out / f
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _build_optimizer(model: torch.nn.Module, o: OptimConfig, global_batch: int):
    from timm.optim import create_optimizer_v2

    lr = o.lr * global_batch / o.lr_scale_batch if o.lr_scale_batch else o.lr
    name = o.name.lower()
    kwargs: Dict[str, Any] = {}
    if "adam" in name or "lamb" in name:
        kwargs["betas"] = tuple(o.betas)
        kwargs["eps"] = o.eps
    try:
        return create_optimizer_v2(model, opt=name, lr=lr, weight_decay=o.weight_decay, momentum=o.momentum,
                                   **kwargs)
    except (AssertionError, ValueError) as exc:
        raise ValueError(f"optim.name={name!r}: {exc}") from None


def _build_scheduler(optimizer, s: ScheduleConfig, steps_per_epoch: int, epochs: int):
    name = s.name.lower()
    if name in ("none", "constant", ""):
        return None
    from timm.scheduler import create_scheduler_v2

    # decay_rate: the poly power, the step factor (timm's meaning); decay_epochs: the step period
    extra = {key: getattr(s, key) for key in ("decay_rate", "decay_epochs") if getattr(s, key) is not None}
    sched, _ = create_scheduler_v2(
        optimizer, sched=name, num_epochs=epochs, warmup_epochs=s.warmup_epochs, warmup_lr=s.warmup_lr,
        min_lr=s.min_lr, step_on_epochs=False, updates_per_epoch=steps_per_epoch, **extra)
    return sched


def _gather_objects(obj: Any, world: int) -> List[Any]:
    if world == 1:
        return [obj]
    out: List[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


# ------------------------------------------------------------------------------------------ train
def run_training(cfg: Optional[Dict[str, Any]], out_dir: os.PathLike, resume: bool = False, force: bool = False,
                 overrides: Optional[List[str]] = None) -> Path:
    """Train ``cfg`` (a preset dict, resolved or not) into ``out_dir``; returns the run directory.

    ``resume=True`` continues the run in ``out_dir`` from its newest good checkpoint using the saved
    ``config.yaml`` (``cfg`` is then ignored; ``overrides`` still apply, e.g. ``train.epochs=20``).
    ``force=True`` deletes an existing run in ``out_dir`` first. Raises :class:`RunExistsError`,
    ``FileNotFoundError``/``ValueError`` (bad config or data) and :class:`TrainingDiverged`.
    """
    from .tasks import get_task

    out = Path(out_dir)
    env = _dist_env()
    world, rank = env["world"], env["rank"]
    if resume:
        if not (out / "config.yaml").is_file():
            raise FileNotFoundError(f"cannot resume: {out} holds no run (expected {out / 'config.yaml'})")
        cfg = resolve_config(base=load_config_file(out / "config.yaml"), overrides=overrides or ())
    else:
        cfg = resolve_config(base=cfg or {}, overrides=overrides or ())
    device = _resolve_device(TrainConfig.from_dict(cfg).train.device, env["local_rank"])
    started_pg = False
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        started_pg = True
    try:
        return _train(cfg, out, resume, force, device, rank, world, get_task(cfg["task"]))
    finally:
        if started_pg and dist.is_initialized():
            dist.destroy_process_group()


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _train(cfg, out: Path, resume: bool, force: bool, device: torch.device, rank: int, world: int, task) -> Path:
    import numpy as np
    import random

    config = TrainConfig.from_dict(cfg)
    loop = config.train
    is_main = rank == 0
    # -- run directory (rank 0), everyone agrees on failures
    err: Optional[BaseException] = None
    if is_main:
        try:
            _prepare_run_dir(out, resume, force)
        except BaseException as exc:  # noqa: BLE001
            err = exc
    if world > 1:
        flags = _gather_objects(None if err is None else repr(err), world)
        if flags[0] is not None and err is None:
            raise RuntimeError(f"rank 0 could not prepare {out}: {flags[0]}")
    if err is not None:
        raise err
    if loop.threads:
        torch.set_num_threads(loop.threads)
    if device.type == "cpu":
        # PAP's shrinkage drives many entries towards zero; denormal arithmetic on x86 CPUs is
        # up to 100x slower (docs/performance.md), so flush them as GPUs do. The CLI sets this at
        # start-up; here it covers library callers (threads created from now on inherit it).
        torch.set_flush_denormal(True)
    if loop.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    seed = loop.seed

    # -- data first (clear errors before any expensive work)
    datasets = task.build_datasets(cfg)
    if "train" not in datasets:
        raise ValueError(f"task {cfg['task']!r} built no 'train' data set")
    train_ds = datasets["train"]
    global_batch = loop.batch_size
    sampler = StepSampler(len(train_ds), global_batch, rank, world, seed, loop.repeated_aug or 1,
                          positions=bool(getattr(train_ds, "seeded_positions", False)))
    spe = sampler.steps_per_epoch
    epochs = loop.epochs
    total_steps = epochs * spe
    if loop.max_steps:
        total_steps = min(total_steps, loop.max_steps)
    save_every = loop.save_every
    log_every = max(1, loop.log_every or 50)
    eval_every = loop.eval_every

    # -- model, optimizer, schedule (identical init on every rank)
    torch.manual_seed(seed)
    np.random.seed(seed % 2 ** 32)
    random.seed(seed)
    model = task.build_model(cfg).to(device)
    optimizer = _build_optimizer(model, config.optim, global_batch)
    scheduler = _build_scheduler(optimizer, config.schedule, spe, epochs)
    amp_ctx, scaler = _amp_context(loop.amp, device)
    ema = None
    if loop.ema.enabled:
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(model, decay=loop.ema.decay)
    logger = MetricsLogger(out, enabled=is_main)
    if is_main:  # on resume this records any --set overrides (e.g. a longer train.epochs)
        atomic_write_bytes(out / "config.yaml", dump_config(cfg).encode())

    # -- resume
    step, elapsed_before = 0, 0.0
    last_ckpt: Optional[Path] = None
    if resume:
        ckpt = latest_checkpoint(out / "checkpoints", warn=(lambda m: print(m, file=sys.stderr)) if is_main else None)
        if ckpt is None:
            if list_checkpoints(out / "checkpoints"):
                raise CheckpointError(f"no usable checkpoint in {out / 'checkpoints'} (all are corrupt)")
            if is_main:
                print(f"note: {out} has no checkpoint yet; starting from step 0", file=sys.stderr)
        else:
            model_sd, ema_sd, state = load_checkpoint(ckpt)
            model.load_state_dict(model_sd)
            optimizer.load_state_dict(state["optimizer"])
            if scheduler is not None and state.get("scheduler") is not None and state.get("config") == dump_config(cfg):
                # timm schedules are functions of the step; a resume with changed settings (--set
                # train.epochs=...) keeps the freshly built schedule instead of the saved one
                scheduler.load_state_dict(state["scheduler"])
            if scaler is not None and state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            if ema is not None and ema_sd is not None:
                ema.module.load_state_dict(ema_sd)
            step = int(state["step"])
            elapsed_before = float(state.get("elapsed_s", 0.0))
            rngs = state.get("rng") or []
            if len(rngs) == world:
                set_rng_state(rngs[rank])
            else:
                if is_main:
                    print(f"warning: checkpoint was written by {len(rngs)} process(es), now {world}: RNG states "
                          f"are re-seeded, the continuation is not bit-identical", file=sys.stderr)
                torch.manual_seed(seed + 7919 * rank + step)
            last_ckpt = ckpt
            if is_main:
                print(f"resuming {out} from {ckpt.name} (step {step}/{total_steps})", file=sys.stderr)
        logger.truncate_after(step)
    else:
        torch.manual_seed(seed + 7919 * rank)
        np.random.seed((seed + 7919 * rank) % 2 ** 32)
        random.seed(seed + 7919 * rank)

    raw_model = model
    train_model: torch.nn.Module = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if loop.compile:
        train_model = torch.compile(train_model)
    setup = getattr(task, "setup", None)
    if callable(setup):
        setup(cfg, device)
    from .callbacks import resolve_callbacks

    callbacks = resolve_callbacks(loop.callbacks)
    callback_final: Dict[str, Any] = {}  # the last dict each callback returned, for final_metrics.json
    val_ds = datasets.get("val")

    def make_eval_loader(ds):
        return DataLoader(ds, batch_size=config.eval.batch_size, shuffle=False,
                          num_workers=config.data.num_workers, collate_fn=task.collate_fn(cfg),
                          pin_memory=device.type == "cuda", generator=torch.Generator().manual_seed(0))

    def run_eval(ds, split: str) -> Dict[str, float]:
        res = {}
        for prefix, m in (("", raw_model), ("ema_", ema.module if ema is not None else None)):
            if m is None:
                continue
            was = m.training
            m.eval()
            with torch.no_grad(), amp_ctx():
                r = task.evaluate(m, make_eval_loader(ds), cfg)
            m.train(was)
            res.update({prefix + k: v for k, v in r.items()})
        return res

    def save(step_now: int) -> Optional[Path]:
        rngs = _gather_objects(rng_state(), world)
        path = None
        if is_main:
            state = {
                "step": step_now, "epoch": step_now // spe, "steps_per_epoch": spe, "global_batch": global_batch,
                "world_size": world, "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "rng": rngs, "elapsed_s": elapsed_before + (time.time() - t_start), "config": dump_config(cfg),
            }
            path = save_checkpoint(out / "checkpoints", step_now, raw_model.state_dict(), state,
                                   ema_sd=ema.module.state_dict() if ema is not None else None,
                                   keep=loop.keep_checkpoints or 2)
        _barrier(world)
        return path

    # -- loop
    unit = getattr(task, "throughput_unit", "images")
    count = getattr(task, "count", None) or (lambda b: len(b[0]))
    from tqdm import tqdm

    bar = tqdm(total=total_steps, initial=step, disable=not _progress_enabled(rank), dynamic_ncols=True,
               unit="step", file=sys.stderr)
    t_start = time.time()
    win_stats: Dict[str, torch.Tensor] = {}
    win_steps, win_units, win_t0 = 0, 0, time.time()
    loader_gen = torch.Generator().manual_seed(seed)
    if scheduler is not None:
        scheduler.step_update(step)
    collate = task.collate_fn(cfg)
    nw = config.data.num_workers
    clip = config.optim.clip_grad
    try:
        while step < total_steps:
            epoch = step // spe
            sampler.set_epoch(epoch, step - epoch * spe)
            loader = DataLoader(train_ds, batch_sampler=sampler, num_workers=nw, collate_fn=collate,
                                pin_memory=device.type == "cuda", generator=loader_gen,
                                persistent_workers=False)
            for batch in loader:
                if step >= total_steps:
                    break
                train_model.train()
                batch = _to_device(batch, device)
                with amp_ctx():
                    loss, stats = task.loss(train_model, batch, cfg)
                bad = torch.tensor([0.0 if bool(torch.isfinite(loss.detach())) else 1.0], device=device)
                if world > 1:
                    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
                if bad.item() > 0:
                    where = (f"the last good checkpoint is {last_ckpt}" if last_ckpt is not None
                             else "no checkpoint was saved before it")
                    raise TrainingDiverged(f"loss is {float(loss.detach())} at step {step + 1} (epoch {epoch + 1}); "
                                           f"training stopped, {where}")
                optimizer.zero_grad(set_to_none=True)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    if clip:
                        scaler.unscale_(optimizer)
                        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), float(clip))
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    if clip:
                        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), float(clip))
                    optimizer.step()
                step += 1
                if scheduler is not None:
                    scheduler.step_update(step)
                if ema is not None:
                    ema.update(raw_model, step=step)
                win_stats["loss"] = win_stats.get("loss", 0.0) + loss.detach().float()
                for k, v in stats.items():
                    win_stats[k] = win_stats.get(k, 0.0) + torch.as_tensor(v, dtype=torch.float32, device=device).detach()
                win_steps += 1
                win_units += int(count(batch)) * world
                bar.update(1)
                epoch_end = step % spe == 0 or step == total_steps
                if step % log_every == 0 or epoch_end:
                    names = sorted(win_stats)
                    vec = torch.stack([torch.as_tensor(win_stats[k], device=device).float().reshape(()) for k in names])
                    if world > 1:
                        dist.all_reduce(vec)
                        vec /= world
                    vals = {k: float(v) / win_steps for k, v in zip(names, vec.tolist())}
                    dt = max(time.time() - win_t0, 1e-9)
                    rate = win_units / dt
                    rec = {"step": step, "epoch": round(step / spe, 4), "split": "train", **vals,
                           "lr": optimizer.param_groups[0]["lr"], f"{unit}_per_s": rate,
                           "elapsed_s": elapsed_before + time.time() - t_start}
                    logger.log(rec)
                    eta = (total_steps - step) * dt / win_steps
                    post = {"loss": f"{vals['loss']:.4f}", **{k: f"{v:.2f}" for k, v in vals.items() if k != "loss"},
                            {"images": "img", "tokens": "tok"}.get(unit, unit) + "/s": f"{rate:.0f}"}
                    bar.set_postfix(post, refresh=False)
                    if is_main and bar.disable and os.environ.get("RPC_ATTENTION_QUIET", "") in ("", "0"):
                        print(f"step {step}/{total_steps} ep {step / spe:.2f} " +
                              " ".join(f"{k} {v}" for k, v in post.items()) + f" eta {_fmt_time(eta)}",
                              file=sys.stderr, flush=True)
                    win_stats, win_steps, win_units, win_t0 = {}, 0, 0, time.time()
                if epoch_end:
                    ep = math.ceil(step / spe)
                    if is_main and val_ds is not None and eval_every and (ep % eval_every == 0 or step == total_steps):
                        res = run_eval(val_ds, "val")
                        logger.log({"step": step, "epoch": ep, "split": "val", **res})
                        key = primary_metric(task)
                        if is_main and key in res:
                            msg = f"epoch {ep}: val {key} {res[key]:.2f}" + (
                                f" (ema {res['ema_' + key]:.2f})" if "ema_" + key in res else "")
                            if bar.disable:
                                print(msg, file=sys.stderr, flush=True)
                            else:
                                bar.write(msg, file=sys.stderr)
                    if is_main:
                        for name, fn in callbacks:
                            raw_model.eval()
                            ret = fn(raw_model, cfg, ep, out, logger)
                            if isinstance(ret, dict):
                                callback_final[name] = ret
                            raw_model.train()
                    _barrier(world)
                if (save_every and step % save_every == 0) or step == total_steps:
                    last_ckpt = save(step) or last_ckpt
        bar.close()
        # -- final weights and evaluation
        final: Dict[str, Any] = {}
        if is_main:
            save_safetensors_atomic(raw_model.state_dict(), out / "model.safetensors")
            if ema is not None:
                save_safetensors_atomic(ema.module.state_dict(), out / "model_ema.safetensors")
            split = config.eval.final_split
            ds = datasets.get(split) if split else None
            if ds is not None:
                final = run_eval(ds, split)
                logger.log({"step": step, "epoch": round(step / spe, 4), "split": split, "final": True, **final})
                key = primary_metric(task)
                if key in final:
                    print(f"final {split} {key}: {final[key]:.2f}", file=sys.stderr, flush=True)
            summary = {"step": step, "split": split, "elapsed_s": elapsed_before + time.time() - t_start, **final,
                       **callback_final}
            atomic_write_bytes(out / "final_metrics.json", (json.dumps(summary, indent=1) + "\n").encode())
        _barrier(world)
    finally:
        bar.close()
        logger.close()
    return out
