"""`skygreen simulate`: one job, one trace, one or all policies, side by side.

Composition for the command: read the trace (`skygreen.plan.replay.load_trace`), settle the gang
size and prices (flags, else the trace's own spot prices, else the catalog's prices for the
instance the trace probed), build the grid and run each policy, the all-on-demand baseline and
the optimum. Every user mistake is an `InputError` naming the flag, the value and the fix.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from skygreen.deadline.policy import POLICIES, Job
from skygreen.deadline.simulate import Grid, Outcome, Prices, make_grid, make_multizone_grid, on_demand_only, simulate
from skygreen.errors import InputError, SpecError, did_you_mean
from skygreen.plan.replay import SpotTrace, load_trace, trace_zones

POLICY_NAMES: tuple[str, ...] = ("on_demand", *POLICIES, "optimum")
CHOICES: tuple[str, ...] = (*POLICY_NAMES, "all")


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulationRequest:
    """What `skygreen simulate` is asked, as typed: the CLI builds one from its flags and
    `run` reads it. Durations stay as written (`48h`, `90m`, or hours) and are read when the
    record is made; a bad one, an unknown policy or a gang under one node is a `SpecError`
    naming the flag."""

    trace: Path
    hours: str
    """`--hours`: the compute the job needs."""
    deadline: str
    changeover: str
    """`--changeover`: what one switch costs (provisioning, setup, lost work)."""
    policy: str = "all"
    nodes: int | None = None
    """The gang size; None: the trace's own."""
    zone: str | None = None
    spot_price: float | None = None
    on_demand_price: float | None = None
    start: str = "0"
    """How far into the trace the job starts."""
    catalog_dir: Path | None = None
    compute_h: float = field(init=False, default=0.0)
    deadline_h: float = field(init=False, default=0.0)
    changeover_h: float = field(init=False, default=0.0)
    start_h: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        from skygreen.errors import suggestion
        from skygreen.task.readers import read_duration_h

        if self.policy not in CHOICES:
            raise SpecError(
                "--policy",
                "unknown policy",
                value=self.policy,
                allowed=", ".join(CHOICES),
                hint=suggestion(self.policy, CHOICES) or "use --policy all to compare them",
            )
        if self.nodes is not None and self.nodes < 1:
            raise SpecError(
                "--nodes", "must be at least 1", value=self.nodes, hint="e.g. --nodes 16 for a 16-node gang"
            )
        start_h = 0.0 if self.start.strip() in ("0", "0h") else read_duration_h(self.start, "--start")
        for name, value in (
            ("compute_h", read_duration_h(self.hours, "--hours")),
            ("deadline_h", read_duration_h(self.deadline, "--deadline")),
            ("changeover_h", read_duration_h(self.changeover, "--changeover")),
            ("start_h", start_h),
        ):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "trace", Path(self.trace))


@dataclass(frozen=True, kw_only=True, slots=True)
class Simulation:
    """What `skygreen simulate` ran and found: the trace and its zones, the gang size, the prices and
    where they came from, the grid, the job and the start, and one outcome per policy asked for.
    """

    trace: SpotTrace
    """The (first) zone's trace."""
    zones: tuple[str, ...]
    """More than one: the job may move between these zones (`--zone a,b` or `all`)."""
    nodes: int
    prices: Prices
    price_source: str
    grid: Grid
    job: Job
    """As asked; `grid.job` is the same rounded to the decision grid."""
    start_h: float
    outcomes: tuple[Outcome, ...]

    @property
    def spot_fraction(self) -> float:
        """The share of the grid's intervals before the deadline in which spot is available (in any zone
        when there are several); 0.0 when the deadline is shorter than one interval.
        """
        window = self.grid.available[: self.grid.deadline_steps]
        return sum(window) / len(window) if window else 0.0


def run(request: SimulationRequest) -> Simulation:
    """Replay `request.trace` from `request.start_h` hours in, for `request.policy` (one of `CHOICES`;
    `all` runs every one, the on-demand baseline and the optimum included). Durations in hours.

    The gang is `nodes`, else the trace's own node count (1 when it has none). Prices, in USD per
    node-hour, are the flags', else the trace's mean spot price, else the catalog's offer for the
    instance the trace probed. Raises `InputError` (a `SpecError` naming the flag where there is
    one) for a missing or unreadable trace, a missing or unknown zone, more nodes than the trace
    ever shows, a price nobody knows or a negative one, a start outside the trace, and a deadline
    shorter than the compute plus one changeover.
    """
    trace_path, zone, nodes, policy = request.trace, request.zone, request.nodes, request.policy
    compute_h, deadline_h, changeover_h, start_h = (
        request.compute_h, request.deadline_h, request.changeover_h, request.start_h
    )  # fmt: skip
    traces = _read_traces(trace_path, zone)
    trace = traces[0]
    gang = min(_gang(t, nodes) for t in traces)
    prices, source = _prices(trace, gang, request.spot_price, request.on_demand_price, request.catalog_dir)
    if start_h < 0 or start_h >= trace.span_h:
        raise SpecError(
            "--start",
            f"must be within the trace (0 to {trace.span_h:.1f} h)",
            value=start_h,
            hint="start earlier, e.g. --start 0",
        )
    if deadline_h < compute_h + changeover_h:
        raise SpecError(
            "--deadline",
            f"is shorter than the compute plus one changeover ({compute_h + changeover_h:g} h): no policy can meet it",
            value=f"{deadline_h:g}h",
            hint=f"give at least --deadline {compute_h + changeover_h:g}h (and {compute_h + 2 * changeover_h:g}h "
            "or more for spot to be worth trying)",
        )
    job = Job(compute_h=compute_h, deadline_h=deadline_h, changeover_h=changeover_h)
    start_tick = int(start_h * 3600 / trace.gap_s)
    if len(traces) > 1:
        series = [t.available(gang) for t in traces]
        grid = make_multizone_grid(job, series, tick_s=trace.gap_s, start_tick=start_tick)
    else:
        grid = make_grid(job, trace.available(gang), tick_s=trace.gap_s, start_tick=start_tick)
    names = POLICY_NAMES if policy == "all" else (policy,)
    return Simulation(
        trace=trace,
        zones=tuple(t.zone or "" for t in traces),
        nodes=gang,
        prices=prices,
        price_source=source,
        grid=grid,
        job=job,
        start_h=start_h,
        outcomes=tuple(_run_one(name, grid, prices) for name in names),
    )


