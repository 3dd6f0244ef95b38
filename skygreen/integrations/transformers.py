"""skygreen for Hugging Face `Trainer` scripts: one callback, one argument.

    from skygreen.integrations.transformers import SkygreenCallback

    skygreen = SkygreenCallback()
    trainer = Trainer(model=model, args=args, ..., callbacks=[skygreen])
    trainer.train(resume_from_checkpoint=skygreen.resume_from_checkpoint)

What the callback does, started by `skygreen up` (or `up --local`):

- when the Trainer is built, it restores the newest checkpoint folder that verifies from the
  task's bucket into `output_dir` (falling back past corrupt ones) and names it in
  `resume_from_checkpoint`. The Trainer reads where to resume from as an argument of `train()`,
  and loads model, optimizer, scheduler, RNG and data position before any callback event, so
  the caller must hand the folder in; the callback cannot arrange it without patching the
  Trainer. On a first start the attribute is None, which `train()` takes as a fresh start;
- every `checkpoint-N` the Trainer saves becomes a verified, manifest-last commit (`on_save`),
  followed by retention by the task's `keep`. The Trainer's own `save_total_limit` only prunes
  local folders that are already committed: the bucket keeps what `keep` says;
- the task's `checkpoint.every` sets `control.should_save` when it is due (steps, seconds, or
  auto: Daly's optimum, the same schedule as `sg.Run`'s), beside the Trainer's own `save_steps`;
  each save, whoever asked for it, restarts the interval;
- a cloud preemption notice sets `control.should_save`; SIGTERM saves, commits and exits with
  the preempted code SkyPilot recovers;
- the task's power cap, energy metering, ledger segments and budget, and `early_stopping` on
  the Trainer's evaluation metrics (`val_loss` also matches the Trainer's `eval_loss`);
- the task's precision must agree with `TrainingArguments(bf16=..., fp16=...)`: the Trainer
  builds its mixed precision before any callback runs, so a mismatch is an error naming the fix;
- under the smoke test (`SKYGREEN_SMOKE=1`) the Trainer saves into a scratch folder, trains
  two steps, commits, restores and compares the checkpoint, prints the smoke line and exits 0.

Resumes are bit-identical on CPU in fp32, dropout included: mid-epoch, the Trainer skips the
trained batches, fetches the next one and only then reloads the checkpoint's `rng_state.pth`,
right before the first resumed forward pass (transformers 5.17, `Trainer._run_epoch`:
`rng_to_sync` and `_load_rng_state` after `get_batch_samples`), so the dropout masks match.
One case is not: a restart from the checkpoint of `max_steps` itself (a VM lost after its last
commit, before the script's own end) trains one step more, because `_run_epoch` looks at
`should_training_stop` only after a step, and a callback cannot stop the Trainer before it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from skygreen.checkpoint.folders import RestoredFolder, folder_files
from skygreen.errors import SkygreenError
from skygreen.integrations.services import PREEMPTED, SMOKE_STEPS, TrainerServices, fail_script

log = logging.getLogger("skygreen.integrations")

__all__ = ["SkygreenCallback", "check_precision"]


class SkygreenCallback(TrainerCallback):
    """Verified checkpoints, exact resume, power, energy, ledger, budget and stopping for an HF `Trainer`.

    See the module's docstring for the lines to add. Every hook takes the Trainer's
    `(args, state, control, **kwargs)` and returns `control`, as `TrainerCallback` asks.

    Attributes:
        services: the run's parts, opened when the Trainer is built (`on_init_end`).
        resume_from_checkpoint: the restored checkpoint folder, for
            `trainer.train(resume_from_checkpoint=...)`; None on a fresh start.
    """

    def __init__(self) -> None:
        """Make the callback; it reads the run's settings only when the Trainer is built."""
        self.services: TrainerServices | None = None
        self.resume_from_checkpoint: str | None = None
        """The restored checkpoint folder, for `trainer.train(resume_from_checkpoint=...)`; None on a fresh start."""
        self._start_step = 0
        self._save_asked_s: float | None = None
        """When the callback last asked the Trainer to save (`on_step_end`), until that save is done."""

    # -- events ----------------------------------------------------------------------------

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Read the task's settings, check the precision, restore the latest checkpoint.

        The Trainer loads everything before the first callback event, so the restore happens
        here, at construction, and the folder goes back to the script to hand to `train()`.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state (`global_step`).
            control: the Trainer's flags for this event.
            **kwargs: the Trainer's other objects (model, metrics, ...).

        Returns:
            `control`, unchanged.

        Raises:
            SystemExit: a skygreen error (not started by skygreen, another trainer in the task,
                a precision that disagrees, a bucket that fails): its message on stderr, no
                traceback (unless SKYGREEN_DEBUG=1, which re-raises it), and its exit code
                (2 for bad input, 1 otherwise).
        """
        try:
            services = TrainerServices.from_env(trainer="transformers")
            check_precision(services.settings.precision, args)
            if services.smoke:
                args.output_dir = str(services.scratch_dir())
            restored = services.restore(_output_dir(args))
            services.frozen_base = frozen_base_of(kwargs.get("model"), restored)
        except SkygreenError as e:
            fail_script(e, smoke=os.environ.get("SKYGREEN_SMOKE") == "1")
        self.services = services
        self.resume_from_checkpoint = str(restored.path) if restored else None
        if restored:
            log.info("resume: trainer.train(resume_from_checkpoint=%s)", restored.path)
        return control

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Start the power cap, ledger segment, notice watcher and SIGTERM latch, at the resumed step.

        Warns when a checkpoint was restored but the Trainer starts from step 0 (the script
        did not pass `resume_from_checkpoint`).

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state (`global_step`).
            control: the Trainer's flags for this event.
            **kwargs: the Trainer's other objects (model, metrics, ...).

        Returns:
            `control`, unchanged.

        Raises:
            RuntimeError: the callback missed `on_init_end` (it was added after the Trainer was built).
            SystemExit: `power.required` and the cap cannot be applied, an unknown
                `SKYGREEN_CLOUD` or another bad runtime setting: exit 2 with the message and its
                fix and no traceback (unless SKYGREEN_DEBUG=1), as at the callback's
                construction; the power limit is put back first (`TrainerServices.start`).
        """
        services = self._services()
        services.warn_if_not_resumed(
            self.resume_from_checkpoint,
            step=state.global_step,
            argument="resume_from_checkpoint=callback.resume_from_checkpoint to trainer.train()",
        )
        self._start_step = state.global_step
        services.start(
            step=state.global_step,
            samples=_samples(args, state.global_step),
            total_steps=state.max_steps or None,
            device=args.device,
        )
        return control

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Feed the power profile and check the budget; `checkpoint.every`, a notice, SIGTERM or budget asks for a save.

        SIGTERM and the budget also stop training; the smoke test stops after its two steps.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state (`global_step`).
            control: the Trainer's flags for this event.
            **kwargs: the Trainer's other objects (model, metrics, ...).

        Returns:
            `control`, with `should_save` (and `should_training_stop`) set when needed.
        """
        services = self._services()
        step = state.global_step
        verdict = services.after_step(step=step, samples=_samples(args, step), start_step=self._start_step)
        if verdict.save and self._save_asked_s is None:
            self._save_asked_s = time.monotonic()
        control.should_save = control.should_save or verdict.save
        control.should_training_stop = control.should_training_stop or verdict.stop
        return control

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Feed the task's early-stopping metric (`val_loss` also matches `eval_loss`); a stop saves first.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state (`global_step`).
            control: the Trainer's flags for this event.
            **kwargs: the Trainer's other objects (model, metrics, ...).

        Returns:
            `control`, with `should_save` and `should_training_stop` set when early stopping says stop.
        """
        metrics = kwargs.get("metrics") or {}
        if self._services().evaluated(metrics, state.global_step):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Commit the folder the Trainer just saved; after SIGTERM, exit with the preempted code.

        Every rank meets first (each wrote its own RNG file); rank 0 commits the folder
        manifest-last and applies retention by the task's `keep`.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state (`global_step`).
            control: the Trainer's flags for this event.
            **kwargs: the Trainer's other objects (model, metrics, ...).

        Returns:
            `control`, unchanged.

        Raises:
            SystemExit: after SIGTERM, with the preempted code (75) once the commit is done;
                under the smoke test, 0 when the round trip matched and 1 when it did not.
            StoreError: the commit failed in the bucket (a smoke test prints its failure line
                and exits with the error's code instead).
            CheckpointError: the commit failed otherwise (a newer life holds the lease, ...).
        """
        services = self._services()
        folder = _output_dir(args) / f"checkpoint-{state.global_step}"
        services.ranks_saved()  # every rank wrote its own rng_state_<rank>.pth before rank 0 commits
        if state.is_world_process_zero:
            try:
                services.commit(folder, step=state.global_step, samples=_samples(args, state.global_step))
            except SkygreenError as e:
                if services.smoke:
                    fail_script(e, smoke=True, phase="save")
                raise
        asked_s, self._save_asked_s = self._save_asked_s, None
        services.saved(state.global_step, save_cost_s=None if asked_s is None else time.monotonic() - asked_s)
        if services.smoke:
            saved = dict(folder_files(folder))
            services.smoke_round_trip(
                saved, step=state.global_step, line=f"HF Trainer: {SMOKE_STEPS} steps, {folder.name}"
            )
        services.hold_if_asked(state.global_step)
        if services.sigterm or services.stop_reason == PREEMPTED:
            services.exit_preempted(step=state.global_step, samples=_samples(args, state.global_step))
        return control

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Close the ledger segment (completed, early-stopped or budget) and put the power back.

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state (`global_step`).
            control: the Trainer's flags for this event.
            **kwargs: the Trainer's other objects (model, metrics, ...).

        Returns:
            `control`, unchanged.

        Raises:
            SystemExit: 1 under the smoke test, which should have ended in `on_save`.
        """
        services = self._services()
        services.close(step=state.global_step, samples=_samples(args, state.global_step))
        if services.smoke:
            raise SystemExit(1)  # `smoke_round_trip` exits 0 once the round trip passed; no save came
        return control

    # -- helpers ---------------------------------------------------------------------------

    def _services(self) -> TrainerServices:
        if self.services is None:
            raise RuntimeError("SkygreenCallback: pass it to Trainer(callbacks=[...]) so it sees on_init_end")
        return self.services


def frozen_base_of(model: Any, restored: RestoredFolder | None) -> dict[str, Any] | None:
    """A PEFT model's frozen base identity, checked against the restored commit's.

    The Trainer saves only a PEFT model's adapter; this keeps the base it sits on. None for a
    model that is no PEFT model.

    Raises:
        BaseModelMismatchError: the restored adapter was trained on another base.
    """
    from skygreen.runtime.frozen_base import FROZEN_BASE_META, base_identity, check_base, peft_model

    peft = peft_model(model) if model is not None else None
    if peft is None:
        return None
    identity = base_identity(peft)
    if restored is not None:
        check_base(restored.manifest.meta.get(FROZEN_BASE_META), identity)
    return identity.to_json()


def check_precision(task_precision: str, args: TrainingArguments) -> None:
    """Check the task's precision against the script's `TrainingArguments`.

    The Trainer sets up mixed precision before any callback runs, so the callback cannot
    apply the task's choice; it can only refuse a script that trains in another one.

    Args:
        task_precision: the task's `precision` (`auto` accepts whatever the script chose).
        args: the script's arguments (`bf16`, `fp16`).

    Raises:
        RuntimeSetupError: they disagree; the message names both and the switch to set.
    """
    from skygreen.errors import RuntimeSetupError

    script = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    if task_precision in ("auto", script):
        return
    switch = {"bf16": "bf16=True", "fp16": "fp16=True", "fp32": "bf16=False, fp16=False"}[task_precision]
    raise RuntimeSetupError(
        f"the task says precision: {task_precision}, and the script's TrainingArguments train in {script} "
        f"(bf16={args.bf16}, fp16={args.fp16})\n"
        f"  fix: TrainingArguments(..., {switch}), or set `precision: {script}` (or auto) in the task"
    )


def _output_dir(args: TrainingArguments) -> Path:
    """Where the Trainer saves its `checkpoint-N` folders (its default when the script names none)."""
    return Path(args.output_dir or "trainer_output")


def _samples(args: TrainingArguments, step: int) -> int:
    return step * args.train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1)
