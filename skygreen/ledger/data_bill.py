"""What a run's checkpoints cost beside compute, from its ledger: transfer, storage and requests.

    transfer = sum over (sender, receiver) of `bill.rates.transfer_usd` on the run's bytes between
               them: each segment's VM sends `bytes_uploaded[bucket]` to the bucket and receives
               `bytes_downloaded[bucket]` from it, both counted at the store (measured)
    storage  = the checkpoints in the bucket now (measured), else the newest checkpoint's size
               x `keep` (estimated), x the bucket's $/GB-month x the run's span
    requests = writes and reads x the bucket's request prices, estimated: the store counts
               bytes, not calls, so each segment's saves are its uploaded bytes / the checkpoint's
               size, each save `parts` + `SAVE_OVERHEAD_WRITES` writes, each ledger heartbeat one
               write, each restore `parts` + `RESTORE_OVERHEAD_READS` reads (`bill.traffic`)

Where: a segment on a cloud is in its region (its cloud's default region when the ledger has
none); a local segment or one off the three clouds is on the internet, which receives for free
and pays the bucket's internet egress on what it downloads. A bucket is where `buckets` says
(`skygreen.bill.bucket.bucket_place`: read, stated or assumed); a local directory costs nothing.

Pure: segments, bucket places and sizes are passed in; the rates are `skygreen.bill`'s table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from skygreen.bill.rates import (
    CLOUDS,
    DEFAULT_REGION,
    Place,
    Rates,
    internet_egress_usd,
    load_rates,
    requests_usd,
    storage_usd,
)
from skygreen.bill.rates import transfer_usd as rate_transfer_usd
from skygreen.bill.traffic import (
    HOURS_PER_MONTH,
    READ_PART_BYTES,
    RESTORE_OVERHEAD_READS,
    SAVE_OVERHEAD_WRITES,
    UPLOAD_PART_BYTES,
    parts,
)
from skygreen.ledger.records import Segment

LEDGER_WRITE_S = 30.0
"""A segment rewrites its ledger object about this often (the runtime's heartbeat): one write each."""

MEASURED = "measured"
ESTIMATED = "estimated"
UNKNOWN = "not counted"
"""Transfer in a ledger written before skygreen counted bytes: shown as $0, said so."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DataBill:
    """The run's data dollars by kind, and how each was known ("measured" or "estimated")."""

    transfer_usd: float = 0.0
    storage_usd: float = 0.0
    requests_usd: float = 0.0
    transfer_basis: str = MEASURED
    storage_basis: str = MEASURED
    requests_basis: str = ESTIMATED
    uploaded_bytes: int = 0
    downloaded_bytes: int = 0
    writes: float = 0.0
    reads: float = 0.0
    storage_usd_per_gb_month: float = 0.0
    """The run's bucket's storage price (0 for a local directory)."""
    notes: tuple[str, ...] = ()
    """What the figures assumed: a region taken as the default, segments that counted no bytes."""

    @property
    def total_usd(self) -> float:
        """Transfer, storage and requests together."""
        return self.transfer_usd + self.storage_usd + self.requests_usd


def vm_place(segment: Segment) -> Place | None:
    """Where a segment's VM is, for the rate table; None off the three clouds (local: the internet)."""
    cloud = segment.place.cloud
    if cloud not in CLOUDS:
        return None
    return Place(cloud=cloud, region=segment.place.region or DEFAULT_REGION[cloud])


def transfer_usd(src: Place | None, dst: Place | None, gb: float, rates: Rates) -> float:
    """`bill.rates.transfer_usd`, with None for the internet (a local machine): sending from it
    is free to the cloud, sending to it pays the sender's internet egress."""
    if gb <= 0 or src is None:
        return 0.0
    if dst is None:
        return internet_egress_usd(src.cloud, gb, rates)
    return rate_transfer_usd(src, dst, gb, rates)


def _requests(segment: Segment, bucket: str, cloud: str, checkpoint_bytes: int | None) -> tuple[float, float]:
    """(writes, reads) one segment made against `bucket`, estimated from its bytes (module docstring)."""
    size_gb = (checkpoint_bytes or 0) / 1e9
    saves = segment.bytes_uploaded.get(bucket, 0) // checkpoint_bytes if checkpoint_bytes else 0
    writes = float(saves * (parts(size_gb, UPLOAD_PART_BYTES[cloud]) + SAVE_OVERHEAD_WRITES))
    writes += segment.duration_s / LEDGER_WRITE_S
    reads = 0.0
    if segment.restore_bytes:
        reads = float(parts(segment.restore_bytes / 1e9, READ_PART_BYTES) + RESTORE_OVERHEAD_READS)
    return writes, reads


def data_bill(
    segments: Sequence[Segment],
    *,
    buckets: Mapping[str, Place | None],
    store: Place | None = None,
    stored_bytes: int = 0,
    keep: int | None = None,
    span_s: float,
    rates: Rates | None = None,
) -> DataBill:
    """The run's transfer, storage and requests dollars (module docstring).

    Args:
        segments: the run's settled segments.
        buckets: bucket key (`s3://BUCKET`, as the ledger keys its bytes) -> its place; None for
            a local directory. A bucket the segments name but this does not is taken as free.
        store: the place of the bucket holding the run's checkpoints (storage is priced there);
            None: a local directory.
        stored_bytes: bytes of the checkpoints in that bucket now; 0: unknown, estimated instead.
        keep: checkpoints kept (`checkpoint.keep`), for the estimate; None: 1.
        span_s: the run's span, first start to last end.
    """
    rates = rates or load_rates()
    notes: list[str] = []
    volume: dict[tuple[Place | None, Place | None], float] = {}
    up = down = 0
    writes = reads = requests = 0.0
    newest = next((s.checkpoint_bytes for s in reversed(segments) if s.checkpoint_bytes), None)
    uncounted = 0
    defaulted = sorted({s.place.cloud for s in segments if s.place.cloud in CLOUDS and not s.place.region})
    cloud_buckets = [b for b, place in buckets.items() if place is not None]
    for seg in segments:
        vm = vm_place(seg)
        if cloud_buckets and not seg.bytes_uploaded and not seg.bytes_downloaded:
            uncounted += 1
        for bucket, place in buckets.items():
            if place is None or (bucket not in seg.bytes_uploaded and bucket not in seg.bytes_downloaded):
                continue  # a segment that counted nothing gives the request estimate no basis
            sent, received = seg.bytes_uploaded.get(bucket, 0), seg.bytes_downloaded.get(bucket, 0)
            up, down = up + sent, down + received
            volume[(vm, place)] = volume.get((vm, place), 0.0) + sent / 1e9
            volume[(place, vm)] = volume.get((place, vm), 0.0) + received / 1e9
            w, r = _requests(seg, bucket, place.cloud, seg.checkpoint_bytes or newest)
            writes, reads = writes + w, reads + r
            requests += requests_usd(place.cloud, writes=w, reads=r, rates=rates)
    transfer = sum(transfer_usd(src, dst, gb, rates) for (src, dst), gb in volume.items())
    storage, storage_basis = 0.0, MEASURED
    if store is not None:
        kept_bytes = stored_bytes
        if not kept_bytes and newest:
            kept_bytes, storage_basis = newest * max(1, keep or 1), ESTIMATED
        storage = storage_usd(store.cloud, kept_bytes / 1e9 * span_s / 3600.0 / HOURS_PER_MONTH, rates)
    if defaulted:
        notes.append(f"segments on {', '.join(defaulted)} with no region in the ledger priced from its default region")
    if uncounted:
        notes.append(f"{uncounted} segment(s) counted no bytes (ledgers written before skygreen counted them)")
    return DataBill(
        transfer_usd=transfer,
        storage_usd=storage,
        requests_usd=requests,
        transfer_basis=UNKNOWN if segments and uncounted == len(segments) else MEASURED,
        storage_basis=storage_basis,
        storage_usd_per_gb_month=rates.storage_usd_per_gb_month[store.cloud] if store is not None else 0.0,
        uploaded_bytes=up,
        downloaded_bytes=down,
        writes=writes,
        reads=reads,
        notes=tuple(notes),
    )
