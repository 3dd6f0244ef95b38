"""A run's journey between places: where it is, the move under way, and every move it made.

The nomad watcher (`skygreen.places.watcher`) keeps the journey in the run's folder
(`<run dir>/journey.json`) and writes each move into the run's ledger in its bucket
(`<bucket>/<run>/ledger/moves/<n>.json`, beside the segments, which readers of the ledger skip),
so whoever reads the bucket sees where the run went and what each move cost.

A move is measured once the new life's first step is in the ledger: the bytes it restored, the
changeover from the cancel (or, after a preemption, the relaunch) to that first step, and the
dollars: the whole bill's transfer rate for those bytes between the two regions
(`skygreen.places.rates.bill_egress_usd`), plus the changeover billed at the new place's price.
Until then its measured fields are None. Pure records, with their JSON and the run-folder file;
no numpy at import, as `skygreen status` reads the journey.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skygreen.files import write_atomic
from skygreen.ledger.changeover import changeover_of

if TYPE_CHECKING:
    from skygreen.places.place import Place

JOURNEY_FILE = "journey.json"
MOVES_PREFIX = "ledger/moves/"


@dataclass(frozen=True, kw_only=True, slots=True)
class PlaceSeen:
    """What the run has seen of one place: its lifetimes there, learned from its own launches."""

    run_h: float = 0.0
    """Hours the run ran on spot there."""
    preemptions: int = 0
    failed_at_s: float | None = None
    """The last time a spot launch there found no capacity (clock seconds)."""

    def to_json(self) -> dict[str, Any]:
        """The watcher's memory of the place."""
        return {"run_h": self.run_h, "preemptions": self.preemptions, "failed_at_s": self.failed_at_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlaceSeen:
        """Back from `to_json`."""
        failed = data.get("failed_at_s")
        return cls(
            run_h=float(data.get("run_h") or 0.0),
            preemptions=int(data.get("preemptions") or 0),
            failed_at_s=None if failed is None else float(failed),
        )


def place_json(place: Place) -> dict[str, Any]:
    """A place as the journey keeps it."""
    return {"cloud": place.cloud, "region": place.region, "zone": place.zone, "name": place.name}


def place_of(data: Mapping[str, Any] | None) -> Place | None:
    """Back from `place_json`; None for none."""
    if not data:
        return None
    from skygreen.places.place import Place  # numpy comes with it: only where a place is used

    return Place(cloud=str(data["cloud"]), region=str(data["region"]), zone=data.get("zone"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Move:
    """One move of a run from one place to another, decided and then measured."""

    number: int
    """1-based, in the order the run made its moves."""
    launch: int
    """The run's launch number of the relaunch at the new place (its writer lease)."""
    job_id: str | None
    src: Mapping[str, Any]
    dst: Mapping[str, Any]
    mode: str
    """`spot` or `on_demand` at the new place."""
    reason: str
    scores_usd_per_hour: Mapping[str, float | None] = field(default_factory=dict)
    decided_at_h: float = 0.0
    """Hours from the run's start (the watcher's clock) when the relaunch was made."""
    stopped_at: float = 0.0
    """Wall clock (Unix seconds) when the old life was cancelled, or, after a preemption, the relaunch."""
    launched_at: float = 0.0
    """Wall clock of the relaunch."""
    price_usd_per_hour: float | None = None
    """The new place's price of the chosen capacity when the move was made."""
    restore_bytes: int | None = None
    changeover_s: float | None = None
    """From `stopped_at` to the new life's first step; None until it is in the ledger."""
    setup_s: float | None = None
    restore_s: float | None = None
    egress_usd: float | None = None
    changeover_usd: float | None = None

    @property
    def measured(self) -> bool:
        """The new life's first step is in and the move is priced."""
        return self.changeover_s is not None

    @property
    def usd(self) -> float | None:
        """What the move cost: egress and the changeover; None until measured."""
        if self.egress_usd is None or self.changeover_usd is None:
            return None
        return self.egress_usd + self.changeover_usd

    def to_json(self) -> dict[str, Any]:
        """The move's object in the ledger and in the journey file."""
        return {**asdict(self), "src": dict(self.src), "dst": dict(self.dst), "usd": self.usd}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Move:
        """Back from `to_json`; unknown keys are ignored."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


def measure(move: Move, segments: Sequence[Any]) -> Move:
    """The move with its measured figures, from the first segment the new life wrote (started at
    or after the relaunch) once it has a first step; unchanged before that."""
    if move.measured:
        return move
    lives = sorted((s for s in segments if s.started_at >= move.launched_at - 1.0), key=lambda s: s.started_at)
    if not lives or lives[0].first_step_at is None:
        return move
    seg = lives[0]
    c = changeover_of(seg)
    changeover_s = max(seg.first_step_at - move.stopped_at, 0.0)
    restored = c.restore_bytes or 0
    src, dst = place_of(move.src), place_of(move.dst)
    from skygreen.places.rates import bill_egress_usd

    egress = bill_egress_usd(src, dst, restored / 1e9) if src is not None and dst is not None else 0.0
    price = move.price_usd_per_hour or 0.0
    return replace(
        move,
        restore_bytes=restored,
        changeover_s=changeover_s,
        setup_s=c.setup_s,
        restore_s=c.restore_s,
        egress_usd=egress,
        changeover_usd=price * changeover_s / 3600.0,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Journey:
    """The nomad watcher's memory of one run's places."""

    place: Mapping[str, Any] | None = None
    """Where the run's latest life is (or was), as `place_json`; None before it is known."""
    mode: str | None = None
    """The capacity of that life (`spot`, `on_demand`)."""
    target: Mapping[str, Any] | None = None
    """A move under way: the place the watcher cancelled the run to go to, until the relaunch."""
    target_mode: str | None = None
    target_reason: str | None = None
    target_scores: Mapping[str, float | None] | None = None
    stopped_at: float | None = None
    """Wall clock of that cancel."""
    seen: Mapping[str, PlaceSeen] = field(default_factory=dict)
    """Per place name: what the run has seen there."""
    latched: bool = False
    """The safety net fired: on-demand to the end."""
    preempted_job: str | None = None
    """The job whose preemption is already counted."""
    last_poll_s: float | None = None
    moves: tuple[Move, ...] = ()

    def seen_at(self, name: str) -> PlaceSeen:
        """The history of one place (empty when the run never went or looked there)."""
        return self.seen.get(name) or PlaceSeen()

    def to_json(self) -> dict[str, Any]:
        """The `journey.json` object."""
        return {
            "place": self.place,
            "mode": self.mode,
            "target": self.target,
            "target_mode": self.target_mode,
            "target_reason": self.target_reason,
            "target_scores": dict(self.target_scores) if self.target_scores is not None else None,
            "stopped_at": self.stopped_at,
            "seen": {name: s.to_json() for name, s in self.seen.items()},
            "latched": self.latched,
            "preempted_job": self.preempted_job,
            "last_poll_s": self.last_poll_s,
            "moves": [m.to_json() for m in self.moves],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Journey:
        """Back from `to_json`."""
        return cls(
            place=data.get("place"),
            mode=data.get("mode"),
            target=data.get("target"),
            target_mode=data.get("target_mode"),
            target_reason=data.get("target_reason"),
            target_scores=data.get("target_scores"),
            stopped_at=data.get("stopped_at"),
            seen={str(k): PlaceSeen.from_json(v) for k, v in (data.get("seen") or {}).items()},
            latched=bool(data.get("latched")),
            preempted_job=data.get("preempted_job"),
            last_poll_s=data.get("last_poll_s"),
            moves=tuple(Move.from_json(m) for m in data.get("moves") or ()),
        )


def load_journey(run_dir: Path) -> Journey | None:
    """The run's journey; None for a run the nomad never watched (or an unreadable file)."""
    try:
        return Journey.from_json(json.loads((run_dir / JOURNEY_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def save_journey(run_dir: Path, journey: Journey) -> None:
    """Write it atomically."""
    write_atomic(run_dir / JOURNEY_FILE, json.dumps(journey.to_json(), indent=1) + "\n")


def move_key(move: Move) -> str:
    """The move's object key under the run's folder in the bucket."""
    return f"{MOVES_PREFIX}{move.number:04d}.json"


def plan_offers(spec_snapshot: Mapping[str, Any], plan_summary: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The plan's offers a nomad moves a cloud run between: those in the regions the task names
    (`skygreen.regions`), when it names two or more and they fall in two or more; else none (one
    place: the single-place policy)."""
    regions = (spec_snapshot.get("skygreen") or {}).get("regions") or ()
    if len(regions) < 2:
        return []
    offers = [o for o in (plan_summary or {}).get("offers") or () if o.get("region") in regions]
    return offers if len({(o.get("cloud"), o.get("region")) for o in offers}) >= 2 else []


def journey_view(run_dir: Path) -> dict[str, Any] | None:
    """`place` and `moves` for `skygreen status --json`'s deadline object; None without a journey."""
    journey = load_journey(run_dir)
    if journey is None:
        return None
    return {
        "place": dict(journey.place) if journey.place else None,
        "place_mode": journey.mode,
        "moving_to": dict(journey.target) if journey.target else None,
        "moves": [m.to_json() for m in journey.moves],
    }
