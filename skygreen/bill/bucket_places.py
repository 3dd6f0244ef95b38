"""Where each bucket of a set is (`checkpoint.buckets:`), and what a run pays with one bucket per place.

Each offer is priced against the bucket nearest it (`skygreen.checkpoint.bucket_set.nearest`: its
region's, else its cloud's, else the home bucket), plus one copy of the checkpoint per expected
move. Where a recovery lands follows SkyPilot: `skygreen up` gives it the plan's top offers as
an `ordered` list, the pick first and then, from all the plan's offers, the places its own bucket
is nearest to (`skygreen.checkpoint.bucket_set.bucket_first`), and `EAGER_NEXT_REGION` relaunches with the
preempted cloud and region blocked, so the job goes to the first place of the list outside them:

    landing    = first place outside the offer's (cloud, region), the offer's bucket's places first
    copies_gb  = expected preemptions x save_gb            (when landing's nearest bucket is another)
    copies_usd = transfer(offer's bucket -> landing, copies_gb)

The restore there reads the checkpoint from this offer's bucket, and the runtime copies it once
into the near one. The move back, when the landing place is preempted in turn, is that place's
own copy, priced there, so each expected preemption is counted once. `FAILOVER` retries the same
region first, so it moves nothing; so does a set whose landing place shares the offer's bucket
(as one bucket moves nothing). The copy's upload into the near bucket stays inside its place
(free) and its few requests are not counted.

A member's region is, as for one bucket (`skygreen.bill.bucket.bucket_place`), the one its
bucket reports where it could be read, else its key where the key is a region, else its cloud's
default (said in a note). A key region that the bucket contradicts is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from skygreen.bill.bucket import BucketPlace, bucket_place, normalise_region
from skygreen.bill.rates import DEFAULT_REGION, Place, Rates, load_rates, transfer_usd
from skygreen.checkpoint.bucket_set import Member, bucket_first, is_set_url, members, nearest
from skygreen.errors import SpecError


@dataclass(frozen=True, kw_only=True, slots=True)
class SetPlaces:
    """The buckets of a set with their places, in the set's order (the first is home)."""

    buckets: tuple[tuple[Member, BucketPlace], ...]

    @property
    def home(self) -> BucketPlace:
        """The home bucket's place (the first listed): where the writer lease lives."""
        return self.buckets[0][1]

    @property
    def note(self) -> str:
        """The plan's note when some member's region is assumed; "" otherwise."""
        assumed = [f"{m.key} ({p.place.region})" for m, p in self.buckets if p.how == "assumed"]
        if not assumed:
            return ""
        return (
            f"checkpoint buckets whose region is unknown, assumed their cloud's default: {', '.join(assumed)}; "
            "key each by its region in skygreen.checkpoint.buckets to price transfers from where it is"
        )

    def nearest(self, vm: Place) -> tuple[Member, BucketPlace]:
        """The member an offer in `vm` commits to, with its place."""
        member = nearest([m for m, _ in self.buckets], cloud=vm.cloud, region=vm.region)
        return next(pair for pair in self.buckets if pair[0] == member)


def set_places(url: str, read_regions: Mapping[str, str | None] | None = None) -> SetPlaces:
    """Each bucket of the set at `url` with its place.

    Args:
        url: the set's URL (`skygreen.checkpoint.bucket_set`).
        read_regions: member URL -> the region its bucket reports, where it could be read.

    Raises:
        SpecError: a bucket reports a region other than its key's, naming the key.
    """
    read_regions = read_regions or {}
    out = []
    for m in members(url):
        read = read_regions.get(m.url)
        if read is not None:
            read = normalise_region(m.cloud, read)
            if m.region is not None and read != m.region:
                raise SpecError(
                    f"skygreen.checkpoint.buckets.{m.key}",
                    f"keys the bucket {m.url} by {m.region}, but the bucket reports {read}",
                    value=m.key,
                    hint=f"key it {read} (or {m.cloud})",
                )
            out.append((m, BucketPlace(place=Place(cloud=m.cloud, region=read), how="read")))
        elif m.region is not None:
            out.append((m, BucketPlace(place=Place(cloud=m.cloud, region=m.region), how="stated")))
        else:
            out.append((m, BucketPlace(place=Place(cloud=m.cloud, region=DEFAULT_REGION[m.cloud]), how="assumed")))
    return SetPlaces(buckets=tuple(out))


def move_copies(
    places: SetPlaces,
    *,
    vm: Place,
    launches: Sequence[Place],
    save_gb: float,
    moves: float,
    limit: int | None = None,
    rates: Rates | None = None,
) -> tuple[float, float]:
    """(GB, dollars) the expected moves of an offer in `vm` copy out of its bucket (module
    docstring); (0, 0) when the recovery lands where the same bucket is nearest, or without moves.

    Args:
        places: the set's buckets with their places.
        vm: the offer's place.
        launches: the places of the offers the launch lists, in its order.
        save_gb: one checkpoint, all shards together.
        moves: the offer's expected preemptions (0 under `FAILOVER`).
        limit: the entries the launch keeps (`max_candidates`), counted after the reordering.
        rates: the rate table (the shipped one by default).
    """
    order = bucket_first(
        [m for m, _ in places.buckets], [vm, *(p for p in launches if p != vm)], lambda p: (p.cloud, p.region)
    )
    landing = recovery_landing(vm, order[:limit])
    if landing is None or moves <= 0 or save_gb <= 0:
        return 0.0, 0.0
    near, bucket = places.nearest(vm)
    if places.nearest(landing)[0] == near:
        return 0.0, 0.0
    copies_gb = moves * save_gb
    return copies_gb, transfer_usd(bucket.place, landing, copies_gb, rates or load_rates())


def recovery_landing(vm: Place, launches: Sequence[Place]) -> Place | None:
    """Where `EAGER_NEXT_REGION` relaunches a job preempted in `vm`: the first place of the
    launch list outside its cloud and region; None when the list has no other place."""
    return next((p for p in launches if (p.cloud, p.region) != (vm.cloud, vm.region)), None)


def plan_buckets(
    url: str | None,
    *,
    stated_region: str | None,
    read: str | Mapping[str, str | None] | None,
    source: str | None = None,
) -> tuple[BucketPlace | None, SetPlaces | None]:
    """The checkpoint bucket's place for the plan and, for a bucket set, every member's place
    (the place is then the home bucket's). `read` is what
    `skygreen.checkpoint.bucket_region.read_bucket_region` answered.

    Raises:
        SpecError: a region that contradicts its bucket.
    """
    if is_set_url(url):
        assert url is not None
        places = set_places(url, read if isinstance(read, Mapping) else None)
        return places.home, places
    one = read if isinstance(read, str) else None
    return bucket_place(url, stated_region=stated_region, read_region=one, source=source), None
