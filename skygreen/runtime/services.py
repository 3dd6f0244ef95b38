"""A run's services, opened once from its settings: what a trainer that owns its loop uses.

`Run` is one user of these parts; a Hugging Face or Lightning callback, or an FSDP script, is
another. Each part is built from explicit arguments (settings, device, world, store) and can be
used alone; `open_services` builds them all in the order they depend on each other:

- `checkpointer`: verified, asynchronous checkpoints of a mapping of named stateful objects
  (`save_state` / `restore_state`) in `<bucket>/<run_id>`;
- `governor`: this rank's GPU power cap, `auto` profile and energy meter;
- `book`: the run ledger's segment for this VM and the budget (rank 0 only, else None);
- `stopper`: early stopping on the configured metric (None when not configured);
- `preemption`: SIGTERM and the cloud's preemption notice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from skygreen.checkpoint.interval import CheckpointSchedule, IntervalPolicy
from skygreen.checkpoint.store import RetryPolicy, Store
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.power.governor import PowerGovernor
from skygreen.power.originals import OriginalLimits
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.early_stop import EarlyStopper
from skygreen.runtime.environment import device_facts
from skygreen.runtime.parent import die_with_parent
from skygreen.runtime.power import open_governor
from skygreen.runtime.preemption import PreemptionWatch, landed_cloud
from skygreen.runtime.ranks import World
from skygreen.runtime.run_book import RunBook
from skygreen.task.settings import RuntimeSettings

if TYPE_CHECKING:
    from skygreen.bill.interval import SaveBill
    from skygreen.runtime.sharded import ShardedCheckpointer


def open_checkpointer(settings: RuntimeSettings, *, world: World, retry: RetryPolicy | None = None) -> Checkpointer:
    """Open the checkpointer of a run in `<bucket>/<run_id>`, as the task file configured it.

    The keep count, half-precision weights and the early-stopping mode (for `keep` by best
    metric) come from `settings`, so a trainer that owns its loop checkpoints exactly as `Run`
    would and `skygreen status` reads both the same way.

    Args:
        settings: the run's settings.
        world: this process's rank and world size (one checkpointer per rank).
        retry: the store's retry policy (default: the store's own).

    Returns:
        The checkpointer; `close()` it at the end.

    Raises:
        InputError: a bad keep, half precision or metric mode, or a rank outside the world
            (`SpecError`, a subclass, for the keep count and for a bucket URL whose scheme is
            not `s3://`, `gs://` or `file://`).
        StoreError: the bucket's client library (boto3, google-cloud-storage) is not installed.
    """
    return Checkpointer(
        f"{settings.bucket.rstrip('/')}/{settings.run_id}",
        keep=settings.checkpoint_keep,
        half_precision=settings.checkpoint_half_precision,
        rank=world.rank,
        world_size=world.size,
        metric_mode=settings.early_stop.mode if settings.early_stop else "min",
        retry=retry,
        launch=settings.launch,
    )


def open_stopper(settings: RuntimeSettings) -> EarlyStopper | None:
    """Open the early stopper the task file configured.

    Args:
        settings: the run's settings; `settings.early_stop` is the metric, mode and patience.

    Returns:
        A fresh stopper (a resume loads its state from the checkpoint), or None when the task
        has no `early_stopping`.
    """
    return EarlyStopper(settings.early_stop) if settings.early_stop else None


def open_schedule(
    settings: RuntimeSettings, *, environ: Mapping[str, str], start_step: int, start_s: float
) -> CheckpointSchedule:
    """The run's checkpoint cadence, as the task's `checkpoint.every` says: steps, seconds or auto.

    Auto is Daly's optimum at the preemption rate of the cloud the run landed on or, where a save's
    bytes cost dollars between this VM and the bucket (`save_bill`), the plan's dollar-optimal
    interval for the bytes each commit measured. `sg.Run` and the trainer callbacks (`skygreen.integrations`) both take their schedule from here, so that
    `every: auto` (and every other form) means one thing whoever drives the loop.

    Args:
        settings: the run's settings (`checkpoint_every_steps`, `checkpoint_every_s`, the rates).
        environ: the process environment (where the run landed: `SKYPILOT_CLUSTER_INFO`).
        start_step: the step training starts (or resumes) at.
        start_s: when it starts, on the clock later passed to `due` (`time.monotonic()`).

    Returns:
        The schedule: ask `due(step, now_s)` after each step, tell it `saved(...)` after each save.
    """
    rate = settings.preemption_rate_on(landed_cloud(settings.cloud, environ))
    policy = IntervalPolicy(
        every_steps=settings.checkpoint_every_steps,
        every_s=settings.checkpoint_every_s,
        bill=save_bill(settings, environ),
        **({"preemptions_per_hour": rate} if rate else {}),
    )
    return CheckpointSchedule(policy, start_step=start_step, start_s=start_s)


def save_bill(settings: RuntimeSettings, environ: Mapping[str, str]) -> SaveBill | None:
    """Where this VM and the bucket are and what the VM costs, for `every: auto` to weigh a save.

    None where bytes are free or unpriced: a local VM or bucket, or an offer without a price.

    The VM's place and price come from where it landed and the plan's offers (`current_place`, as
    the budget reads them); the bucket's from its URL and `checkpoint.region` (else its cloud's
    default region). A restart costs `skygreen.plan.cost.PROVISION_S` besides the restore, as in
    the plan.
    """
    from skygreen.bill.bucket import bucket_place
    from skygreen.bill.interval import SaveBill
    from skygreen.bill.rates import CLOUDS, DEFAULT_REGION
    from skygreen.bill.rates import Place as BillPlace
    from skygreen.checkpoint.bucket_set import nearest_url
    from skygreen.ledger.place import current_place
    from skygreen.plan.cost import PROVISION_S

    place = current_place(environ, gpu=None)
    url = nearest_url(settings.bucket, environ)  # a bucket set: the one this VM commits to
    bucket = bucket_place(url, stated_region=settings.checkpoint_region if url == settings.bucket else None)
    if bucket is None or place.cloud not in CLOUDS or not place.price_usd_per_hour:
        return None
    vm = BillPlace(cloud=place.cloud, region=place.region or DEFAULT_REGION[place.cloud])
    return SaveBill(
        vm=vm, bucket=bucket.place, price_usd_per_hour=place.price_usd_per_hour * place.nodes, restart_s=PROVISION_S
    )


@dataclass(kw_only=True, slots=True)
class RunServices:
    """The parts of one run on one rank, built by `open_services`.

    One record instead of a `Run`, so that a trainer owning its loop (HF, Lightning, an FSDP
    script) gets the same checkpoints, power, ledger, budget and stopping as `sg.Run`.

    Attributes:
        settings: the run's settings.
        world: this process's rank and world size.
        checkpointer: full or sharded checkpoints in `<bucket>/<run_id>`.
        governor: this rank's GPU power cap, `auto` profile and energy meter.
        book: the run ledger and budget (rank 0 only).
        stopper: early stopping; None when the task configures none.
        preemption: SIGTERM and the cloud's preemption notice.
    """

    settings: RuntimeSettings
    world: World
    checkpointer: Checkpointer | ShardedCheckpointer
    """Full checkpoints (`Checkpointer`), or an FSDP2 run's sharded ones (`ShardedCheckpointer`)."""
    governor: PowerGovernor
    book: RunBook | None
    """The run ledger and budget; None on ranks other than 0 and in the smoke test."""
    stopper: EarlyStopper | None
    preemption: PreemptionWatch

    @property
    def store(self) -> Store:
        """The run's bucket folder, `<bucket>/<run_id>`."""
        return self.checkpointer.store

    def report(self, metrics: Mapping[str, float], *, step: int) -> bool:
        """Record evaluation metrics in the ledger segment and feed the configured one to early stopping.

        Args:
            metrics: metric name -> value at `step`.
            step: the optimizer steps done.

        Returns:
            True once early stopping says stop (and from then on); False without a stopper.
        """
        if self.book is not None:
            self.book.reported(metrics, step)
        stopper = self.stopper
        if stopper is None:
            return False
        value = metrics.get(stopper.config.metric)
        return stopper.update(float(value)) if value is not None else stopper.stopped

    def metric(self, metrics: Mapping[str, float]) -> float | None:
        """The early-stopping metric to file with a checkpoint (for `keep` by best metric).

        Args:
            metrics: the metrics last reported.

        Returns:
            The configured metric's value when present and finite; None otherwise or without a stopper.
        """
        if self.stopper is None:
            return None
        value = metrics.get(self.stopper.config.metric)
        return value if value is not None and math.isfinite(value) else None

    def over_budget(self) -> bool:
        """Check the budget at a step boundary (at most once a second; rank 0 only).

        The check reads the ledger's spend, so it runs at most once a second: calls in between
        return False. Alerts due now are sent (log and webhook) on the way.

        Returns:
            True when the run's spend reached its budget: the caller checkpoints with state
            `budget` and exits 0. False without a ledger (ranks other than 0, the smoke test)
            or without a budget.
        """
        return self.book is not None and self.book.over_budget()

    def close(self) -> None:
        """Stop watching for preemption, restore the GPU's power limit, wait for the last checkpoint.

        A second call does nothing more.

        Raises:
            StoreError: the last checkpoint failed to commit (its error, re-raised).
            CheckpointError: the same, for a checkpoint the runtime could not write.
        """
        self.preemption.stop()
        self.governor.close()
        self.checkpointer.close()