def _run_one(name: str, grid: Grid, prices: Prices) -> Outcome:
    if name == "on_demand":
        return on_demand_only(grid, prices)
    if name == "optimum":
        from skygreen.deadline.optimum import optimum  # numpy: only when asked for

        return optimum(grid, prices)
    kind = POLICIES[name]
    policy = kind(price_ratio=_ratio(prices)) if name == "skygreen" else kind()
    return simulate(policy, grid, prices)


def _ratio(prices: Prices) -> float:
    spot = prices.spot_usd_per_node_hour
    return prices.on_demand_usd_per_node_hour / spot if spot > 0 else math.inf


def _read_traces(path: Path, zone: str | None) -> list[SpotTrace]:
    """One trace, or several zones of a capacity CSV (`--zone a,b` or `--zone all`)."""
    zones = trace_zones(path) if path.is_file() else ()
    if zones and zone is not None and (zone == "all" or "," in zone):
        wanted = zones if zone == "all" else tuple(z.strip() for z in zone.split(",") if z.strip())
        return [_read_trace(path, z) for z in wanted]
    return [_read_trace(path, zone)]


def _read_trace(path: Path, zone: str | None) -> SpotTrace:
    if not path.is_file():
        raise InputError(
            f"TRACE: no such file: {path}\n  fix: name a spot-traces .json or a capacity .csv, "
            "e.g. ../shared/spot-traces/availability/1-node/aws-02-15-2023/us-west-2b_v100_1.json"
        )
    zones = trace_zones(path)
    if zones and zone is None:
        raise SpecError(
            "--zone",
            f"{path.name} holds {len(zones)} zones: name one",
            allowed=", ".join(zones),
            hint=f"e.g. --zone {zones[0]}",
        )
    if zones and zone not in zones:
        near = did_you_mean(zone or "", zones)
        raise SpecError(
            "--zone",
            "not a zone of this trace",
            value=zone,
            allowed=", ".join(zones),
            hint=f"did you mean {near!r}?" if near else "pick one of the allowed zones",
        )
    try:
        return load_trace(path, zone=zone)
    except ValueError as e:
        raise InputError(f"TRACE: {e}\n  fix: name a spot-traces .json or a capacity .csv") from None


def _gang(trace: SpotTrace, nodes: int | None) -> int:
    gang = nodes if nodes is not None else (trace.nodes or 1)
    most = max(trace.counts)
    if gang > most:
        raise SpecError(
            "--nodes",
            f"this trace never shows more than {most} spot instance(s) at once",
            value=gang,
            hint=f"use --nodes {most} or less, or a trace of a larger gang (availability/16-node/...)",
        )
    return gang


def _prices(
    trace: SpotTrace, nodes: int, spot: float | None, on_demand: float | None, catalog_dir: Path | None
) -> tuple[Prices, str]:
    sources = []
    if spot is None and trace.spot_prices_usd_per_hour:
        spot = statistics.fmean(trace.spot_prices_usd_per_hour)
        sources.append("spot: the trace's mean price")
    if spot is None or on_demand is None:
        offer_spot, offer_od, where = _catalog_prices(trace, catalog_dir)
        kinds = [k for k, missing in (("spot", spot is None), ("on-demand", on_demand is None)) if missing]
        spot = offer_spot if spot is None else spot
        on_demand = offer_od if on_demand is None else on_demand
        if where:
            sources.append(f"{' and '.join(kinds)}: {where}")
    if spot is None or on_demand is None:
        missing = "--spot-price" if spot is None else "--on-demand-price"
        probed = trace.instance_type or "the instance this trace probed"
        raise SpecError(
            missing,
            f"no price known for {probed} in {trace.region or 'this zone'}",
            hint="give both prices per node-hour, e.g. --spot-price 0.918 --on-demand-price 3.06",
        )
    for flag, value in (("--spot-price", spot), ("--on-demand-price", on_demand)):
        if not (math.isfinite(value) and value >= 0):
            raise SpecError(flag, "must be a price per node-hour >= 0", value=value, hint="e.g. 0.918")
    prices = Prices(spot_usd_per_node_hour=spot, on_demand_usd_per_node_hour=on_demand, nodes=nodes)
    return prices, "; ".join(sources) or "given"


def _catalog_prices(trace: SpotTrace, catalog_dir: Path | None) -> tuple[float | None, float | None, str]:
    if trace.instance_type is None or trace.cloud is None:
        return None, None, ""
    from skygreen.plan.catalog import load_catalog

    catalog = load_catalog(catalog_dir, clouds=(trace.cloud,))
    offers = [o for o in catalog.offers if o.instance_type == trace.instance_type]
    here = [o for o in offers if o.region == trace.region] or offers
    if not here:
        return None, None, ""
    offer = min(here, key=lambda o: o.on_demand_price_usd_per_hour or math.inf)
    where = f"catalog {offer.cloud} {offer.region} {offer.instance_type}"
    return offer.spot_price_usd_per_hour, offer.on_demand_price_usd_per_hour, where
