"""What a run cost, from its ledger: the one function behind `status`, `cost` and `compare`.

    compute    = sum over segments of price_usd_per_hour x duration_h x nodes      (measured time)
    controller = the managed-jobs controller VM's price x (the run's span + its 10 min autostop)
                                                                                    (estimated)
    transfer   = each segment's bytes to and from each bucket, counted at the store, x the rate
                 between the VM's place and the bucket's (`skygreen.ledger.data_bill`)  (measured bytes)
    storage    = checkpoint bytes kept x the bucket's $/GB-month x the run's span  (measured: the
                 bucket's checkpoints now; estimated: newest checkpoint x keep, where unread)
    requests   = writes and reads x the bucket's request prices                    (estimated
                 from the measured bytes: the store counts bytes, not calls)
    total      = compute + controller + transfer + storage + requests

Assumptions (printed with every cost, `RunCost.assumptions`):
- A segment's duration is the runtime's lifetime on that VM, from the training process's
  start to its end (or, for a VM killed without warning, to its last ledger update, at most
  one checkpoint interval early). Provisioning and `setup` before the process starts are not
  seen: SkyPilot reports no per-job cost or VM lifetime.
- The price is the catalog price of the offer the segment ran on: rendered into the job at
  launch (the plan's offer), else looked up in the catalog now. Real bills differ: the catalog
  refreshes about every 7 h, and the VMs' disks and their own internet traffic (datasets,
  images, packages) are not counted.
- The controller serves this run alone (an upper bound: it is shared by every managed job of
  the user), on the cloud of the run's first segment, at the list price of SkyPilot's default
  controller size (4 vCPU, 16 GiB: `sky/jobs/constants.py`), and stops 10 minutes after the run.
- Data: list prices from `skygreen.bill`'s sourced table (US source regions), each direction
  on the run's own volume (monthly tiers and free allowances are account-wide); a bucket's
  region is read, stated or assumed (`skygreen.bill.bucket`); storage is standard class, for
  the run's span only (what stays in the bucket afterwards is the user's to keep or delete).
- Energy: what the runtime metered (GPU boards only), times each segment's cloud's PUE; CO2e
  with each segment's region's grid intensity (`skygreen.ledger.energy`, the one computation).

Pure: segments, prices and sizes are passed in.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from skygreen.bill.bucket import SCHEME_CLOUD, bucket_place
from skygreen.bill.rates import DEFAULT_REGION, load_rates
from skygreen.bill.rates import Place as BillPlace
from skygreen.ledger.data_bill import ESTIMATED, LEDGER_WRITE_S, MEASURED, DataBill, data_bill
from skygreen.ledger.energy import RunEnergy, SegmentEnergy, run_energy, segment_energy
from skygreen.ledger.records import BUDGET, CANCELLED, COMPLETED, EARLY_STOPPED, KILLED, PREEMPTED, Place, Segment

CONTROLLER_USD_PER_HOUR: Mapping[str, float] = {"aws": 0.192, "gcp": 0.194, "azure": 0.192}
"""On-demand list prices (us-east-1 m6i.xlarge, us-central1 n2-standard-4, eastus
Standard_D4s_v5; read 2026-11) of the 4 vCPU / 16 GiB VM SkyPilot picks for its controller."""
CONTROLLER_AUTOSTOP_S = 600.0
STORAGE_USD_PER_GB_MONTH: Mapping[str, float] = {
    **{scheme: load_rates().storage_usd_per_gb_month[cloud] for scheme, cloud in SCHEME_CLOUD.items()},
    "file": 0.0,
}
"""Per URL scheme, from `skygreen.bill`'s table: standard class, first tier."""
HOURS_PER_MONTH = 730.0

PriceLookup = Callable[[Place], float | None]