def open_services(
    settings: RuntimeSettings,
    *,
    device: torch.device,
    world: World,
    environ: Mapping[str, str],
    checkpointer: Checkpointer | ShardedCheckpointer | None = None,
    originals: OriginalLimits | None = None,
    smoke: bool = False,
) -> RunServices:
    """Open a run's services once, from its settings.

    A rank of several (torchrun's worker) is tied to its parent's death first
    (`skygreen.runtime.parent`). Under DDP this is a collective (the ranks agree whether each
    has a GPU): call it on every rank, after the process group is initialised. Nothing is
    started yet: call `governor.start()` before the first step and `preemption.start()` from
    the main thread.

    Args:
        settings: the run's settings (`RuntimeSettings.from_env()` in a `skygreen up` run).
        device: this rank's torch device.
        world: this process's rank, world size and local rank (`World.from_env`).
        environ: the process environment (the cloud, the simulated GPU, timeouts, the webhook).
        checkpointer: one already made (default: `open_checkpointer(settings, world=world)`;
            a model sharded with FSDP2 passes `open_sharded_checkpointer(settings, world=world)`).
        originals: where the GPU's original power limit is recorded (default: this machine's).
        smoke: the CPU smoke test: no GPU, no ledger, no notice watcher.

    Returns:
        The services; `close()` them at the end.

    Raises:
        RuntimeSetupError: a bad `SKYGREEN_POWER_PROFILE_STEPS`, notice poll interval or
            SIGTERM deadline, or a `SKYGREEN_CLOUD` the notice watcher cannot watch. (A cap
            that cannot be applied is `governor.start()`'s error, and only with `required`.)
        InputError: bad checkpoint settings, when no checkpointer is given (`SpecError` for
            the keep count and the bucket URL).
        StoreError: the bucket's client library is not installed.
    """
    die_with_parent(environ)  # a rank outlives no torchrun agent (its own session escapes killpg)
    checkpointer = checkpointer or open_checkpointer(settings, world=world)
    governor = open_governor(settings, device=device, world=world, environ=environ, smoke=smoke, originals=originals)
    book = RunBook.open(
        settings,
        store=checkpointer.store,
        world=world,
        device_name=device_facts(device).name if device.type == "cuda" else None,
        environ=environ,
        metering=governor.gpu is not None,
        smoke=smoke,
    )
    cloud = None if smoke else landed_cloud(settings.cloud, environ)
    return RunServices(
        settings=settings,
        world=world,
        checkpointer=checkpointer,
        governor=governor,
        book=book,
        stopper=open_stopper(settings),
        preemption=PreemptionWatch(cloud=cloud, environ=environ, exit_code=PREEMPTED_EXIT_CODE),
    )
