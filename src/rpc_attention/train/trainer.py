"""The task-generic training loop: single process, ``torchrun`` (DDP) single- or multi-node.

:func:`run_training` drives any registered task (:mod:`rpc_attention.train.tasks`) through a
:class:`Trainer` (restore, step, evaluate, checkpoint, finish). Properties:

* Distributed when launched by ``torchrun`` (``WORLD_SIZE`` > 1): NCCL on GPUs, gloo on CPU, one
  process per device, per-rank RNG seeds; only rank 0 writes files (the run directory's layout and
  files belong to :mod:`rpc_attention.train.rundir`).
* Data order is a function of ``(seed, epoch)`` only: :class:`StepSampler` cuts a seeded permutation
  into *global* batches and gives rank ``r`` the items ``r::world`` of each, and augmentations are
  seeded per sample. So N processes see exactly the global batches one process sees, and a run can
  resume from any step.
* Checkpoints (:mod:`rpc_attention.train.checkpoint`) every ``train.save_every`` steps and at the end
  carry everything needed to continue bit-identically (weights, optimizer, scheduler, scaler, EMA,
  every rank's RNG states, step).
* The loss stays on the device between logs: there is no host sync per step. Before every log,
  evaluation and checkpoint the losses since the last check are tested; a non-finite one stops the
  run (:class:`TrainingDiverged`, naming its step) before anything computed after it is logged or
  saved, so the last good checkpoint stays the newest.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler

from ..data.batch import to_device
from ..markdown import format_seconds
from .best import BestWeights
from .callbacks import Callback, resolve_callbacks
from .checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    save_safetensors_atomic,
    set_rng_state,
)
from .config import OptimConfig, ScheduleConfig, TrainConfig, dump_config, resolve_typed_config
from .rundir import MetricsLogger, RunDir
from .seeding import initial_model, seed_all
from .tasks import primary_metric

_log = logging.getLogger(__name__)  # messages; metrics go to the run directory (self.logger)


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; the message names the step and the last good checkpoint."""


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


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


# ------------------------------------------------------------------------------------------ train
def run_training(cfg: Optional[Dict[str, Any]], out_dir: os.PathLike, resume: bool = False, force: bool = False,
                 overrides: Optional[List[str]] = None,
                 callbacks: Optional[Sequence[Tuple[str, Callback]]] = None) -> Path:
    """Train ``cfg`` (a preset dict, resolved or not) into ``out_dir``; returns the run directory.

    ``resume=True`` continues the run in ``out_dir`` from its newest good checkpoint using the saved
    ``config.yaml`` (``cfg`` is then ignored; ``overrides`` still apply, e.g. ``train.epochs=20``).
    ``force=True`` deletes an existing run in ``out_dir`` first. Raises :class:`RunExistsError`,
    ``FileNotFoundError``/``ValueError`` (bad config or data) and :class:`TrainingDiverged`.
    ``callbacks``: the ``(name, fn)`` epoch-end callbacks of the run, default
    :func:`~rpc_attention.train.callbacks.default_callbacks` (the ``sparsity`` record); the names
    ``train.callbacks`` lists are added from the registry (:mod:`rpc_attention.train.callbacks`).
    """
    from .tasks import get_task

    run = RunDir(out_dir)
    env = _dist_env()
    world, rank = env["world"], env["rank"]
    if resume:
        run.require_run("resume")
        cfg, config = resolve_typed_config(base=run.read_config(), overrides=overrides or ())
    else:
        cfg, config = resolve_typed_config(base=cfg or {}, overrides=overrides or ())
    device = _resolve_device(config.train.device, env["local_rank"])
    started_pg = False
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        started_pg = True
    try:
        if not resume:
            _prepare_on_rank0(run, force, rank, world)
        try:
            trainer = Trainer(cfg, run, get_task(cfg["task"]), device, rank, world, callbacks=callbacks,
                              config=config)
            if resume:
                trainer.restore()
            else:
                trainer.seed_ranks()
            return trainer.fit()
        except TrainingDiverged:
            raise  # its records stay for diagnosis; the message says how to start again
        except Exception:
            if not resume and rank == 0:  # a start that failed before its first checkpoint blocks no retry
                run.discard_failed_start()
            raise
    finally:
        if started_pg and dist.is_initialized():
            dist.destroy_process_group()