@dataclass(frozen=True, kw_only=True, slots=True)
class SegmentCost:
    """One segment priced: its compute dollars (0 where no price is known) and its energy where it
    ran (`skygreen.ledger.energy.segment_energy`: boards, facility, CO2e; None where nothing metered it)."""

    segment: Segment
    price_usd_per_hour: float | None
    """Per node; None when neither the ledger nor the catalog knows the offer."""
    price_source: str
    cost_usd: float
    energy: SegmentEnergy

    @property
    def gpu_energy_kwh(self) -> float | None:
        """The GPU boards' energy."""
        return self.energy.gpu_energy_kwh

    @property
    def energy_kwh(self) -> float | None:
        """The facility's energy (boards x PUE)."""
        return self.energy.energy_kwh

    @property
    def co2e_kg(self) -> float | None:
        """CO2e of the facility energy at the segment's region's intensity."""
        return self.energy.co2e_kg


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCost:
    """What a run cost and did, from its ledger: the figures `status`, `cost` and `compare` show.
    Money in dollars, energy in kWh (`energy_kwh` the facility's, PUE included; `gpu_energy_kwh`
    the boards'), CO2e in kg."""

    run_id: str
    local: bool
    segments: tuple[SegmentCost, ...]
    compute_usd: float
    controller_usd: float
    storage_usd: float
    total_usd: float
    """Compute, controller, transfer, storage and requests together."""
    span_h: float
    """From the first segment's start to the last one's end (or last update)."""
    node_hours: float
    steps: int
    """The furthest step the run reached."""
    epochs: float | None
    energy: RunEnergy
    """Summed over the segments, each where it ran, with each region's share."""
    preemptions: int
    lost_s: float
    """Time the preemptions cost: restarts (process start to first step) plus steps redone."""
    lost_usd: float
    unpriced_segments: int
    assumptions: tuple[str, ...] = ()
    final_metrics: Mapping[str, float] = field(default_factory=dict)
    data: DataBill = field(default_factory=DataBill)
    """Transfer, storage and requests with how each was known (`skygreen.ledger.data_bill`)."""

    @property
    def transfer_usd(self) -> float:
        """Moving checkpoints between the VMs and the buckets (measured bytes x list rates)."""
        return self.data.transfer_usd

    @property
    def requests_usd(self) -> float:
        """The bucket's write and read requests (estimated)."""
        return self.data.requests_usd

    @property
    def parts(self) -> tuple[tuple[str, float, str], ...]:
        """(name, dollars, "measured" or "estimated") for each line of the bill, in bill order:
        compute (measured time), controller (estimated), transfer, storage, requests."""
        return (
            ("compute", self.compute_usd, MEASURED),
            ("controller", self.controller_usd, ESTIMATED if self.controller_usd or not self.local else MEASURED),
            ("transfer", self.transfer_usd, self.data.transfer_basis),
            ("storage", self.storage_usd, self.data.storage_basis),
            ("requests", self.requests_usd, self.data.requests_basis),
        )

    @property
    def energy_kwh(self) -> float | None:
        """Facility energy (boards x each segment's PUE); None where nothing was metered."""
        return self.energy.energy_kwh

    @property
    def gpu_energy_kwh(self) -> float | None:
        """The GPU boards' energy."""
        return self.energy.gpu_energy_kwh

    @property
    def co2e_kg(self) -> float | None:
        """CO2e at each segment's region's intensity."""
        return self.energy.co2e_kg

    @property
    def cost_per_step_usd(self) -> float | None:
        """Total dollars divided by the furthest step reached; None while that is step 0."""
        return self.total_usd / self.steps if self.steps else None

    @property
    def cost_per_epoch_usd(self) -> float | None:
        """Total dollars per epoch; None where the epoch size is unknown or no sample was seen."""
        return self.total_usd / self.epochs if self.epochs else None

    @property
    def completed(self) -> bool:
        """Training is done: the last segment ended `completed` or `early-stopped`, which the
        runtime and the trainer callbacks write once the final checkpoint is committed."""
        return bool(self.segments) and self.segments[-1].segment.end in (COMPLETED, EARLY_STOPPED)

    @property
    def clouds(self) -> dict[str, float]:
        """Node hours per cloud."""
        out: dict[str, float] = {}
        for sc in self.segments:
            out[sc.segment.place.cloud] = out.get(sc.segment.place.cloud, 0.0) + sc.segment.node_hours
        return out

    def to_json(self) -> dict:
        """The JSON behind `skygreen cost RUN --json`: the total, compute, controller, transfer,
        storage and requests dollars rounded to 6 decimals (the other figures as computed), which
        of them were measured (`measured`: part -> bool; `basis`: part -> "measured", "estimated"
        or "not counted"), the bytes moved, per-step and per-epoch costs, node hours per cloud,
        and one entry per segment."""
        return {
            "run_id": self.run_id,
            "local": self.local,
            "total_usd": round(self.total_usd, 6),
            "compute_usd": round(self.compute_usd, 6),
            "controller_usd": round(self.controller_usd, 6),
            "transfer_usd": round(self.transfer_usd, 6),
            "storage_usd": round(self.storage_usd, 6),
            "requests_usd": round(self.requests_usd, 6),
            "measured": {name: basis == MEASURED for name, _, basis in self.parts},
            "basis": {name: basis for name, _, basis in self.parts},
            "bytes_uploaded": self.data.uploaded_bytes,
            "bytes_downloaded": self.data.downloaded_bytes,
            "requests": {"writes": round(self.data.writes), "reads": round(self.data.reads)},
            "span_h": self.span_h,
            "node_hours": self.node_hours,
            "steps": self.steps,
            "epochs": self.epochs,
            "cost_per_step_usd": self.cost_per_step_usd,
            "cost_per_epoch_usd": self.cost_per_epoch_usd,
            "energy_kwh": self.energy_kwh,
            "gpu_energy_kwh": self.gpu_energy_kwh,
            "co2e_kg": self.co2e_kg,
            "energy_regions": self.energy.to_json()["regions"],
            "preemptions": self.preemptions,
            "completed": self.completed,
            "lost_s": self.lost_s,
            "lost_usd": self.lost_usd,
            "unpriced_segments": self.unpriced_segments,
            "clouds_node_hours": self.clouds,
            "final_metrics": dict(self.final_metrics),
            "assumptions": list(self.assumptions),
            "segments": [_segment_json(sc) for sc in self.segments],
        }


