"""`Run`: the user's own loop with AMP, accumulation, checkpoints and exact resume.

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
- checkpoints on the schedule of `skygreen.checkpoint.interval.CheckpointSchedule`, at once on a
  cloud's preemption notice (then training goes on), and on SIGTERM (then exit 75);
- early stopping and completion write a final checkpoint marked `completed`;
- `micro: auto` probes the largest micro-batch that fits during the first steps (halving on
  out-of-memory, keeping the effective batch), and re-probes on a different GPU type;
- under `SKYGREEN_SMOKE=1`, two steps on CPU with a tiny batch and a checkpoint round trip.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from skygreen.checkpoint.interval import CheckpointSchedule
from skygreen.checkpoint.manifest import run_meta
from skygreen.checkpoint.traffic import committed_bytes
from skygreen.errors import RuntimeSetupError
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.ledger.changeover import restore_figures
from skygreen.runtime import rng
from skygreen.runtime.autotune import (
    OOM_PROBE_STEPS,
    MemoryProbe,
    device_memory,
    divisor_at_most,
    reset_scaler_stage,
    smaller_micro_batch,
)
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.data import MicroBatchSampler, SampleStream, loader_for
from skygreen.runtime.environment import (
    autocast_factory,
    batch_shape,
    device_facts,
    end_quietly_on_skygreen_errors,
    pick_device,
    pick_precision,
    show_runtime_logs,
    to_device,
)
from skygreen.runtime.frozen_base import TrainableState, peft_model
from skygreen.runtime.fsdp import is_sharded, sharded_states
from skygreen.runtime.hold import HOLD_UNCOMMITTED_ENV, hold, hold_steps
from skygreen.runtime.peak_memory import PeakWindow, peak_window
from skygreen.runtime.ranks import World, all_reduce
from skygreen.runtime.services import open_schedule, open_services
from skygreen.runtime.smoke_mode import SMOKE_STEPS, round_trip
from skygreen.runtime.state import TRAINING, BatchShape, Stateful, StateGroup, TrainingState
from skygreen.runtime.step import Step, StepParts
from skygreen.task.settings import SMOKE_ENV, SMOKE_LINE, RuntimeSettings

if TYPE_CHECKING:
    from skygreen.runtime.sharded import ShardedCheckpointer

log = logging.getLogger("skygreen.runtime")


class Run:
    """One training run of the user's model, optimizer and dataset; see the module docstring.

    Settings come from `RuntimeSettings.from_env` (what `skygreen up` sets); the keyword
    arguments given here win. `micro_batch="auto"` (or no micro-batch anywhere) probes.
    Nothing is restored or started until `steps()`: a `Run` built by mistake costs no download.
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
        checkpointer: Checkpointer | ShardedCheckpointer | None = None,
        device: str | torch.device | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """Set up the run: device, precision, batch shape, DDP wrapping and the run's services.

        Args:
            model: the model; moved to the run's device, and wrapped in DDP with more than one
                rank unless it is sharded with FSDP2 (`sg.shard`).
            optimizer: the optimizer over `model`'s parameters.
            dataset: a map-style dataset (`len()` and indexing); the run samples it itself so
                that a resume continues from the exact sample.
            scheduler: an LR scheduler stepped after each update; None for none.
            effective_batch: samples per optimizer step across all ranks (default: the task's).
            micro_batch: samples per forward pass on each rank, or "auto" to probe the largest
                that fits (default: the task's, else auto).
            precision: "bf16", "fp16", "fp32" or "auto" (default: the task's).
            collate_fn: the DataLoader's collate function (default: PyTorch's).
            num_workers: DataLoader worker processes.
            shuffle: a fresh permutation each epoch (seeded, so a resume draws the same one).
            seed: the data order's seed.
            extra_state: more named stateful objects to checkpoint and restore (an EMA model, ...).
            settings: the run's settings (default: `RuntimeSettings.from_env`).
            checkpointer: one already made (default: the settings' `open_checkpointer`, or
                `open_sharded_checkpointer` for a model sharded with FSDP2).
            device: the torch device (default: CPU under the smoke test, else this rank's GPU,
                else CPU).
            environ: the process environment (default: `os.environ`).

        Raises:
            RuntimeSetupError: a missing or malformed setting (no run id, bucket or effective
                batch; a batch that does not divide across ranks or micro-batches; an unknown
                precision, power cap or rank variable).
            InputError: bad checkpoint settings (`SpecError` for `keep` or the bucket URL).
            StoreError: the bucket's client library is not installed.
            ValueError: the dataset is empty.
        """
        self._environ = os.environ if environ is None else environ
        end_quietly_on_skygreen_errors(self._environ)
        self.smoke = self._environ.get(SMOKE_ENV) == "1"
        overrides: dict[str, Any] = {"precision": precision, "effective_batch": effective_batch}
        if isinstance(micro_batch, int):
            overrides["micro_batch"] = micro_batch
        if settings is None:
            self.settings = RuntimeSettings.from_env(self._environ, **overrides)
        else:
            self.settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        self.world = World.from_env(self._environ)
        self.rank, self.world_size, self.local_rank = self.world.rank, self.world.size, self.world.local_rank
        show_runtime_logs(verbose=self.rank == 0)
        self.device = pick_device(device, smoke=self.smoke, local_rank=self.local_rank)
        self.facts = device_facts(self.device)
        self.precision = pick_precision(self.settings, self.facts, code_precision=precision, environ=self._environ)
        self.effective_batch, self.micro_auto, micro = batch_shape(
            self.settings, code_micro=micro_batch, world_size=self.world_size, smoke=self.smoke
        )
        self.module = model.to(self.device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.extra_state = dict(extra_state or {})
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.grad_scaler)
        self.autocast = autocast_factory(self.device.type, self.precision)
        """`with run.autocast():` mixed precision for a forward pass (a no-op in fp32)."""
        self.sharded = is_sharded(self.module)  # FSDP2's fully_shard: no DDP, sharded checkpoints
        peft = None if self.sharded else peft_model(self.module)  # only the adapter is checkpointed
        self._trainable = TrainableState(peft) if peft is not None else None
        self.model = self._wrap_ddp(self.module)
        self.dataset = dataset
        self.stream = SampleStream(len(dataset), seed=seed, shuffle=shuffle)
        self.seed = seed
        self._collate_fn = collate_fn
        self._num_workers = num_workers
        self.training = TrainingState(
            batch=BatchShape(
                effective=self.effective_batch, micro=micro, micro_auto=self.micro_auto, device_name=self.facts.name
            )
        )
        """Step, samples seen, batch shape, counters, completion: what the step advances and a resume restores."""
        self.services = open_services(
            self.settings,
            device=self.device,
            world=self.world,
            environ=self._environ,
            checkpointer=checkpointer or self._sharded_checkpointer(),
            smoke=self.smoke,
        )
        self.checkpointer = self.services.checkpointer
        self.stopper = self.services.stopper
        self.power = self.services.governor
        """This rank's GPU power: cap, `auto` profile, energy (`skygreen.power.governor`)."""
        self._book = self.services.book  # the run ledger and budget: rank 0's only
        self._parts = StepParts(
            model=self.model,
            module=self.module,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=self.scaler,
            precision=self.precision,
            autocast=self.autocast,
            training=self.training,
            world=self.world,
            smoke=self.smoke,
            sharded=self.sharded,
        )
        self.total_steps: int | None = None
        """Set by `steps(total_steps)`; the run ledger records it as progress's denominator."""
        self._stopping = False
        self.last_metrics: dict[str, float] = {}
        self._probe_steps_left = 0
        self._memory_probe: MemoryProbe | None = None
        self._peak = PeakWindow(None)
        """The first steps at the final micro-batch, whose peak memory the ledger records."""
        self._loader_iter: Iterator | None = None
        self._started_s = time.monotonic()
        self._wall_base_s = 0.0
        self._schedule: CheckpointSchedule | None = None
        self._hold_at_steps = hold_steps(self._environ)
        self._hold_uncommitted_at = hold_steps(self._environ, HOLD_UNCOMMITTED_ENV)
        if self.precision.warning and self.rank == 0:
            log.warning("%s", self.precision.warning)

    # -- set-up ---------------------------------------------------------------------------

    def _wrap_ddp(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.world_size == 1 or self.sharded:
            return module
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if self.device.type == "cuda" else "gloo")
        ids = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)

    def _sharded_checkpointer(self) -> ShardedCheckpointer | None:
        """For a model sharded with FSDP2: DCP checkpoints, each rank saving its own shards."""
        if not self.sharded:
            return None
        from skygreen.runtime.sharded import open_sharded_checkpointer

        return open_sharded_checkpointer(self.settings, world=self.world, environ=self._environ)

    @property
    def step_index(self) -> int:
        """Optimizer steps done (the next step's index)."""
        return self.training.step

    @property
    def samples_seen(self) -> int:
        """Samples trained on so far across all ranks: the data position a resume continues from."""
        return self.training.samples_seen

    @property
    def counters(self) -> dict[str, float]:
        """Cumulative across restarts: energy_j, wall_s, preemptions, restarts."""
        return self.training.counters

    @property
    def completed(self) -> bool:
        """Whether the run reached its end (the last steps or early stopping) and checkpointed it."""
        return self.training.completed

    @property
    def micro_batch(self) -> int:
        """Samples per micro-batch on each rank (halved by `micro: auto` on out-of-memory)."""
        return self.training.batch.micro

    @micro_batch.setter
    def micro_batch(self, value: int) -> None:
        self.training.batch.micro = value

    def state_mapping(self) -> dict[str, Stateful | None]:
        """The named stateful objects a checkpoint of this run holds (each rank's RNG goes apart)."""
        parts: dict[str, Stateful] = {"model": self._trainable or self.module, "optimizer": self.optimizer}
        if self.sharded:  # by parameter name, this rank's shards: they reshard on load
            parts = sharded_states(self.module, self.optimizer)
        return {
            **parts,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            TRAINING: self.training,
            "early_stop": self.stopper,
            "power": self.power,
            "extra": StateGroup(self.extra_state),
        }

    @property
    def accum_steps(self) -> int:
        """Micro-batches per optimizer step on each rank: the effective batch over micro-batch times ranks."""
        return self.effective_batch // (self.micro_batch * self.world_size)

    @property
    def epoch(self) -> int:
        """The epoch the run's position is in, counting from 0."""
        return self.samples_seen // self.stream.dataset_len

    # -- the loop -------------------------------------------------------------------------

    def steps(self, total_steps: int) -> Iterator[Step]:
        """Resume, then hand out optimizer steps `[resumed step, total_steps)`.

        The first call restores the newest verified checkpoint, starts the power governor and
        the preemption watch; between steps the run checkpoints on its schedule, on a
        preemption notice and on SIGTERM. A run already completed yields nothing.

        Args:
            total_steps: the step to train to (at most 2 under the smoke test).

        Yields:
            Each `Step`; a step retried with a smaller micro-batch comes again with the same index.

        Raises:
            RuntimeSetupError: a step ended without `step.optimizer_step()`, or out of memory
                with nothing smaller to try.
            SystemExit: after SIGTERM, with the preempted code (75) once the checkpoint
                committed; with 0 when the budget is reached or the smoke test passed.
            StoreError: the bucket failed (on restore, or a save that cannot be retried).
            CheckpointError: 3 checkpoints in a row failed to commit.
        """
        if self.smoke:
            total_steps = min(total_steps, SMOKE_STEPS)
        self.total_steps = total_steps
        self._resume()
        if self.completed:
            log.warning("run %s already completed at step %d; nothing to do", self.settings.run_id, self.step_index)
            return
        if not self.smoke:
            self._peak = peak_window(self.device, self.module, self.optimizer)
        self.power.start()
        self._install_preemption()
        if self._book:
            self._book.step_started()
        try:
            while self.step_index < total_steps and not self._should_stop():
                self._before_measured_step()
                self._peak.before_step(ready=not self.probing and self._memory_probe is None)
                step = Step(self.step_index, parts=self._parts, feed=self)
                yield step
                if step.retry:
                    continue
                if not step.done:
                    raise RuntimeSetupError(
                        f"step {step.index} ended without step.optimizer_step()\n"
                        "  fix: call step.optimizer_step() once at the end of each step"
                    )
                self._after_measured_step()
                self._note_peak_memory()
                self._after_step()
            self._finish()
        finally:
            self._uninstall_preemption()
            self.power.close()  # every exit: end, early stop, exception, SIGTERM, a caller's break

    def report(self, **metrics: float) -> None:
        """Record evaluation metrics in the run ledger; the early-stopping metric drives stopping.

        The stop takes effect at the next step boundary, agreed by all ranks, after a final
        checkpoint marked `completed`. Rank 0's values decide (its ledger, its stopper, the
        metric filed with its checkpoints); on other ranks a call is harmless.

        Args:
            **metrics: metric name -> value at the current step (`val_loss=2.31`).
        """
        values = {k: float(v) for k, v in metrics.items()}
        self.last_metrics.update(values)
        if (
            self.services.report(values, step=self.step_index)
            and self.stopper is not None
            and self.stopper.config.metric in values
            and self.rank == 0
        ):
            log.warning("early stopping at step %d (%s)", self.step_index, self.stopper.state_dict())

    def _should_stop(self) -> bool:
        """The agreed decision: rank 0's stopper, applied on every rank at the same boundary."""
        return self._stopping

    def _after_step(self) -> None:
        """Boundary work: agree on signals across ranks, then checkpoint if something asks."""
        self.power.step_done()
        if self._book:
            self._book.tick(self.step_index)
        watch = self.services.preemption
        notice = watch.notice()
        sigterm = watch.sigterm
        stop = self.rank == 0 and self.stopper is not None and self.stopper.stopped
        budget = self.services.over_budget()
        due = self._schedule is not None and self._schedule.due(self.step_index, time.monotonic())
        if self.world_size > 1:  # rank 0's schedule decides for all: it alone measures a save's bytes
            sigterm, notice_up, stop, budget, due = self.agree_flags(
                sigterm, notice is not None, stop, budget, due and self.rank == 0
            )
        else:
            notice_up = notice is not None
        self._stopping = stop
        if budget and not sigterm:
            self._save(state="budget", wait=True)
            self.close()
            log.warning("%s", self._book.stop_message() if self._book else "budget reached")
            raise SystemExit(0)
        if sigterm:
            from skygreen.checkpoint.cancellation import cancel_requested

            cancelled = cancel_requested(self.checkpointer.store)  # a user's cancel is no preemption
            if not cancelled:
                self.counters["preemptions"] += 1
            self._save(state="cancelled" if cancelled else "preempted", wait=True)
            self.close()
            log.warning(
                "checkpoint committed at step %d after SIGTERM; exiting %d", self.step_index, PREEMPTED_EXIT_CODE
            )
            raise SystemExit(PREEMPTED_EXIT_CODE)
        held = not stop and self.step_index in self._hold_at_steps
        if notice_up:
            self._save(state="running", reason="preemption-notice", wait=held)
        elif held or (not stop and due):
            self._save(state="running", wait=held)
        if held or (not stop and self.step_index in self._hold_uncommitted_at):
            hold(self.step_index, stopped=lambda: watch.sigterm, environ=self._environ)

    def agree_flags(self, *flags: bool) -> list[bool]:
        """Raise each flag that any rank raised on all of them, so every rank acts at the same step.

        A collective: call it on every rank.

        Args:
            *flags: this rank's flags.

        Returns:
            The flags, each True where it was True on some rank.
        """
        return self.world.agree(*flags)

    def _finish(self) -> None:
        if self.smoke:
            self._smoke_round_trip()
        self.training.completed = True
        self._save(state="completed", wait=True, pin=True)
        log.info("run %s completed at step %d", self.settings.run_id, self.step_index)

    # -- micro-batches --------------------------------------------------------------------

    def next_micro_batch(self) -> Any:
        """Return this rank's next micro-batch, on the run's device.

        A new loader starts at the run's position on the first call and after an
        out-of-memory probe halved the micro-batch, so no sample is skipped or repeated.
        """
        if self._loader_iter is None:
            self._loader_iter = iter(self._make_loader())
        return to_device(next(self._loader_iter), self.device)

    def _make_loader(self) -> torch.utils.data.DataLoader:
        sampler = MicroBatchSampler(
            self.stream,
            start=self.samples_seen,
            effective_batch=self.effective_batch,
            micro_batch=self.micro_batch,
            rank=self.rank,
            world_size=self.world_size,
        )
        return loader_for(
            self.dataset,
            sampler,
            seed=self.seed * 1_000_003 + self.samples_seen,
            collate_fn=self._collate_fn,
            num_workers=self._num_workers,
            pin_memory=self.device.type == "cuda",
        )

    def _reset_loader(self) -> None:
        self._loader_iter = None

    # -- probing the micro-batch ----------------------------------------------------------

    @property
    def probing(self) -> bool:
        """True during the first steps of `micro: auto`, while out-of-memory means 'go smaller'."""
        return self._probe_steps_left > 0

    def count_probe_step(self) -> None:
        """One optimizer step done: one fewer probing step left."""
        if self._probe_steps_left:
            self._probe_steps_left -= 1

    def _start_probe(self) -> None:
        """Probe the micro-batch from the next step.

        By halving on out-of-memory, or, for a model sharded over several ranks, by measuring and
        extrapolating (`autotune.MemoryProbe` says why).
        """
        if not (self.sharded and self.world_size > 1):
            self._probe_steps_left = OOM_PROBE_STEPS
            return
        meter = device_memory(self.device)
        if meter is None:
            if self.rank == 0:
                log.warning(
                    "micro: auto: %s has no memory statistics to probe with; micro-batch stays %d",
                    self.facts.name,
                    self.micro_batch,
                )
            return
        self._memory_probe = MemoryProbe(per_rank_batch=self.effective_batch // self.world_size, meter=meter)

    def _before_measured_step(self) -> None:
        """While the FSDP2 probe runs: the micro-batch of its next step, and a fresh peak."""
        probe = self._memory_probe
        if probe is None:
            return
        if probe.done:  # nothing to measure (a per-rank batch of 1)
            self._memory_probe = None
            return
        micro = probe.micro_for_next_step()
        if micro != self.micro_batch:
            self.micro_batch = micro
            self._reset_loader()

    def _after_measured_step(self) -> None:
        """After the FSDP2 probe's last step: every rank's prediction, the smallest for all."""
        probe = self._memory_probe
        if probe is None:
            return
        probe.step_done()
        if not probe.done:
            return
        own = probe.largest_fitting()
        agreed = int(all_reduce([own], op="MIN", dtype=torch.int64)[0])
        micro = divisor_at_most(agreed, probe.per_rank_batch)
        if self.rank == 0:
            log.warning(
                "micro: auto: micro-batch %d (accumulation %d) from peak memory measured at micro-batches %s; "
                "rank 0 alone would take %d, the tightest rank %d",
                micro,
                self.effective_batch // (micro * self.world_size),
                " and ".join(str(m) for m in sorted(probe.peaks)),
                own,
                agreed,
            )
        self._memory_probe = None
        if micro != self.micro_batch:
            self.micro_batch = micro
            self._reset_loader()

    def _note_peak_memory(self) -> None:
        """At the end of the peak window, the largest rank's peak into the ledger.

        A collective: the window closes at the same step on every rank.
        """
        peak = self._peak.after_step()
        if peak is None or self._peak.meter is None:
            return
        largest = float(all_reduce([float(peak)], op="MAX", dtype=torch.float64)[0])
        if self._book and largest >= 0:
            self._book.memory_peak(largest / 1e9, measure=self._peak.meter.measure)

    def shrink_micro_batch(self, error: BaseException, step: Step) -> None:
        """Set up `step` to be redone with a smaller micro-batch; the effective batch stays the same.

        The new micro-batch is the largest divisor of the per-rank batch at most half the old
        one, so micro-batches times accumulation steps is still exactly the per-rank batch. The gradients are
        zeroed, the scaler's stage reset, the step's RNG restored and the loader restarted.

        Args:
            error: the out-of-memory error that caused the retry.
            step: the step to redo.

        Raises:
            RuntimeSetupError: the micro-batch is already 1 (chained from `error`).
        """
        per_rank = self.effective_batch // self.world_size
        smaller = smaller_micro_batch(self.micro_batch, per_rank)
        if smaller is None:
            raise RuntimeSetupError(
                f"out of memory with micro-batch {self.micro_batch} on {self.facts.name}: nothing smaller to try\n"
                "  fix: a GPU with more memory, a smaller model, or activation checkpointing"
            ) from error
        log.warning(
            "out of memory with micro-batch %d on %s; retrying step %d with %d (accumulation %d -> %d)",
            self.micro_batch,
            self.facts.name,
            step.index,
            smaller,
            self.accum_steps,
            self.effective_batch // (smaller * self.world_size),
        )
        self.micro_batch = smaller
        self.optimizer.zero_grad(set_to_none=True)
        reset_scaler_stage(self.scaler)
        if step.rng_at_start is not None:
            rng.restore(step.rng_at_start)
        self._reset_loader()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- checkpoints ----------------------------------------------------------------------

    def _save(self, *, state: str, reason: str | None = None, wait: bool = False, pin: bool = False) -> dict[str, Any]:
        """Checkpoint the current step; returns the state handed to the checkpointer."""
        self._update_counters()
        meta = run_meta(
            state=state,
            energy_j=self.counters["energy_j"],
            wall_s=self.counters["wall_s"],
            preemptions=self.counters["preemptions"],
            restarts=self.counters["restarts"],
            micro_batch=self.micro_batch,
            accum_steps=self.accum_steps,
            effective_batch=self.effective_batch,
            world_size=self.world_size,
            precision=self.precision.precision,
            device=self.facts.name,
            samples_seen=self.samples_seen,
            epoch=self.epoch,
            checkpoint_interval_s=self._schedule.interval_s if self._schedule else None,
            **(self._schedule.cost_meta() if self._schedule else {}),
            power=self.power.summary(),
        )
        if reason:
            meta["reason"] = reason
        saved = self.checkpointer.save_state(
            self.step_index,
            self.state_mapping(),
            rank_state={"rng": rng.capture()},
            metric=self.services.metric(self.last_metrics),
            meta=meta,
            pin=pin,
        )
        if self._book and state != "smoke":
            self._book.progress_of(self.training, "early-stopped" if state == "completed" and self._stopping else state)
        if wait:
            self.checkpointer.wait()
            if self._book and state != "smoke":
                self._book.committed()  # the segment with the bytes and size of the save it waited for
        if self._schedule is not None:
            self._schedule.saved(
                self.step_index,
                time.monotonic(),
                save_cost_s=self.checkpointer.last_save_cost_s,
                upload_s=self.checkpointer.last_upload_s,
                save_bytes=committed_bytes(self.checkpointer.store),
            )
        return saved

    def _update_counters(self) -> None:
        now = time.monotonic()
        self.counters["wall_s"] = self._wall_base_s + (now - self._started_s)
        energy_j = self.power.take_j()
        if self.world_size > 1:
            energy_j = float(all_reduce([energy_j], op="SUM", dtype=torch.float64)[0])
        self.counters["energy_j"] += energy_j

    def _resume(self) -> None:
        restored: dict[str, float | int] | None = None
        restore_started_s = time.monotonic()
        loaded = self.checkpointer.restore_state(self.state_mapping())
        if loaded is not None:
            # for this VM's ledger segment: the bytes this rank downloaded (a sharded rank: its shards)
            restored = restore_figures(loaded.manifest, restore_started_s, blob_names=loaded.fetched)
            self._restore(loaded)
        elif self.micro_auto:
            self._start_probe()
        self._started_s = time.monotonic()
        if self._book and not self.completed:
            self._book.started_from(
                self.training,
                samples_per_epoch=self.stream.dataset_len,
                total_steps=self.total_steps,
                restored=restored,
            )
            # VMs killed without a SIGTERM were counted by nobody; the ledger knows them
            self.counters["preemptions"] = max(self.counters["preemptions"], self._book.preemptions_before())
        self._schedule = open_schedule(
            self.settings, environ=self._environ, start_step=self.step_index, start_s=self._started_s
        )

    def _restore(self, loaded: Any) -> None:
        """After `restore_state` loaded every part: what the run decides from the checkpoint."""
        saved_batch = TrainingState.saved_batch(loaded.state[TRAINING])
        self._wall_base_s = float(self.counters["wall_s"])
        self._stopping = self.stopper is not None and self.stopper.stopped
        self.training.completed = self.training.completed or loaded.manifest.meta.get("state") == "completed"
        if not self.completed:
            self.counters["restarts"] += 1
        self._restore_micro_batch(saved_batch, world_size=loaded.manifest.world_size)
        if loaded.rank_state is not None:
            rng.restore(loaded.rank_state["rng"])
        else:
            log.warning(
                "checkpoint step %d has no RNG state for rank %d; random streams restart", loaded.step, self.rank
            )
        log.info("resumed run %s at step %d (epoch %d)", self.settings.run_id, self.step_index, self.epoch)

    def _restore_micro_batch(self, batch: BatchShape, *, world_size: int) -> None:
        if not self.micro_auto or self.smoke:
            return
        same_shards = not self.sharded or world_size == self.world_size  # a shard's size follows the world
        if batch.effective == self.effective_batch and batch.device_name == self.facts.name and same_shards:
            self.micro_batch = batch.micro
            return
        if self.rank == 0:
            log.warning("resumed on %s (was %s); probing the micro-batch again", self.facts.name, batch.device_name)
        self._start_probe()

    def _smoke_round_trip(self) -> None:
        """Smoke test: save, load back, and check every tensor came back equal."""
        count = round_trip(
            lambda: self._save(state="smoke", wait=True), self.checkpointer, self.step_index, leader=self.world.leader
        )
        if self.world.leader:
            ranks = f"{self.world_size} rank" + ("s" if self.world_size > 1 else "")
            print(
                f"{SMOKE_LINE}: {self.step_index} steps on {ranks}, micro-batch {self.micro_batch} x "
                f"{self.accum_steps} accumulation, {self.precision.precision}, checkpoint round trip of {count} tensors",
                flush=True,
            )
        self.close()
        raise SystemExit(0)

    # -- preemption -----------------------------------------------------------------------

    def _install_preemption(self) -> None:
        self.services.preemption.start()

    def _uninstall_preemption(self) -> None:
        self.services.preemption.stop()

    def close(self) -> None:
        """Stop the preemption watch, restore the GPU's power limit, wait for the in-flight checkpoint.

        `with Run(...) as run:` calls it on the way out; a second call does nothing more.

        Raises:
            StoreError: the last checkpoint failed to commit (its error, re-raised).
            CheckpointError: the same, for a failure outside the store.
        """
        self.services.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._book and exc_type is not None and not self.completed:
            self._book.exited(self.training, exc_type)
        self.close()
