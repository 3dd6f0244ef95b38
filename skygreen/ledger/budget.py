"""Budgets on the VM: spend so far from the ledger, alerts as it grows, a clean stop at 100%.

Spend so far is `skygreen.ledger.pricing.run_cost` over the earlier segments (read from the
ledger when this VM started) plus this segment up to now, with the bytes its store counted so
far (`LedgerWriter.counted`): the same function `skygreen cost` and `status` use, so the runtime
stops at the figure the user will see, checkpoint transfer, storage and requests included as
they accrue. Prices come from the segment's own place (the plan's offer rendered into the job),
never from SkyPilot; the bucket is where the task's `checkpoint.region` says, else in its cloud's
default region (the VM does not read its location: `skygreen cost` does, so the two transfer
figures can differ where the bucket is elsewhere and the task does not say).

Alerts fire once each as spend crosses a fraction of the budget (default 50%, 80%, 100%),
and once per segment when the burn rate (dollars per hour on this VM, controller included)
exceeds `burn_usd_per_hour`. Each goes to the log and, when configured, as a small JSON POST
to a webhook (its URL read from an environment variable, so it never sits in a file).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from skygreen.ledger.pricing import CONTROLLER_USD_PER_HOUR, default_buckets, run_cost
from skygreen.ledger.records import Segment

log = logging.getLogger("skygreen.runtime")

DEFAULT_ALERT_FRACTIONS: tuple[float, ...] = (0.5, 0.8, 1.0)
WEBHOOK_TIMEOUT_S = 5.0


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetPolicy:
    """A run's budget settings: the cap in dollars (None: no cap), the fractions of it that alert,
    the dollars per hour above which the burn alert fires (None: no burn alert), and the webhook
    URL alerts are POSTed to (None: log only)."""

    budget_usd: float | None = None
    alert_fractions: tuple[float, ...] = DEFAULT_ALERT_FRACTIONS
    burn_usd_per_hour: float | None = None
    webhook_url: str | None = None

    def __post_init__(self) -> None:
        if self.budget_usd is not None and not self.budget_usd > 0:
            raise ValueError(f"budget_usd must be > 0, got {self.budget_usd}")
        if any(not 0 < f <= 1 for f in self.alert_fractions):
            raise ValueError(f"alert fractions must be in (0, 1], got {self.alert_fractions}")

    @property
    def active(self) -> bool:
        """Whether there is anything to track: a budget or a burn-rate threshold."""
        return self.budget_usd is not None or self.burn_usd_per_hour is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class Alert:
    """One budget or burn-rate alert, as logged and POSTed to the webhook."""

    kind: str
    """"budget" (a fraction crossed) or "burn" (spend per hour above the threshold)."""
    run_id: str
    spent_usd: float
    budget_usd: float | None
    fraction: float | None
    burn_usd_per_hour: float
    message: str

    def to_json(self) -> dict:
        """The webhook's JSON body; spend and burn rate rounded to 4 decimals."""
        return {
            "kind": self.kind,
            "run_id": self.run_id,
            "spent_usd": round(self.spent_usd, 4),
            "budget_usd": self.budget_usd,
            "fraction": self.fraction,
            "burn_usd_per_hour": round(self.burn_usd_per_hour, 4),
            "message": self.message,
        }