def _segment_json(sc: SegmentCost) -> dict:
    s = sc.segment
    return {
        "segment": s.segment,
        "key": s.key,
        "place": s.place.label,
        "cloud": s.place.cloud,
        "region": s.place.region,
        "zone": s.place.zone,
        "instance_type": s.place.instance_type,
        "spot": s.place.spot,
        "gpu": s.place.gpu,
        "gpu_count": s.place.gpu_count,
        "nodes": s.place.nodes,
        "started_at": s.started_at,
        "ended_at": s.last_at,
        "duration_s": s.duration_s,
        "end": s.end,
        "start_step": s.start_step,
        "step": s.step,
        "reached_step": s.reached_step,
        "steps_done": s.steps_done,
        "samples_per_s": s.samples_per_s,
        "price_usd_per_hour": sc.price_usd_per_hour,
        "price_source": sc.price_source,
        "cost_usd": sc.cost_usd,
        "bytes_uploaded": dict(s.bytes_uploaded),
        "bytes_downloaded": dict(s.bytes_downloaded),
        "checkpoint_bytes": s.checkpoint_bytes,
        "energy_kwh": sc.energy_kwh,
        "gpu_energy_kwh": sc.gpu_energy_kwh,
        "co2e_kg": sc.co2e_kg,
        "changeover": {
            "setup_s": s.setup_s,
            "restore_s": s.restore_s,
            "restore_bytes": s.restore_bytes,
            "restore_bytes_per_s": s.restore_bytes_per_s,
            "to_first_step_s": s.changeover_s,
            "redone_steps": s.redone_steps,
        },
    }


def segment_price(place: Place, lookup: PriceLookup | None) -> tuple[float | None, str]:
    """(price per node-hour, where it came from): local is free; the ledger's own price wins."""
    if place.cloud == "local":
        return 0.0, "local"
    if place.price_usd_per_hour is not None:
        return place.price_usd_per_hour, place.price_source or "ledger"
    found = lookup(place) if lookup else None
    return (found, "catalog") if found is not None else (None, "unknown")


def price_segment(segment: Segment, lookup: PriceLookup | None = None) -> SegmentCost:
    """Price one segment: `segment_price` per node-hour x its duration x nodes, 0 where no price
    is known. Its energy is `segment_energy`'s: at its own cloud's PUE and region's intensity."""
    place = segment.place
    price, source = segment_price(place, lookup)
    cost = 0.0 if price is None else price * segment.duration_s / 3600.0 * place.nodes
    return SegmentCost(
        segment=segment,
        price_usd_per_hour=price,
        price_source=source,
        cost_usd=cost,
        energy=segment_energy(place, segment.energy_j),
    )


