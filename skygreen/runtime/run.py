"""`Run` and `Step`: the user's own loop with AMP, accumulation, checkpoints and exact resume.

The user writes the step as one block, as in nanoGPT's `train.py`:

    for step in run.steps(total_steps):
        with step:
            for x, y in step.micro_batches():
                with step.autocast():
                    loss = F.cross_entropy(run.model(x), y)
                step.backward(loss)          # divides by the accumulation steps, scales for fp16
            step.clip_grad_norm_(1.0)        # unscales first
            step.optimizer_step()

What the runtime adds around that block, at the step boundary (never inside an accumulation
window, so no half-accumulated gradients ever need saving: a window interrupted by a crash is
recomputed exactly from the restored data position and RNG):

- resume: the newest verified checkpoint restores model, optimizer, scheduler, GradScaler,
  each rank's RNG, data position, early-stopping state, micro-batch and counters;
- checkpoints on the schedule of `skygreen.checkpoint.CheckpointSchedule`, at once on a
  cloud's preemption notice (then training goes on), and on SIGTERM (then exit 75);
- early stopping and completion write a final checkpoint marked `completed`;
- `micro: auto` probes the largest micro-batch that fits during the first steps (halving on
  out-of-memory, keeping the effective batch), and re-probes on a different GPU type;
- under `SKYGREEN_SMOKE=1`, two steps on CPU with a tiny batch and a checkpoint round trip.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from skygreen.checkpoint import CheckpointSchedule, IntervalPolicy
from skygreen.early_stop import EarlyStopConfig, EarlyStopper
from skygreen.errors import RuntimeSetupError
from skygreen.precision import (
    DeviceFacts,
    PrecisionChoice,
    choose_precision,
    cpu_facts,
    cuda_facts,
)
from skygreen.runtime import PREEMPTED_EXIT_CODE, rng
from skygreen.runtime.autotune import (
    OOM_PROBE_STEPS,
    is_out_of_memory,
    smaller_micro_batch,
)
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.data import MicroBatchSampler, SampleStream
from skygreen.runtime.energy import EnergyMeter
from skygreen.runtime.preemption import NoticeWatcher, SigtermLatch, landed_cloud
from skygreen.runtime.smoke import SMOKE_ENV, SMOKE_FAILED, SMOKE_LINE
from skygreen.settings import DEFAULT_PRECISION_ENV, RuntimeSettings
from skygreen.spec import PRECISIONS

log = logging.getLogger("skygreen.runtime")

SMOKE_STEPS = 2
SMOKE_MICRO_BATCH = 2
SMOKE_ACCUM_STEPS = 2
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _ProbeRetry(Exception):
    """Another rank ran out of memory while probing the micro-batch: redo this step smaller."""


class Run:
    """One training run of the user's model, optimizer and dataset; see the module docstring.

    Settings come from `RuntimeSettings.from_env` (what `skygreen up` sets); the keyword
    arguments given here win. `micro_batch="auto"` (or no micro-batch anywhere) probes.
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: Any,
        scheduler: Any = None,
        effective_batch: int | None = None,
        micro_batch: int | str | None = None,
        precision: str | None = None,
        collate_fn: Any = None,
        num_workers: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        extra_state: Mapping[str, Any] | None = None,
        settings: RuntimeSettings | None = None,
        checkpointer: Checkpointer | None = None,
        device: str | torch.device | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._environ = os.environ if environ is None else environ
        self.smoke = self._environ.get(SMOKE_ENV) == "1"
        overrides = {"precision": precision, "effective_batch": effective_batch}
        if isinstance(micro_batch, int):
            overrides["micro_batch"] = micro_batch
        if settings is None:
            self.settings = RuntimeSettings.from_env(self._environ, **overrides)
        else:
            self.settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        self.rank, self.world_size, self.local_rank = _world(self._environ)
        _show_runtime_logs(verbose=self.rank == 0)
        self.device = self._pick_device(device)
        self.facts = _device_facts(self.device)
        self.precision = self._pick_precision(precision)
        self.effective_batch, self.micro_auto, micro = self._batch_shape(effective_batch, micro_batch)
        self.micro_batch = micro
        self.module = model.to(self.device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.extra_state = dict(extra_state or {})
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.grad_scaler)
        self.autocast = _autocast_factory(self.device.type, self.precision)
        """`with run.autocast():` mixed precision for a forward pass (a no-op in fp32)."""
        self.model = self._wrap_ddp(self.module)
        self.dataset = dataset
        self.stream = SampleStream(len(dataset), seed=seed, shuffle=shuffle)
        self.seed = seed
        self._collate_fn = collate_fn
        self._num_workers = num_workers
        self.checkpointer = checkpointer or Checkpointer(
            f"{self.settings.bucket.rstrip('/')}/{self.settings.run_id}",
            keep=self.settings.checkpoint_keep,
            half_precision=self.settings.checkpoint_half_precision,
            rank=self.rank,
            world_size=self.world_size,
            metric_mode=self.settings.early_stop_mode,
        )
        self.stopper = self._make_stopper()
        self.step_index = 0
        self.samples_seen = 0
        self.counters: dict[str, float] = {"energy_j": 0.0, "wall_s": 0.0, "preemptions": 0, "restarts": 0}
        self.completed = False
        self._stopping = False
        self.last_metrics: dict[str, float] = {}
        self._probe_steps_left = 0
        self._loader_iter: Iterator | None = None
        self._started_s = time.monotonic()
        self._wall_base_s = 0.0
        self._sigterm: SigtermLatch | None = None
        self._watcher: NoticeWatcher | None = None
        self._energy = EnergyMeter.for_device(self.device)
        self._schedule: CheckpointSchedule | None = None
        if self.precision.warning and self.rank == 0:
            log.warning("%s", self.precision.warning)
        if self.device.type == "cuda" and self.settings.power_cap != "off" and self.rank == 0:
            # The task file's `power:` is validated and carried to the VM, but setting NVML power
            # limits is not part of this runtime yet: say so rather than let the cap seem applied.
            log.warning("power cap %s requested: this runtime meters GPU energy but does not set "
                        "power limits yet; the GPU keeps its default limit", self.settings.power_cap)

    # -- set-up ---------------------------------------------------------------------------

    def _pick_device(self, device: str | torch.device | None) -> torch.device:
        if self.smoke:
            return torch.device("cpu")
        if device is not None:
            return torch.device(device)
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def _pick_precision(self, code_precision: str | None) -> PrecisionChoice:
        requested = self.settings.precision
        cluster_default = self._environ.get(DEFAULT_PRECISION_ENV)
        if code_precision is None and requested == "auto" and cluster_default:
            requested = cluster_default.lower()  # the cluster's choice stands in for "auto"
            if requested not in PRECISIONS:
                raise RuntimeSetupError(
                    f"{DEFAULT_PRECISION_ENV}: unknown precision {cluster_default!r}\n  allowed: {', '.join(PRECISIONS)}"
                )
        return choose_precision(requested, self.facts)

    def _batch_shape(self, code_effective: int | None, code_micro: int | str | None) -> tuple[int, bool, int]:
        effective = self.settings.effective_batch
        if effective is None:
            raise RuntimeSetupError(
                "effective batch is not set\n"
                "  fix: set skygreen.batch.effective in the task file, or pass effective_batch= to Run"
            )
        if self.smoke:
            micro = SMOKE_MICRO_BATCH
            return micro * SMOKE_ACCUM_STEPS * self.world_size, False, micro
        if effective % self.world_size:
            raise RuntimeSetupError(
                f"effective batch {effective} does not divide across {self.world_size} ranks\n"
                f"  fix: use a multiple of {self.world_size}"
            )
        per_rank = effective // self.world_size
        auto = code_micro == "auto" or (code_micro is None and self.settings.micro_batch is None)
        if auto:
            return effective, True, per_rank
        micro = self.settings.micro_batch
        if per_rank % micro:
            raise RuntimeSetupError(
                f"micro-batch {micro} does not divide the per-rank batch {per_rank} "
                f"(effective {effective} / {self.world_size} ranks)\n"
                "  fix: choose a micro-batch that divides it, or micro: auto"
            )
        return effective, False, micro

    def _wrap_ddp(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.world_size == 1:
            return module
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if self.device.type == "cuda" else "gloo")
        ids = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)

    def _make_stopper(self) -> EarlyStopper | None:
        s = self.settings
        if not s.early_stop_metric:
            return None
        return EarlyStopper(
            EarlyStopConfig(
                metric=s.early_stop_metric,
                mode=s.early_stop_mode,
                patience=s.early_stop_patience,
                min_delta=s.early_stop_min_delta,
                grace=s.early_stop_grace,
            )
        )

    @property
    def accum_steps(self) -> int:
        return self.effective_batch // (self.micro_batch * self.world_size)

    @property
    def epoch(self) -> int:
        return self.samples_seen // self.stream.dataset_len

    # -- the loop -------------------------------------------------------------------------

    def steps(self, total_steps: int) -> Iterator[Step]:
        """Optimizer steps `[resumed step, total_steps)`; ends early on early stopping."""
        if self.smoke:
            total_steps = min(total_steps, SMOKE_STEPS)
        self._resume()
        if self.completed:
            log.warning("run %s already completed at step %d; nothing to do", self.settings.run_id, self.step_index)
            return
        self._install_preemption()
        try:
            while self.step_index < total_steps and not self._should_stop():
                step = Step(self, self.step_index)
                yield step
                if step.retry:
                    continue
                if not step.done:
                    raise RuntimeSetupError(
                        f"step {step.index} ended without step.optimizer_step()\n"
                        "  fix: call step.optimizer_step() once at the end of each step"
                    )
                self._after_step()
            self._finish()
        finally:
            self._uninstall_preemption()

    def report(self, **metrics: float) -> None:
        """Record evaluation metrics; the early-stopping metric drives stopping."""
        self.last_metrics.update({k: float(v) for k, v in metrics.items()})
        if self.stopper is not None and self.stopper.config.metric in metrics:
            if self.stopper.update(metrics[self.stopper.config.metric]) and self.rank == 0:
                log.warning("early stopping at step %d (%s)", self.step_index, self.stopper.state_dict())

    def _should_stop(self) -> bool:
        """The agreed decision: rank 0's stopper, applied on every rank at the same boundary."""
        return self._stopping

    def _after_step(self) -> None:
        """Boundary work: agree on signals across ranks, then checkpoint if something asks."""
        notice = self._watcher.pending() if self._watcher else None
        sigterm = bool(self._sigterm and self._sigterm.fired)
        stop = self.rank == 0 and self.stopper is not None and self.stopper.stopped
        if self.world_size > 1:
            sigterm, notice_up, stop = self._agree_flags(sigterm, notice is not None, stop)
        else:
            notice_up = notice is not None
        self._stopping = stop
        if sigterm:
            self.counters["preemptions"] += 1
            self._save(state="preempted", wait=True)
            self.close()
            log.warning("checkpoint committed at step %d after SIGTERM; exiting %d", self.step_index, PREEMPTED_EXIT_CODE)
            raise SystemExit(PREEMPTED_EXIT_CODE)
        if notice_up:
            self._save(state="running", reason="preemption-notice")
        elif not stop and self._schedule.due(self.step_index, time.monotonic()):
            self._save(state="running")

    def _agree_flags(self, *flags: bool) -> list[bool]:
        tensor = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=self._comm_device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [bool(v) for v in tensor.tolist()]

    @property
    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def _finish(self) -> None:
        if self.smoke:
            self._smoke_round_trip()
        self.completed = True
        self._save(state="completed", wait=True, pin=True)
        log.info("run %s completed at step %d", self.settings.run_id, self.step_index)

    # -- micro-batches --------------------------------------------------------------------

    def _next_micro_batch(self) -> Any:
        if self._loader_iter is None:
            self._loader_iter = iter(self._make_loader())
        return _to_device(next(self._loader_iter), self.device)

    def _make_loader(self) -> torch.utils.data.DataLoader:
        sampler = MicroBatchSampler(
            self.stream,
            start=self.samples_seen,
            effective_batch=self.effective_batch,
            micro_batch=self.micro_batch,
            rank=self.rank,
            world_size=self.world_size,
        )
        # A generator of its own: the loader draws its workers' base seed from it instead of
        # from the global torch RNG, which a resumed run must find exactly as it was saved.
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.samples_seen)
        return torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=sampler,
            collate_fn=self._collate_fn,
            num_workers=self._num_workers,
            pin_memory=self.device.type == "cuda",
            generator=generator,
        )

    def _reset_loader(self) -> None:
        self._loader_iter = None

    # -- probing the micro-batch ----------------------------------------------------------

    @property
    def probing(self) -> bool:
        return self._probe_steps_left > 0

    def _shrink_after_oom(self, error: BaseException, step: Step) -> None:
        """Redo `step` with half the micro-batch; the effective batch stays the same."""
        per_rank = self.effective_batch // self.world_size
        smaller = smaller_micro_batch(self.micro_batch, per_rank)
        if smaller is None:
            raise RuntimeSetupError(
                f"out of memory with micro-batch {self.micro_batch} on {self.facts.name}: nothing smaller to try\n"
                "  fix: a GPU with more memory, a smaller model, or activation checkpointing"
            ) from error
        log.warning(
            "skygreen: out of memory with micro-batch %d on %s; retrying step %d with %d (accumulation %d -> %d)",
            self.micro_batch, self.facts.name, step.index, smaller, self.accum_steps,
            self.effective_batch // (smaller * self.world_size),
        )
        self.micro_batch = smaller
        self.optimizer.zero_grad(set_to_none=True)
        _reset_scaler_stage(self.scaler)
        rng.restore(step.rng_at_start)
        self._reset_loader()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- checkpoints ----------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict(),
            "progress": {"step": self.step_index, "samples_seen": self.samples_seen},
            "early_stop": self.stopper.state_dict() if self.stopper is not None else None,
            "batch": {
                "effective": self.effective_batch,
                "micro": self.micro_batch,
                "micro_auto": self.micro_auto,
                "device_name": self.facts.name,
            },
            "counters": dict(self.counters),
            "extra": {name: obj.state_dict() for name, obj in self.extra_state.items()},
        }

    def _save(self, *, state: str, reason: str | None = None, wait: bool = False, pin: bool = False) -> dict[str, Any]:
        """Checkpoint the current step; returns the state handed to the checkpointer."""
        self._update_counters()
        meta = {
            "state": state,
            "energy_j": self.counters["energy_j"],
            "wall_s": self.counters["wall_s"],
            "preemptions": self.counters["preemptions"],
            "restarts": self.counters["restarts"],
            "micro_batch": self.micro_batch,
            "accum_steps": self.accum_steps,
            "effective_batch": self.effective_batch,
            "world_size": self.world_size,
            "precision": self.precision.precision,
            "device": self.facts.name,
            "samples_seen": self.samples_seen,
            "epoch": self.epoch,
            "checkpoint_interval_s": self._schedule.interval_s if self._schedule else None,
        }
        if reason:
            meta["reason"] = reason
        metric = None
        if self.stopper is not None:
            metric = self.last_metrics.get(self.stopper.config.metric)
        saved = self._state()
        self.checkpointer.save(
            self.step_index,
            saved,
            rank_state={"rng": rng.capture()},
            metric=metric if metric is None or math.isfinite(metric) else None,
            meta=meta,
            pin=pin,
        )
        if wait:
            self.checkpointer.wait()
        if self._schedule is not None:
            self._schedule.saved(
                self.step_index,
                time.monotonic(),
                save_cost_s=self.checkpointer.last_save_cost_s,
                upload_s=self.checkpointer.last_upload_s,
            )
        return saved

    def _update_counters(self) -> None:
        now = time.monotonic()
        self.counters["wall_s"] = self._wall_base_s + (now - self._started_s)
        energy_j = self._energy.take_j()
        if self.world_size > 1:
            total = torch.tensor([energy_j], dtype=torch.float64, device=self._comm_device)
            dist.all_reduce(total)
            energy_j = float(total.item())
        self.counters["energy_j"] += energy_j

    def _resume(self) -> None:
        loaded = self.checkpointer.load_latest()
        if loaded is not None:
            self._restore(loaded)
        elif self.micro_auto:
            self._probe_steps_left = OOM_PROBE_STEPS
        policy = IntervalPolicy(
            every_steps=self.settings.checkpoint_every_steps,
            every_s=self.settings.checkpoint_every_s,
            **({"preemptions_per_hour": self.settings.preemptions_per_hour} if self.settings.preemptions_per_hour else {}),
        )
        self._started_s = time.monotonic()
        self._schedule = CheckpointSchedule(policy, start_step=self.step_index, start_s=self._started_s)

    def _restore(self, loaded: Any) -> None:
        state = loaded.state
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.precision.grad_scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.step_index = int(state["progress"]["step"])
        self.samples_seen = int(state["progress"]["samples_seen"])
        if self.stopper is not None and state.get("early_stop") is not None:
            self.stopper.load_state_dict(state["early_stop"])
        for name, obj in self.extra_state.items():
            if name in state.get("extra", {}):
                obj.load_state_dict(state["extra"][name])
        self.counters.update(state["counters"])
        self._wall_base_s = float(self.counters["wall_s"])
        self._stopping = self.stopper is not None and self.stopper.stopped
        self.completed = loaded.manifest.meta.get("state") == "completed"
        if not self.completed:
            self.counters["restarts"] += 1
        self._restore_micro_batch(state["batch"])
        if loaded.rank_state is not None:
            rng.restore(loaded.rank_state["rng"])
        else:
            log.warning("checkpoint step %d has no RNG state for rank %d; random streams restart", loaded.step, self.rank)
        log.info("resumed run %s at step %d (epoch %d)", self.settings.run_id, self.step_index, self.epoch)

    def _restore_micro_batch(self, batch: Mapping[str, Any]) -> None:
        if not self.micro_auto or self.smoke:
            return
        same_batch = batch["effective"] == self.effective_batch
        if same_batch and batch["device_name"] == self.facts.name:
            self.micro_batch = int(batch["micro"])
            return
        if self.rank == 0:
            log.warning(
                "skygreen: resumed on %s (was %s); probing the micro-batch again", self.facts.name, batch["device_name"]
            )
        self._probe_steps_left = OOM_PROBE_STEPS

    def _smoke_round_trip(self) -> None:
        """Smoke test: save, load back, and check every tensor came back equal."""
        phase = "save"
        try:
            saved = _host(self._save(state="smoke", wait=True))
            phase = "load"
            loaded = self.checkpointer.load_latest()
            if loaded is None or loaded.step != self.step_index:
                raise RuntimeError("the checkpoint just saved was not found")
            from skygreen.runtime.compare import first_difference

            diff = first_difference(saved, loaded.state)
            if diff:
                raise RuntimeError(f"the loaded state differs from the saved one at {diff}")
        except Exception as e:
            _smoke_fail(phase, e)
        count = sum(1 for _ in _tensors(saved))
        print(
            f"{SMOKE_LINE}: {self.step_index} steps, micro-batch {self.micro_batch} x {self.accum_steps} accumulation, "
            f"{self.precision.precision}, checkpoint round trip of {count} tensors",
            flush=True,
        )
        self.close()
        raise SystemExit(0)

    # -- preemption -----------------------------------------------------------------------

    def _install_preemption(self) -> None:
        self._sigterm = SigtermLatch.from_env(exit_code=PREEMPTED_EXIT_CODE, environ=self._environ).install()
        cloud = landed_cloud(self.settings.cloud, self._environ)
        if cloud and not self.smoke:
            self._watcher = NoticeWatcher.from_env(cloud, self._environ).start()

    def _uninstall_preemption(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if self._sigterm is not None:
            self._sigterm.uninstall()
            self._sigterm = None

    def close(self) -> None:
        """Wait for the in-flight checkpoint and stop background threads."""
        self._uninstall_preemption()
        self.checkpointer.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Step:
    """One optimizer step: its micro-batches, the scaled backward, clipping and the update.

    Use it as a context manager (`with step:`): while `micro: auto` probes, an out-of-memory
    error inside the block is caught there and the runtime hands out the same step again
    with half the micro-batch.
    """

    def __init__(self, run: Run, index: int) -> None:
        self.run = run
        self.index = index
        self.done = False
        self.retry = False
        self.phase = "forward"
        self._backwards = 0
        self._drawn = 0
        self._synced = False
        self.rng_at_start = rng.capture() if run.probing else None

    @property
    def epoch(self) -> int:
        return self.run.epoch

    @property
    def accum_steps(self) -> int:
        return self.run.accum_steps

    def micro_batches(self) -> Iterator[Any]:
        """This rank's micro-batches of the step; DDP syncs gradients only on the last one."""
        run = self.run
        accum = run.accum_steps
        ddp = run.model if run.world_size > 1 else None
        for k in range(accum):
            self.phase = "forward"
            batch = run._next_micro_batch()
            self._drawn += 1
            if ddp is not None and (k < accum - 1 or run.probing):
                with ddp.no_sync():
                    yield batch
            else:
                yield batch

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass (a no-op in fp32)."""
        return self.run.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        """`loss / accum_steps`, scaled when fp16, backpropagated."""
        self.phase = "backward"
        loss = loss / self.run.accum_steps
        if self.run.precision.grad_scaler:
            loss = self.run.scaler.scale(loss)
        loss.backward()
        self._backwards += 1

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the gradient norm after unscaling (clipping scaled gradients would clip nothing)."""
        self._boundary()
        self.phase = "optimizer"
        if self.run.precision.grad_scaler:
            self.run.scaler.unscale_(self.run.optimizer)
        return torch.nn.utils.clip_grad_norm_(self.run.module.parameters(), max_norm)

    def optimizer_step(self) -> None:
        """Step (skipped by the scaler on inf/nan gradients), update the scale, zero, schedule."""
        self._boundary()
        self.phase = "optimizer"
        run = self.run
        if run.precision.grad_scaler:
            run.scaler.step(run.optimizer)
            run.scaler.update()
        else:
            run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        if run.scheduler is not None:
            run.scheduler.step()
        run.step_index += 1
        run.samples_seen += run.effective_batch
        if run._probe_steps_left:
            run._probe_steps_left -= 1
        self.done = True

    def _boundary(self) -> None:
        """Once per step, before the first use of the accumulated gradients."""
        if self._synced:
            return
        if self._drawn != self.run.accum_steps or self._backwards != self.run.accum_steps:
            raise RuntimeSetupError(
                f"step {self.index}: {self._drawn} micro-batches drawn and {self._backwards} backward calls, "
                f"expected {self.run.accum_steps} of each\n"
                "  fix: iterate step.micro_batches() to the end and call step.backward(loss) once per micro-batch"
            )
        run = self.run
        if run.world_size > 1 and run.probing:
            if run._agree_flags(False)[0]:
                raise _ProbeRetry()
            _average_gradients(run.module, run.world_size)
        self._synced = True

    def __enter__(self) -> Step:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        run = self.run
        if exc is None:
            return False
        recoverable = run.probing and not self._synced
        if isinstance(exc, _ProbeRetry) or (recoverable and is_out_of_memory(exc)):
            if run.world_size > 1 and not isinstance(exc, _ProbeRetry):
                run._agree_flags(True)  # the other ranks wait for this at their boundary
            run._shrink_after_oom(exc, self)
            self.retry = True
            return True
        if run.smoke and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            _smoke_fail(self.phase, exc)
        return False


# -- helpers --------------------------------------------------------------------------------


def _show_runtime_logs(*, verbose: bool) -> None:
    """Print skygreen's lines (resume point, checkpoint interval, commits) on stderr.

    In a container the runtime narrates the run: where it resumed, how often it checkpoints
    and why, what a preemption did. Only when the application has not configured logging
    itself; other ranks than 0 print warnings only, so a DDP run does not say everything N times.
    """
    logger = logging.getLogger("skygreen")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("skygreen: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


def _world(environ: Mapping[str, str]) -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's variables."""
    try:
        return int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1)), int(environ.get("LOCAL_RANK", 0))
    except ValueError as e:
        raise RuntimeSetupError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers: {e}") from e