class BudgetTracker:
    """Decides alerts and the stop from spend; pure apart from the clock it is handed."""

    def __init__(
        self,
        policy: BudgetPolicy,
        *,
        earlier: Sequence[Segment],
        managed: bool = True,
        storage: Callable[[], tuple[int, str]] | None = None,
        bucket_region: str | Mapping[str, str | None] | None = None,
    ) -> None:
        self.policy = policy
        self.earlier = list(earlier)
        self.managed = managed
        self.storage = storage
        """Bytes of checkpoints the run keeps now and their URL scheme (`s3`, `gs`, `file`),
        priced like `skygreen cost` prices them; None: no storage is counted."""
        self.bucket_region = bucket_region
        """The bucket's region as the task states it (for a bucket set, each bucket's by its key);
        None: its cloud's default region."""
        self._fired: set[float] = set()
        self._burn_fired = False
        self._primed = False

    def spent_usd(self, current: Segment, now_s: float) -> float:
        """Dollars spent so far: the earlier segments plus `current` running until `now_s` (Unix
        seconds) unless it has ended, by `run_cost`, as `skygreen cost` counts it: compute, the
        controller for a managed run, the checkpoint bytes each segment moved (`current` with
        its counts so far), storage (`storage`) and requests; a segment with no known price
        counts as free."""
        live = replace(current, updated_at=max(now_s, current.started_at))
        stored_bytes, scheme = self.storage() if self.storage is not None else (0, "file")
        return run_cost(
            current.run_id,
            [*self.earlier, live],
            managed=self.managed,
            storage_bytes=stored_bytes,
            storage_scheme=scheme,
            buckets=default_buckets([*self.earlier, live], region=self.bucket_region),
        ).total_usd

    def burn_usd_per_hour(self, current: Segment) -> float:
        """Dollars per hour the run costs on `current`'s VM: its price per node x nodes (0 where
        no price is known), plus the controller's price for a managed run on a cloud."""
        place = current.place
        burn = (place.price_usd_per_hour or 0.0) * place.nodes
        if self.managed and place.cloud != "local":
            burn += CONTROLLER_USD_PER_HOUR.get(place.cloud, 0.0)
        return burn

    def check(self, current: Segment, now_s: float) -> tuple[list[Alert], bool]:
        """(new alerts, stop now?). Fractions already passed before this VM started are noted
        once, not sent again: the previous VM sent them."""
        p = self.policy
        spent = self.spent_usd(current, now_s)
        burn = self.burn_usd_per_hour(current)
        alerts = []
        if p.burn_usd_per_hour is not None and not self._burn_fired and burn > p.burn_usd_per_hour:
            self._burn_fired = True
            alerts.append(Alert(
                kind="burn", run_id=current.run_id, spent_usd=spent, budget_usd=p.budget_usd, fraction=None, burn_usd_per_hour=burn,
                message=f"run {current.run_id} burns ${burn:.2f}/h on {current.place.label}, above the alert threshold ${p.burn_usd_per_hour:g}/h",
            ))  # fmt: skip
        if p.budget_usd is None:
            return alerts, False
        fraction_now = spent / p.budget_usd
        if not self._primed:
            self._primed = True
            prior = self.spent_usd(current, current.started_at) / p.budget_usd
            self._fired.update(f for f in p.alert_fractions if prior >= f and f < 1.0)
        for f in sorted(p.alert_fractions):
            if fraction_now >= f and f not in self._fired:
                self._fired.add(f)
                alerts.append(Alert(
                    kind="budget", run_id=current.run_id, spent_usd=spent, budget_usd=p.budget_usd, fraction=f, burn_usd_per_hour=burn,
                    message=f"run {current.run_id} has spent ${spent:.2f} of its ${p.budget_usd:g} budget ({f:.0%})",
                ))  # fmt: skip
        return alerts, fraction_now >= 1.0


class StoredCheckpoints:
    """The bytes of a run's committed checkpoints and its store's URL scheme, for a budget's
    storage term: read from the manifests at most once per `refresh_s` (the budget is checked
    every second; storage grows only with each commit), 0 while the bucket cannot be read."""

    def __init__(self, store: Any, *, refresh_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        from skygreen.checkpoint.bucket_set import home_url
        from skygreen.checkpoint.store import parse_url

        self.store = store
        self.scheme = parse_url(home_url(store.url)).scheme  # a bucket set: its home bucket's prices
        self.refresh_s = refresh_s
        self._clock = clock
        self._read_at: float | None = None
        self._bytes = 0

    def __call__(self) -> tuple[int, str]:
        """(bytes of the committed checkpoints, the store's scheme), re-read when `refresh_s` passed."""
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self.refresh_s:
            from skygreen.checkpoint.manifest import iter_manifests
            from skygreen.errors import CheckpointError, StoreError

            try:
                self._bytes = sum(info.size for m in iter_manifests(self.store) for info in m.blobs.values())
            except (StoreError, CheckpointError) as e:
                log.warning("budget: cannot read the checkpoints' size (%s); storage counts as before", e)
            self._read_at = now
        return self._bytes, self.scheme


def stop_message(run_id: str, spent_usd: float, budget_usd: float) -> str:
    """What the runtime logs when a run stops at its budget, with the `skygreen resume` command
    that continues it with twice the budget."""
    return (
        f"run {run_id} reached its budget: ${spent_usd:.2f} of ${budget_usd:g}; checkpoint committed, training stopped\n"
        f"  fix: raise the budget and continue: `skygreen resume {run_id} --budget-usd {budget_usd * 2:g}` "
        "(or raise skygreen.budget_usd for new runs)"
    )


def send(alert: Alert, webhook_url: str | None, *, post: Callable[[str, bytes], None] | None = None) -> None:
    """Log the alert; POST it to the webhook when there is one. A webhook failure is a warning."""
    log.warning("budget alert: %s", alert.message)
    if not webhook_url:
        return
    try:
        (post or _post)(webhook_url, json.dumps(alert.to_json()).encode("utf-8"))
    except (OSError, urllib.error.URLError, ValueError) as e:
        log.warning("budget alert webhook failed: %s", e)


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:
        response.read()