def run_cost(
    run_id: str,
    segments: Sequence[Segment],
    *,
    lookup: PriceLookup | None = None,
    storage_bytes: int = 0,
    storage_scheme: str = "file",
    buckets: Mapping[str, BillPlace | None] | None = None,
    store: BillPlace | None = None,
    keep: int | None = None,
    managed: bool = True,
    cancelled: bool = False,
) -> RunCost:
    """Price a run's settled segments (`read_ledger` order). `managed`: a SkyPilot managed job
    (it pays a controller); `cancelled`: the user cancelled the run, so its last segment's
    SIGTERM was a cancel, not a preemption.

    The data lines (`data_bill`): `storage_bytes` are the checkpoints in the run's bucket now
    (0: unknown, the newest checkpoint x `keep` instead); `store` is that bucket's place (else
    its `storage_scheme`'s cloud's default region); `buckets` each counted bucket's place (else
    each at its URL's cloud's default region, None for a local directory: `default_buckets`)."""
    priced = [price_segment(s, lookup) for s in segments]
    if cancelled and priced and priced[-1].segment.end == PREEMPTED:
        from dataclasses import replace

        priced[-1] = replace(priced[-1], segment=replace(priced[-1].segment, end=CANCELLED))
    local = all(s.place.cloud == "local" for s in segments)
    span_s = (max(s.last_at for s in segments) - min(s.started_at for s in segments)) if segments else 0.0
    compute = sum(sc.cost_usd for sc in priced)
    controller = 0.0
    if segments and managed and not local:
        running = segments[-1].ended_at is None
        controller = (
            CONTROLLER_USD_PER_HOUR.get(segments[0].place.cloud, 0.0)
            * (span_s + (0.0 if running else CONTROLLER_AUTOSTOP_S))
            / 3600.0
        )
    if store is None and storage_scheme in SCHEME_CLOUD:
        cloud = SCHEME_CLOUD[storage_scheme]
        store = BillPlace(cloud=cloud, region=DEFAULT_REGION[cloud])
    data = data_bill(
        segments,
        buckets=default_buckets(segments) if buckets is None else buckets,
        store=store,
        stored_bytes=storage_bytes,
        keep=keep,
        span_s=span_s,
    )
    lost_s, lost_usd, preemptions = _preemption_loss(priced)
    last = max(segments, key=lambda s: s.step) if segments else None
    epochs = None
    if last is not None and last.samples_per_epoch:
        epochs = last.samples / last.samples_per_epoch
    return RunCost(
        run_id=run_id,
        local=local,
        segments=tuple(priced),
        compute_usd=compute,
        controller_usd=controller,
        storage_usd=data.storage_usd,
        total_usd=compute + controller + data.total_usd,
        span_h=span_s / 3600.0,
        node_hours=sum(s.node_hours for s in segments),
        steps=last.step if last else 0,
        epochs=epochs,
        energy=run_energy(sc.energy for sc in priced),
        preemptions=preemptions,
        lost_s=lost_s,
        lost_usd=lost_usd,
        unpriced_segments=sum(1 for sc in priced if sc.price_usd_per_hour is None),
        assumptions=assumptions(
            managed=managed and not local, storage_scheme=storage_scheme, storage_bytes=storage_bytes, data=data
        ),
        final_metrics=final_metrics(segments),
        data=data,
    )


def default_buckets(
    segments: Sequence[Segment], *, region: str | Mapping[str, str | None] | None = None
) -> dict[str, BillPlace | None]:
    """Each bucket the segments counted bytes for, in `region` (the task's `checkpoint.region`;
    for a bucket set, bucket -> the region its key names) or else at its URL's cloud's default
    region (None for a local directory): where nothing better is known (the runtime's budget)."""
    keys = {k for s in segments for k in (*s.bytes_uploaded, *s.bytes_downloaded)}
    out: dict[str, BillPlace | None] = {}
    for key in sorted(keys):
        stated = region.get(key) if isinstance(region, Mapping) else region
        found = bucket_place(key, stated_region=stated)
        out[key] = found.place if found is not None else None
    return out


def _preemption_loss(priced: Sequence[SegmentCost]) -> tuple[float, float, int]:
    """Each segment that ended preempted (or was killed) and was followed by another costs the
    next one's restart (process start to its first step) plus the steps it had to redo."""
    lost_s = lost_usd = 0.0
    count = 0
    for prev, nxt in itertools.pairwise(priced):
        if prev.segment.end not in (PREEMPTED, KILLED, BUDGET):
            continue
        count += prev.segment.end != BUDGET
        s = nxt.segment
        restart_s = s.startup_s
        reached = max(prev.segment.step, prev.segment.reached_step or 0)  # the heartbeat's, past the checkpoint
        redo = max(0, reached - s.start_step)
        rate = prev.segment.steps_per_s
        seg_lost = restart_s + (redo / rate if rate else 0.0)
        lost_s += seg_lost
        lost_usd += (nxt.price_usd_per_hour or 0.0) * seg_lost / 3600.0 * s.place.nodes
    return lost_s, lost_usd, count


