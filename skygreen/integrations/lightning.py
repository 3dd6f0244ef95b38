"""skygreen for PyTorch Lightning scripts: one callback, one argument.

    from skygreen.integrations.lightning import SkygreenCallback

    skygreen = SkygreenCallback()
    trainer = L.Trainer(..., callbacks=[skygreen, ModelCheckpoint(...)])
    trainer.fit(model, datamodule, ckpt_path=skygreen.ckpt_path)

What the callback does, started by `skygreen up` (or `up --local`):

- when it is built, it restores the newest checkpoint that verifies from the task's bucket
  (falling back past corrupt ones) into a local folder and names the `.ckpt` file in
  `ckpt_path`. Lightning reads where to resume from as an argument of `fit()` and restores the
  model, optimizers, schedulers and loop progress before any callback hook that could change
  it, so the caller hands the file in, as with `ckpt_path="last"`. On a first start it is None,
  which `fit()` takes as a fresh start;
- in `setup` it puts `SkygreenCheckpointIO` in front of the strategy's `CheckpointIO`: every
  checkpoint Lightning writes (`ModelCheckpoint`, `trainer.save_checkpoint`) is written as
  usual and then committed as a verified, manifest-last folder commit, followed by retention by
  the task's `keep`. `ModelCheckpoint(save_top_k=...)` only prunes local files: the bucket
  keeps what `keep` says. Loading reads with `torch.load(weights_only=True)`;
- the task's `checkpoint.every` calls `trainer.save_checkpoint` when it is due (steps, seconds,
  or auto: Daly's optimum, the same schedule as `sg.Run`'s), beside `ModelCheckpoint`'s saves;
  each save, whoever asked for it, restarts the interval. Such a save may fall inside an epoch,
  and Lightning resumes inside an epoch exactly only with a resumable dataloader (one with
  `state_dict`/`load_state_dict`, such as torchdata's `StatefulDataLoader`);
- a cloud preemption notice saves a checkpoint at once; SIGTERM saves, commits and exits with
  the preempted code SkyPilot recovers;
- the task's power cap, energy metering, ledger segments and budget, and `early_stopping` on
  the metrics the module logs (`self.log("val_loss", ...)`);
- the task's precision must agree with `Trainer(precision=...)`: Lightning builds its precision
  plugin before any callback runs, so a mismatch is an error naming the fix;
- under the smoke test (`SKYGREEN_SMOKE=1`) checkpoints go to a scratch folder; after two steps
  it saves, commits, restores and compares the checkpoint, prints the smoke line and exits 0.

Resuming is exact where Lightning's restore is: model, optimizer, scheduler and loop progress
come back, the global RNG state and a dataloader's position inside an epoch do not. Save at
epoch ends (`ModelCheckpoint(every_n_epochs=1)`) and shuffle with a sampler that has
`set_epoch` (Lightning calls it each epoch) for bit-identical resumes; tasks/lightning_task.py
does so.

For `lightning` (`import lightning as L`) and `pytorch_lightning`: the callback derives from the
Lightning package the script imported first (`lightning` where neither or both are).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from skygreen.errors import RuntimeSetupError, SkygreenError
from skygreen.integrations.services import SMOKE_FAILED, SMOKE_STEPS, TrainerServices, fail_script


def _framework() -> tuple[Any, Any]:
    """Return Lightning's `Callback` and `CheckpointIO` from the package the script imported first.

    `lightning` where neither or both are imported, `pytorch_lightning` where only it is installed.
    """
    import importlib

    pairs = [("lightning.pytorch", "lightning.fabric.plugins"), ("pytorch_lightning", "lightning_fabric.plugins")]
    if "pytorch_lightning" in sys.modules and "lightning" not in sys.modules:
        pairs.reverse()
    for trainer_module, plugins_module in pairs:
        try:
            trainer, plugins = importlib.import_module(trainer_module), importlib.import_module(plugins_module)
        except ImportError:
            continue
        return trainer.Callback, plugins.CheckpointIO
    raise ImportError("skygreen.integrations.lightning needs lightning: pip install 'skygreen[lightning]'")


_Callback: Any
_CheckpointIO: Any
_Callback, _CheckpointIO = _framework()

log = logging.getLogger("skygreen.integrations")

__all__ = ["SkygreenCallback", "SkygreenCheckpointIO", "check_precision"]

CKPT_SUFFIX = ".ckpt"
LIGHTNING_PRECISIONS = {"bf16": "bf16", "16": "fp16", "32": "fp32", "64": "fp64"}
"""`Trainer.precision` ("bf16-mixed", "16-true", "32-true", ...) by its number, as the task names it."""


class SkygreenCheckpointIO(_CheckpointIO):
    """Lightning's storage plugin: the strategy's own `CheckpointIO`, plus a commit of each file.

    Every checkpoint Lightning writes (`ModelCheckpoint`, `trainer.save_checkpoint`) is written
    as usual, then committed as a verified folder commit of its step in the task's bucket:
    a storage plugin sees every save, which no callback hook does.
    """

    def __init__(self, callback: SkygreenCallback, inner: Any) -> None:
        """Wrap `inner`; `SkygreenCallback.setup` does this.

        Args:
            callback: the callback whose services commit, and whose counts go into the commit.
            inner: the `CheckpointIO` that writes and removes local files (Lightning's default).
        """
        self.callback = callback
        self.inner = inner

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write the file, then commit it (rank 0; Lightning calls this on rank 0 only).

        Args:
            checkpoint: Lightning's checkpoint dict (its `global_step` names the commit).
            path: the file to write.
            storage_options: passed to the inner plugin.

        Raises:
            StoreError: the commit failed in the bucket.
            CheckpointError: the commit failed otherwise (a newer life holds the lease, ...).
        """
        self.inner.save_checkpoint(checkpoint, path, storage_options)
        step = int(checkpoint.get("global_step", 0))
        self.callback.committed(Path(path), step=step)

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> Any:
        """Read a checkpoint with `torch.load(weights_only=True)`: bucket contents are untrusted.

        Args:
            path: the `.ckpt` file.
            map_location: where tensors go (default: the CPU).
            weights_only: ignored: always True, whatever the caller asks.

        Returns:
            The checkpoint dict.
        """
        import torch

        return torch.load(path, map_location=map_location or "cpu", weights_only=True)

    def remove_checkpoint(self, path: Any) -> None:
        """Remove the local file only; the bucket's retention follows the task's `keep`.

        Args:
            path: the local file `ModelCheckpoint` prunes.
        """
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        """Let the inner plugin clean up."""
        self.inner.teardown()


class SkygreenCallback(_Callback):
    """Verified checkpoints, exact resume, power, energy, ledger, budget and stopping for a Lightning `Trainer`.

    See the module's docstring for the lines to add. The restore happens when the callback is
    built, because Lightning reads `ckpt_path` as an argument of `fit()` before any hook runs.
    """

    def __init__(self, *, restore_dir: str | os.PathLike[str] = "skygreen-restored") -> None:
        """Read the task's settings and restore the newest checkpoint that verifies.

        Args:
            restore_dir: the local folder the restored checkpoint goes into; its `.ckpt` file
                becomes `ckpt_path`.

        Raises:
            SystemExit: with skygreen's exit code and message (no traceback unless
                SKYGREEN_DEBUG=1, which re-raises the error) when the script was not started by
                skygreen, the task names another trainer, the bucket cannot be read, or the
                restored folder holds no `.ckpt` file.
        """
        self.ckpt_path: str | None = None
        """The restored checkpoint file, for `trainer.fit(..., ckpt_path=...)`; None on a fresh start."""
        self._start_step = 0
        self._last_commit: int | None = None
        self._last_saved: int | None = None
        """The step of the latest save on this rank (every rank saves; rank 0 commits)."""
        self._last_file: Path | None = None
        self._trainer: Any = None
        try:
            services = TrainerServices.from_env(trainer="lightning")
            parent = services.scratch_dir() / "restored" if services.smoke else Path(restore_dir)
            restored = services.restore(parent)
        except SkygreenError as e:
            fail_script(e, smoke=os.environ.get("SKYGREEN_SMOKE") == "1")
        self.services = services
        if restored is not None:
            files = sorted(restored.path.glob(f"*{CKPT_SUFFIX}"))
            if not files:
                fail_script(RuntimeSetupError(f"the checkpoint folder of step {restored.step} holds no .ckpt file\n"
                                        "  fix: check the bucket; the run's commits were not made by this callback"),
                      smoke=services.smoke)  # fmt: skip
            self.ckpt_path = str(files[0])
            log.info("resume: trainer.fit(..., ckpt_path=%s)", self.ckpt_path)

    # -- hooks -----------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Check the precision, put the storage plugin in place, send the smoke test's saves to scratch.

        Only for `stage == "fit"`; validation, test and predict runs are left alone.

        Args:
            trainer: the Lightning `Trainer`.
            pl_module: the `LightningModule` being fitted.
            stage: Lightning's stage.

        Raises:
            SystemExit: the task's precision disagrees with `Trainer(precision=...)` (exit 2,
                the message naming the fix).
        """
        if stage != "fit":
            return
        services = self.services
        try:
            check_precision(services.settings.precision, str(trainer.precision))
        except SkygreenError as e:
            fail_script(e, smoke=services.smoke)
        self._trainer = trainer
        strategy = trainer.strategy
        if not isinstance(strategy.checkpoint_io, SkygreenCheckpointIO):
            strategy.checkpoint_io = SkygreenCheckpointIO(self, strategy.checkpoint_io)
        if services.smoke:
            for checkpoint in trainer.checkpoint_callbacks:
                checkpoint.dirpath = str(services.scratch_dir() / "checkpoints")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Start the power cap, ledger segment and preemption watch, at the resumed step.

        Warns when a checkpoint was restored but the Trainer starts from step 0 (the script
        did not pass `ckpt_path`).

        Args:
            trainer: the Lightning `Trainer`.
            pl_module: the `LightningModule` being fitted.

        Raises:
            SystemExit: `power.required` and the cap cannot be applied, an unknown
                `SKYGREEN_CLOUD` or another bad runtime setting: exit 2 with the message and its
                fix and no traceback (unless SKYGREEN_DEBUG=1), as at the callback's
                construction; the power limit is put back first (`TrainerServices.start`).
        """
        self.services.warn_if_not_resumed(
            self.ckpt_path, step=trainer.global_step, argument="ckpt_path=callback.ckpt_path to trainer.fit()"
        )
        self._start_step = trainer.global_step
        self.services.start(
            step=trainer.global_step,
            samples=self._samples(trainer),
            total_steps=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None,
            device=trainer.strategy.root_device,
        )

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Feed the power profile and check the budget after each batch.

        `checkpoint.every` or a notice saves; SIGTERM saves and exits; a budget stop saves and stops the Trainer.

        Args:
            trainer: the Lightning `Trainer`.
            pl_module: the `LightningModule` being fitted.
            outputs: the step's outputs (unused).
            batch: the batch (unused).
            batch_idx: its index (unused).

        Raises:
            SystemExit: after SIGTERM, with the preempted code (75) once the checkpoint is
                committed; under the smoke test, 0 once its round trip passed and 1 when not.
        """
        services = self.services
        step = trainer.global_step
        verdict = services.after_step(step=step, samples=self._samples(trainer), start_step=self._start_step)
        if services.smoke and verdict.stop:
            self._smoke_check(trainer)
        if verdict.save:
            self._save(trainer)
        if verdict.exit_preempted:
            services.exit_preempted(step=step, samples=self._samples(trainer))
        if verdict.stop:
            trainer.should_stop = True

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Every save, on every rank (`ModelCheckpoint`'s too), restarts `checkpoint.every`'s interval.

        Args:
            trainer: the Lightning `Trainer`.
            pl_module: the `LightningModule` being fitted.
            checkpoint: the checkpoint dict being saved (unchanged).
        """
        self._last_saved = trainer.global_step
        self.services.saved(trainer.global_step)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Feed the task's early-stopping metric among the logged ones; a stop saves first.

        The sanity check's validation is ignored: its metrics come from an untrained model.

        Args:
            trainer: the Lightning `Trainer`.
            pl_module: the `LightningModule` being fitted.
        """
        if trainer.sanity_checking or self.services.parts is None:
            return
        metrics = {k: _number(v) for k, v in trainer.callback_metrics.items()}
        numbers = {k: v for k, v in metrics.items() if v is not None}
        if self.services.evaluated(numbers, trainer.global_step) and not trainer.should_stop:
            self._save(trainer)
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Close the ledger segment (completed, early-stopped or budget) and put the power back.

        Args:
            trainer: the Lightning `Trainer`.
            pl_module: the `LightningModule` being fitted.

        Raises:
            SystemExit: 1 under the smoke test, which should have ended after its two steps.
        """
        if self.services.smoke:
            self.services.close(step=trainer.global_step)
            _smoke_exit(f"{SMOKE_FAILED} train: the Trainer finished before {SMOKE_STEPS} steps")
        self.services.close(step=trainer.global_step, samples=self._samples(trainer))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Close the ledger segment of a failed or interrupted fit with how it ended.

        The runtime's own exits (SystemExit: preempted, smoke) already closed it.

        Args:
            trainer: the Lightning `Trainer`.
            pl_module: the `LightningModule` being fitted.
            exception: what ended the fit; KeyboardInterrupt is `cancelled`, others `failed`.
        """
        if isinstance(exception, SystemExit):
            return
        end = "cancelled" if isinstance(exception, KeyboardInterrupt) else "failed"
        self.services.close(step=trainer.global_step, samples=self._samples(trainer), end=end)

    # -- called by the storage plugin ------------------------------------------------------

    def committed(self, file: Path, *, step: int) -> None:
        """Commit the checkpoint file just written as the folder commit of `step`.

        One commit per step: a second file of the same step (`save_last`) is not committed.
        Then holds there when a test asks (`SKYGREEN_TEST_HOLD_AT_STEPS`).

        Args:
            file: the `.ckpt` file Lightning wrote.
            step: its global step.

        Raises:
            StoreError: the commit failed in the bucket (a smoke test prints its failure line
                and exits with the error's code instead).
            CheckpointError: the commit failed otherwise.
        """
        services = self.services
        if step == self._last_commit:  # a second file of one step (`save_last`): one commit per step
            return
        with tempfile.TemporaryDirectory(prefix="skygreen-ckpt-") as tmp:
            folder = Path(tmp) / f"step-{step}"
            folder.mkdir()
            _link_or_copy(file, folder / file.name)
            try:
                services.commit(folder, step=step, samples=self._samples(self._trainer))
            except SkygreenError as e:
                if services.smoke:
                    fail_script(e, smoke=True, phase="save")
                raise
        self._last_commit, self._last_file = step, Path(file)
        services.hold_if_asked(step)

    # -- helpers ---------------------------------------------------------------------------

    def _save(self, trainer: Any) -> None:
        """Save a checkpoint of the current step, unless this step is already saved.

        It goes into the first ModelCheckpoint's folder (or `<default_root_dir>/checkpoints`).
        Every rank calls this at the same step (`trainer.save_checkpoint` is a collective), and
        every rank knows what it saved, where only rank 0 knows what it committed.
        """
        if trainer.global_step in (self._last_saved, self._last_commit):
            return
        dirpath = next((c.dirpath for c in trainer.checkpoint_callbacks if c.dirpath), None)
        folder = Path(dirpath or Path(trainer.default_root_dir) / "checkpoints")
        started_s = time.monotonic()
        trainer.save_checkpoint(str(folder / f"skygreen-step={trainer.global_step}{CKPT_SUFFIX}"))
        self.services.saved(trainer.global_step, save_cost_s=time.monotonic() - started_s)

    def _samples(self, trainer: Any) -> int:
        """Samples seen: optimizer steps x batch size x accumulation x ranks (0 when the batch size is unknown)."""
        if trainer is None:
            return 0
        loader = getattr(trainer, "train_dataloader", None)
        batch = getattr(loader, "batch_size", None) or 0
        return int(trainer.global_step * batch * trainer.accumulate_grad_batches * max(trainer.world_size, 1))

    def _smoke_check(self, trainer: Any) -> NoReturn:
        """Save, restore the commit into a scratch folder and check it; print the smoke line and exit.

        The bytes are compared and the checkpoint is loaded as `fit(ckpt_path=...)` would.
        """
        step = trainer.global_step
        self._save(trainer)
        saved = self._last_file if self._last_commit == step else None
        self.services.smoke_round_trip(
            {saved.name: saved} if saved is not None else {},
            step=step,
            line=f"Lightning: {SMOKE_STEPS} steps, checkpoint of step {step}",
            loads=lambda folder: self._loads(trainer, next(folder.glob(f"*{CKPT_SUFFIX}"))),
        )

    def _loads(self, trainer: Any, file: Path) -> str | None:
        """What differs when the restored checkpoint loads as `fit(ckpt_path=...)` would; None if nothing.

        The weights it holds must equal the module's.
        """
        import torch

        state = trainer.strategy.checkpoint_io.load_checkpoint(file)
        module_state = trainer.lightning_module.state_dict()
        for name, tensor in state["state_dict"].items():
            if not torch.equal(tensor, module_state[name].detach().cpu()):
                return f"{name} differs after the round trip"
        return None


def check_precision(task_precision: str, trainer_precision: str) -> None:
    """Check the task's precision against `Trainer(precision=...)`; `auto` accepts the script's.

    Lightning builds its precision plugin before any callback runs, so the callback cannot
    apply the task's choice; it can only refuse a script that trains in another one.

    Args:
        task_precision: the task's `precision` (auto, bf16, fp16, fp32).
        trainer_precision: the Trainer's, as Lightning names it ("bf16-mixed", "32-true", ...).

    Raises:
        RuntimeSetupError: they disagree; the message names both and the switch to set.
    """
    script = LIGHTNING_PRECISIONS.get(trainer_precision.split("-")[0], trainer_precision)
    if task_precision in ("auto", script):
        return
    switch = {"bf16": '"bf16-mixed"', "fp16": '"16-mixed"', "fp32": '"32-true"'}[task_precision]
    raise RuntimeSetupError(
        f"the task says precision: {task_precision}, and the script's Trainer trains in {script} "
        f"(precision={trainer_precision!r})\n"
        f"  fix: Trainer(..., precision={switch}), or set `precision: {script}` (or auto) in the task"
    )


def _number(value: Any) -> float | None:
    """A logged metric (a tensor of one element, or a number) as a float; None otherwise."""
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _smoke_exit(line: str) -> NoReturn:
    print(line, flush=True)
    raise SystemExit(1)