def _device_facts(device: torch.device) -> DeviceFacts:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return cuda_facts(torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index))
    return cpu_facts()


def _autocast_factory(device_type: str, precision: PrecisionChoice):
    if precision.precision == "fp32":
        return contextlib.nullcontext
    dtype = _AUTOCAST_DTYPES[precision.precision]
    return lambda: torch.autocast(device_type=device_type, dtype=dtype)


def _to_device(batch: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _average_gradients(module: torch.nn.Module, world_size: int) -> None:
    """What DDP's reducer does at a boundary, by hand, for the probing steps."""
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)


def _reset_scaler_stage(scaler: torch.amp.GradScaler) -> None:
    """Forget a half-done unscale of an abandoned step (GradScaler has no public reset)."""
    if scaler.is_enabled():
        from collections import defaultdict

        from torch.amp.grad_scaler import _refresh_per_optimizer_state

        scaler._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)


def _host(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, Mapping):
        return {k: _host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_host(v) for v in obj)
    return obj


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _smoke_fail(phase: str, error: BaseException) -> None:
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    sys.stderr.write(f"{SMOKE_FAILED} {phase}: {type(error).__name__}: {message}\n")
    sys.stderr.flush()
    if os.environ.get("SKYGREEN_DEBUG") == "1":
        raise error
    raise SystemExit(1) from error