def _prepare_on_rank0(run: RunDir, force: bool, rank: int, world: int) -> None:
    """``run.prepare`` on rank 0; every rank raises when it failed."""
    err: Optional[BaseException] = None
    if rank == 0:
        try:
            run.prepare(force=force)
        except BaseException as exc:
            err = exc
    if world > 1:
        flags = _gather_objects(None if err is None else repr(err), world)
        if flags[0] is not None and err is None:
            raise RuntimeError(f"rank 0 could not prepare {run.path}: {flags[0]}")
    if err is not None:
        raise err


class _Window:
    """The steps since the last log: their losses and task stats stay on the device until then."""

    def __init__(self, first_step: int) -> None:
        self.steps = 0
        self.sums: Dict[str, torch.Tensor] = {}
        self.units = 0
        self.t0 = time.time()
        self.unchecked: List[torch.Tensor] = []  # losses not yet tested for NaN/inf
        self.first_unchecked = first_step  # the (1-based) step number of unchecked[0]

    def add(self, loss: torch.Tensor, stats: Dict[str, Any], units: int, device: torch.device) -> None:
        loss = loss.detach().float()
        self.unchecked.append(loss)
        self.sums["loss"] = self.sums.get("loss", 0.0) + loss
        for k, v in stats.items():
            self.sums[k] = self.sums.get(k, 0.0) + torch.as_tensor(v, dtype=torch.float32, device=device).detach()
        self.steps += 1
        self.units += units

    def first_nonfinite(self) -> int:
        """The step number of the first unchecked NaN/inf loss, 0 if none; marks them all checked."""
        losses, first = self.unchecked, self.first_unchecked
        self.unchecked, self.first_unchecked = [], first + len(losses)
        finite = torch.isfinite(torch.stack(losses)).tolist() if losses else []
        return next((first + i for i, ok in enumerate(finite) if not ok), 0)