def final_metrics(segments: Sequence[Segment]) -> dict[str, float]:
    """Each metric's last reported value across the run."""
    out: dict[str, tuple[float, float]] = {}
    for s in segments:
        for name, points in s.metrics.items():
            for _step, at, value in points:
                if name not in out or at >= out[name][0]:
                    out[name] = (at, value)
    return {name: value for name, (_, value) in out.items()}


def first_metrics(segments: Sequence[Segment]) -> dict[str, float]:
    """Each metric's first reported value across the run, by report time."""
    out: dict[str, tuple[float, float]] = {}
    for s in segments:
        for name, points in s.metrics.items():
            for _step, at, value in points:
                if name not in out or at < out[name][0]:
                    out[name] = (at, value)
    return {name: value for name, (_, value) in out.items()}


def assumptions(
    *, managed: bool, storage_scheme: str, storage_bytes: int, data: DataBill | None = None
) -> tuple[str, ...]:
    """The lines printed with every cost saying what it counts and leaves out: compute, the
    controller (only when `managed`), transfer, storage, requests, and energy."""
    lines = [
        (
            "compute: catalog price of each segment's offer x the VM's time x nodes (from its first "
            "setup line on a cloud, from the process start locally; provisioning before setup is not "
            "seen; a VM killed without warning counts until its last ledger heartbeat, every 30 s)"
        ),
    ]
    if managed:
        lines.append(
            "controller: SkyPilot's managed-jobs controller (4 vCPU, 16 GiB, on-demand list price) serving this run alone, "
            f"for the run's span plus its {CONTROLLER_AUTOSTOP_S / 60:g} min autostop (an upper bound: it is shared by all your managed jobs)"
        )
    data = data or DataBill()
    lines.append(
        f"transfer ({data.transfer_basis}): {data.uploaded_bytes / 1e9:.3f} GB sent to the buckets and "
        f"{data.downloaded_bytes / 1e9:.3f} GB received, counted at the store, x the list rate between each "
        "segment's region and the bucket's (free in one region; a local machine receives at the bucket's "
        "internet egress); the VMs' own internet traffic (datasets, images) is not counted"
    )
    price = (
        data.storage_usd_per_gb_month
        if data.storage_usd_per_gb_month
        else STORAGE_USD_PER_GB_MONTH.get(storage_scheme, 0.0)
    )
    kept = (
        f"{storage_bytes / 1e9:.3f} GB of checkpoints in the bucket now"
        if data.storage_basis == MEASURED
        else "the newest checkpoint x keep (the bucket's checkpoints were not read)"
    )
    lines.append(f"storage ({data.storage_basis}): {kept}, at ${price:g}/GB-month (standard class) for the run's span")
    lines.append(
        f"requests ({data.requests_basis}): about {data.writes:,.0f} writes and {data.reads:,.0f} reads, from "
        "the bytes counted (saves = uploaded bytes / checkpoint size, each in parts; a ledger write every "
        f"{LEDGER_WRITE_S:g} s; each restore in ranged reads)"
    )
    lines.extend(data.notes)
    lines.append(
        "energy: GPU boards as metered by the runtime (CPU-only runs meter nothing) x each segment's cloud's PUE; CO2e at each segment's region's grid intensity"
    )
    return tuple(lines)


def catalog_lookup(catalog) -> PriceLookup:
    """Prices from a `skygreen.catalog.Catalog` for segments the ledger holds no price for:
    the offer in the segment's cloud and region with its instance type (or GPU and count);
    spot unless the segment says on-demand. The region's cheapest zone stands for its zone."""

    def lookup(place: Place) -> float | None:
        for offer in catalog.offers:
            if offer.cloud != place.cloud or (place.region and offer.region != place.region):
                continue
            if place.instance_type and offer.instance_type != place.instance_type:
                continue
            if place.gpu and offer.accelerator != place.gpu:
                continue
            if place.gpu_count and offer.accelerator_count != place.gpu_count:
                continue
            price = offer.price_usd_per_hour(place.spot is not False)
            if price is not None:
                return price
        return None

    return lookup