class Trainer:
    """One training run of ``task`` with config ``cfg`` into ``run``, on ``device`` as process ``rank`` of ``world``.

    ``Trainer(...)`` builds data, model, optimizer, schedule, AMP and EMA; then :meth:`restore` (a
    resume) or :meth:`seed_ranks` (a fresh start), then :meth:`fit`, which calls :meth:`step` per
    batch, :meth:`evaluate` and the callbacks at epoch ends, :meth:`checkpoint` and :meth:`finish`.
    """

    def __init__(self, cfg: Dict[str, Any], run: RunDir, task: Any, device: torch.device, rank: int = 0,
                 world: int = 1, callbacks: Optional[Sequence[Tuple[str, Callback]]] = None,
                 config: Optional[TrainConfig] = None) -> None:
        self.cfg, self.run, self.task = cfg, run, task
        self._given_callbacks = None if callbacks is None else list(callbacks)
        # the typed view of ``cfg`` (parsed here when not given); tasks and callbacks get the dict
        self.config = TrainConfig.from_dict(cfg) if config is None else config
        self.loop = loop = self.config.train
        self.device, self.rank, self.world, self.is_main = device, rank, world, rank == 0
        self._configure_process()
        # data first: clear errors before any expensive work
        self.datasets = task.build_datasets(cfg)
        if "train" not in self.datasets:
            raise ValueError(f"task {cfg['task']!r} built no 'train' data set")
        train_ds = self.datasets["train"]
        self.sampler = StepSampler(len(train_ds), loop.batch_size, rank, world, loop.seed, loop.repeated_aug or 1,
                                   positions=bool(getattr(train_ds, "seeded_positions", False)))
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = loop.epochs * self.steps_per_epoch
        if loop.max_steps:
            self.total_steps = min(self.total_steps, loop.max_steps)
        self.model = initial_model(cfg, task, loop.seed).to(device)  # identical on every rank
        self.optimizer = _build_optimizer(self.model, self.config.optim, loop.batch_size)
        self.scheduler = _build_scheduler(self.optimizer, self.config.schedule, self.steps_per_epoch, loop.epochs)
        self.amp, self.scaler = _amp_context(loop.amp, device)
        self.ema = None
        if loop.ema.enabled:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.model, decay=loop.ema.decay)
        self.logger = MetricsLogger(run.path, enabled=self.is_main)
        if self.is_main:  # on resume this records any overrides (e.g. a longer train.epochs)
            run.write_config(dump_config(cfg))
        self.global_step, self.elapsed_before = 0, 0.0
        self.last_checkpoint: Optional[Path] = None
        self.train_model: torch.nn.Module = self.model  # DDP / compiled wrapper, set by fit
        self.callbacks: List[Tuple[str, Callback]] = []  # (name, fn), resolved by fit
        self.callback_final: Dict[str, Any] = {}  # the last dict each callback returned, for final_metrics.json
        self.best = BestWeights(run, task, loop.keep_best)  # train.keep_best: the best validation epoch so far
        self.window = _Window(1)
        self._t_start = time.time()

    def _configure_process(self) -> None:
        loop = self.loop
        if loop.threads:
            torch.set_num_threads(loop.threads)
        if self.device.type == "cpu":
            # PAP's shrinkage drives many entries towards zero; denormal arithmetic on x86 CPUs is
            # up to 100x slower (docs/performance.md), so flush them as GPUs do. The CLI sets this at
            # start-up; here it covers library callers (threads created from now on inherit it).
            torch.set_flush_denormal(True)
        if loop.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.benchmark = False
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    # ------------------------------------------------------------------------------ start / resume
    def seed_ranks(self) -> None:
        """Seed this process's training RNGs (dropout, augmentation): a function of seed and rank."""
        seed_all(self.loop.seed + 7919 * self.rank)

    def restore(self) -> None:
        """Continue from the newest good checkpoint (none yet: a fresh start); drop later metrics records."""
        warn = _log.warning if self.is_main else None
        ckpt = latest_checkpoint(self.run.checkpoints, warn=warn)
        if ckpt is None:
            if list_checkpoints(self.run.checkpoints):
                raise CheckpointError(f"no usable checkpoint in {self.run.checkpoints} (all are corrupt)")
            if self.is_main:
                _log.info("note: %s has no checkpoint yet; starting from step 0", self.run.path)
            self.seed_ranks()
        else:
            self._load_checkpoint(ckpt)
        self.logger.truncate_after(self.global_step)
        if self.is_main:
            self.best.reread(self.global_step)

    def _load_checkpoint(self, ckpt: Path) -> None:
        model_sd, ema_sd, state = load_checkpoint(ckpt)
        try:
            self.model.load_state_dict(model_sd)
        except RuntimeError as exc:
            raise CheckpointError(
                f"{ckpt} does not fit the model of this config ({str(exc).splitlines()[-1].strip()}); a resume "
                f"cannot change the model's shape (class count, image size, ...): start a new run instead") from None
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None \
                and state.get("config") == dump_config(self.cfg):
            # timm schedules are functions of the step; a resume with changed settings (an override
            # of train.epochs) keeps the freshly built schedule instead of the saved one
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and ema_sd is not None:
            self.ema.module.load_state_dict(ema_sd)
        self.global_step = int(state["step"])
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        rngs = state.get("rng") or []
        if len(rngs) == self.world:
            set_rng_state(rngs[self.rank])
        else:
            if self.is_main:
                _log.warning("checkpoint was written by %d process(es), now %d: RNG states are re-seeded, "
                             "the continuation is not bit-identical", len(rngs), self.world)
            torch.manual_seed(self.loop.seed + 7919 * self.rank + self.global_step)
        self.last_checkpoint = ckpt
        if self.is_main:
            _log.info("resuming %s from %s (step %d/%d)", self.run.path, ckpt.name, self.global_step, self.total_steps)

    def _wrap_model(self) -> None:
        """DDP and ``torch.compile`` around the model (after any restore), the task's setup, the callbacks."""
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.train_model = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if self.loop.compile:
            self.train_model = torch.compile(self.train_model)
        setup = getattr(self.task, "setup", None)
        if callable(setup):
            setup(self.cfg, self.device)
        self.callbacks = resolve_callbacks(self.loop.callbacks, self._given_callbacks)

    # ------------------------------------------------------------------------------------- loop
    def fit(self) -> Path:
        """Train from the current step to the end, then :meth:`finish`; returns the run directory."""
        from tqdm import tqdm

        self._wrap_model()
        bar = tqdm(total=self.total_steps, initial=self.global_step, disable=not _progress_enabled(self.rank),
                   dynamic_ncols=True, unit="step", file=sys.stderr)
        self._t_start = time.time()
        self.window = _Window(self.global_step + 1)
        loader_gen = torch.Generator().manual_seed(self.loop.seed)
        if self.scheduler is not None:
            self.scheduler.step_update(self.global_step)
        collate = self.task.collate_fn(self.cfg)
        try:
            while self.global_step < self.total_steps:
                epoch = self.global_step // self.steps_per_epoch
                self.sampler.set_epoch(epoch, self.global_step - epoch * self.steps_per_epoch)
                loader = DataLoader(self.datasets["train"], batch_sampler=self.sampler,
                                    num_workers=self.config.data.num_workers,
                                    collate_fn=collate, pin_memory=self.device.type == "cuda", generator=loader_gen,
                                    persistent_workers=False)
                for batch in loader:
                    if self.global_step >= self.total_steps:
                        break
                    self.step(batch)
                    bar.update(1)
                    self._after_step(bar)
            bar.close()
            self.finish()
        finally:
            bar.close()
            self.logger.close()
        return self.run.path

    def step(self, batch: Any) -> None:
        """One optimizer step on ``batch`` (moved to the device); nothing here waits for the device."""
        self.train_model.train()
        batch = to_device(batch, self.device, non_blocking=True)
        with self.amp():
            loss, stats = self.task.loss(self.train_model, batch, self.cfg)
        self.optimizer.zero_grad(set_to_none=True)
        clip = self.config.optim.clip_grad
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if clip:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.optimizer.step()
        self.global_step += 1
        if self.scheduler is not None:
            self.scheduler.step_update(self.global_step)
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)
        count = getattr(self.task, "count", None) or (lambda b: len(b[0]))
        self.window.add(loss, stats, int(count(batch)) * self.world, self.device)

    def _after_step(self, bar) -> None:
        step, loop = self.global_step, self.loop
        epoch_end = step % self.steps_per_epoch == 0 or step == self.total_steps
        save = bool(loop.save_every and step % loop.save_every == 0) or step == self.total_steps
        if step % max(1, loop.log_every or 50) == 0 or epoch_end:
            self._check_finite()
            self._log_window(bar)
        if epoch_end:
            self.end_epoch(bar)
        if save:
            self._check_finite()
            self.last_checkpoint = self.checkpoint() or self.last_checkpoint

    def _check_finite(self) -> None:
        """Raise :class:`TrainingDiverged` when a loss since the last check was NaN/inf (one host sync;
        with DDP the first bad step over all processes, so every process stops at the same place)."""
        unchecked, first_unchecked = list(self.window.unchecked), self.window.first_unchecked
        local = self.window.first_nonfinite()
        first = local
        if self.world > 1:
            none = self.total_steps + 1
            worst = torch.tensor([local or none], device=self.device)
            dist.all_reduce(worst, op=dist.ReduceOp.MIN)
            first = int(worst.item()) % none
        if not first:
            return
        value = float(unchecked[first - first_unchecked]) if first == local else "not finite on another process"
        where = (f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint is not None
                 else "no checkpoint was saved before it (start again with --force, or another --out)")
        epoch = (first - 1) // self.steps_per_epoch + 1
        raise TrainingDiverged(f"loss is {value} at step {first} (epoch {epoch}); training stopped, {where}")

    def _log_window(self, bar) -> None:
        """Average the window's stats over steps (and processes), log them, start a new window."""
        w, step, spe = self.window, self.global_step, self.steps_per_epoch
        names = sorted(w.sums)
        vec = torch.stack([torch.as_tensor(w.sums[k], device=self.device).float().reshape(()) for k in names])
        if self.world > 1:
            dist.all_reduce(vec)
            vec /= self.world
        n_steps = w.steps
        vals = {k: float(v) / n_steps for k, v in zip(names, vec.tolist())}
        dt = max(time.time() - w.t0, 1e-9)
        rate = w.units / dt
        unit = getattr(self.task, "throughput_unit", "images")
        self.logger.log({"step": step, "epoch": round(step / spe, 4), "split": "train", **vals,
                         "lr": self.optimizer.param_groups[0]["lr"], f"{unit}_per_s": rate,
                         "elapsed_s": self.elapsed_before + time.time() - self._t_start})
        post = {"loss": f"{vals['loss']:.4f}", **{k: f"{v:.2f}" for k, v in vals.items() if k != "loss"},
                {"images": "img", "tokens": "tok"}.get(unit, unit) + "/s": f"{rate:.0f}"}
        bar.set_postfix(post, refresh=False)
        if self.is_main and bar.disable:  # no progress bar (not a terminal): one log line per log step
            eta = (self.total_steps - step) * dt / n_steps
            _log.info("step %d/%d ep %.2f %s eta %s", step, self.total_steps, step / spe,
                      " ".join(f"{k} {v}" for k, v in post.items()), format_seconds(max(0.0, eta)))
        self.window = _Window(step + 1)

    # ---------------------------------------------------------------------- evaluation, callbacks
    def end_epoch(self, bar) -> None:
        """At an epoch's end: validate when due (rank 0), run the callbacks (rank 0), then meet."""
        step, eval_every = self.global_step, self.loop.eval_every
        epoch = math.ceil(step / self.steps_per_epoch)
        val_ds = self.datasets.get("val")
        due = eval_every and (epoch % eval_every == 0 or step == self.total_steps)
        if self.is_main and val_ds is not None and due:
            res = self.evaluate(val_ds)
            self.logger.log({"step": step, "epoch": epoch, "split": "val", **res})
            self.best.observe(self.model, {"step": step, "epoch": epoch, **res})
            key = primary_metric(self.task)
            if key in res:
                msg = f"epoch {epoch}: val {key} {res[key]:.2f}" + (
                    f" (ema {res['ema_' + key]:.2f})" if "ema_" + key in res else "")
                if bar.disable:
                    _log.info(msg)
                else:
                    bar.write(msg, file=sys.stderr)
        if self.is_main:
            self.logger.step = step  # the callbacks' records belong to this step (see MetricsLogger.step)
            try:
                for name, callback in self.callbacks:
                    self.model.eval()
                    ret = callback(self.model, self.cfg, epoch, self.run.path, self.logger)
                    if isinstance(ret, dict):
                        self.callback_final[name] = ret
                    self.model.train()
            finally:
                self.logger.step = None
        _barrier(self.world)

    def evaluate(self, dataset) -> Dict[str, float]:
        """The task's metrics of the model (and, with EMA, ``ema_``-prefixed ones of the EMA model) on ``dataset``."""
        loader = DataLoader(dataset, batch_size=self.config.eval.batch_size, shuffle=False,
                            num_workers=self.config.data.num_workers, collate_fn=self.task.collate_fn(self.cfg),
                            pin_memory=self.device.type == "cuda", generator=torch.Generator().manual_seed(0))
        res: Dict[str, float] = {}
        for prefix, model in (("", self.model), ("ema_", self.ema.module if self.ema is not None else None)):
            if model is None:
                continue
            was_training = model.training
            model.eval()
            with torch.no_grad(), self.amp():
                metrics = self.task.evaluate(model, loader, self.cfg)
            model.train(was_training)
            res.update({prefix + k: v for k, v in metrics.items()})
        return res

    # ------------------------------------------------------------------------------ checkpoints, end
    def checkpoint(self) -> Optional[Path]:
        """Save a checkpoint of the current step (rank 0 writes, every rank gives its RNG states)."""
        rngs = _gather_objects(rng_state(), self.world)
        path = None
        if self.is_main:
            step, sched, scaler = self.global_step, self.scheduler, self.scaler
            state = {
                "step": step, "epoch": step // self.steps_per_epoch, "steps_per_epoch": self.steps_per_epoch,
                "global_batch": self.loop.batch_size, "world_size": self.world,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": sched.state_dict() if sched is not None else None,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "rng": rngs, "elapsed_s": self.elapsed_before + (time.time() - self._t_start),
                "config": dump_config(self.cfg),
            }
            path = save_checkpoint(self.run.checkpoints, step, self.model.state_dict(), state,
                                   ema_sd=self.ema.module.state_dict() if self.ema is not None else None,
                                   keep=self.loop.keep_checkpoints or 2)
        _barrier(self.world)
        return path

    def finish(self) -> Dict[str, Any]:
        """Write the final weights, evaluate on ``eval.final_split`` and write ``final_metrics.json`` (rank 0)."""
        final: Dict[str, Any] = {}
        if self.is_main:
            self.best.select(self.model, self.device)
            save_safetensors_atomic(self.model.state_dict(), self.run.weights())
            if self.ema is not None:
                save_safetensors_atomic(self.ema.module.state_dict(), self.run.weights(ema=True))
            split, step = self.config.eval.final_split, self.global_step
            if split == "test" and "test" not in self.datasets and "val" in self.datasets:
                split = "val"  # no test split (an ImageFolder without a test folder): say it is the val split
            dataset = self.datasets.get(split) if split else None
            if dataset is not None:
                final = self.evaluate(dataset)
                self.logger.log({"step": step, "epoch": round(step / self.steps_per_epoch, 4), "split": split,
                                 "final": True, **final})
                key = primary_metric(self.task)
                if key in final:
                    _log.info("final %s %s: %.2f", split, key, final[key])
            self.run.write_final_metrics({"step": step, "split": split,
                                          "elapsed_s": self.elapsed_before + time.time() - self._t_start, **final,
                                          **({"selected": self.best.best} if self.loop.keep_best else {}),
                                          **self.callback_final})
        _barrier(self.world)
        return final
