"""The real runtime writes its ledger: local directories, moto S3, the GCS emulator; budgets
stop a run and POST alerts to a loopback webhook. Prices checked by hand."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import ddp_train as job
from helpers import wait_for
from metadata_server import MetadataServer
from skygreen.checkpoint.local_store import LocalStore
from skygreen.checkpoint.store_factory import open_store
from skygreen.ledger import read_ledger
from skygreen.ledger.pricing import run_cost
from skygreen.runtime.checkpointer import Checkpointer

TOTAL_STEPS = 10
OFFERS = json.dumps(
    [
        ["gcp", "us-central1", "g2-standard-4", "L4", 1, True, 0.28],
        ["aws", "us-east-1", "g6.xlarge", "L4", 1, True, 0.29],
    ]
)


def cloud_env(
    metadata: MetadataServer, cloud: str = "GCP", region: str = "us-central1", **extra: str
) -> dict[str, str]:
    """What SkyPilot and `skygreen up` give a managed-job VM, on a machine without a GPU: the
    GPU is then taken from the rendered offer of the cloud and region."""
    return {
        "SKYPILOT_CLUSTER_INFO": json.dumps(
            {"cluster_name": "sky-1", "cloud": cloud, "region": region, "zone": f"{region}-a"}
        ),
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "1",
        "SKYGREEN_OFFERS": OFFERS,
        f"SKYGREEN_{cloud.upper()}_METADATA_URL": metadata.url,  # loopback only: no notice pending
        **extra,
    }


def crash_then_finish(url: str, environ: dict[str, str]):
    with pytest.raises(job.Crash):
        job.train(job.settings(url), TOTAL_STEPS, crash_at=(5, 0), environ=environ, metrics={3: 0.9, 7: 0.5})
    job.train(job.settings(url), TOTAL_STEPS, environ=environ, metrics={3: 0.9, 7: 0.5})
    return read_ledger(open_store(f"{url}/run"))


def check_two_segments(segments, price: float):
    first, second = segments
    assert (first.segment, second.segment) == (1, 2)
    assert first.end == "failed" and first.start_step == 0 and first.step == 5
    assert (
        second.end == "completed" and second.start_step == 4 and second.step == TOTAL_STEPS
    )  # resumed from the step-4 checkpoint
    for s in segments:
        assert s.place.cloud == "gcp" and s.place.region == "us-central1" and s.place.zone == "us-central1-a"
        assert s.place.instance_type == "g2-standard-4" and s.place.spot is True and s.place.price_usd_per_hour == price
        assert s.ended_at is not None and s.ended_at >= s.started_at
        assert s.energy_j is None  # CPU: nothing metered
        assert s.samples_per_s and s.samples_per_s > 0
    # reported after steps 3 and 7, i.e. once 4 and 8 steps are done
    assert [p[0] for p in first.metrics["val_loss"]] == [4] and [p[0] for p in second.metrics["val_loss"]] == [8]
    cost = run_cost("run", segments, managed=False)
    by_hand = sum(price * (s.ended_at - s.started_at) / 3600.0 for s in segments)
    assert cost.compute_usd == pytest.approx(by_hand, rel=1e-12)
    assert cost.steps == TOTAL_STEPS and cost.final_metrics == {"val_loss": 0.5}
    assert cost.preemptions == 0  # a failure is not a preemption


def test_ledger_in_a_local_bucket(tmp_path):
    with MetadataServer("gcp") as metadata:
        segments = crash_then_finish(str(tmp_path), cloud_env(metadata))
    check_two_segments(segments, 0.28)
    objects = sorted(p.name for p in (tmp_path / "run" / "ledger").iterdir())
    assert len(objects) == 2 and all(name.endswith(".json") for name in objects)


def test_ledger_on_s3(s3_bucket):
    with MetadataServer("gcp") as metadata:
        segments = crash_then_finish(f"s3://{s3_bucket}/runs", cloud_env(metadata))
    check_two_segments(segments, 0.28)


def test_ledger_on_gcs(gcs_bucket):
    with MetadataServer("gcp") as metadata:
        segments = crash_then_finish(f"gs://{gcs_bucket}/runs", cloud_env(metadata))
    check_two_segments(segments, 0.28)


def test_no_cluster_info_is_a_local_segment(tmp_path):
    job.train(job.settings(tmp_path), 4, environ={})
    (only,) = read_ledger(open_store(f"{tmp_path}/run"))
    assert only.place.cloud == "local" and only.end == "completed" and only.step == 4
    assert run_cost("run", [only]).total_usd == 0.0


class Webhook:
    """A loopback HTTP server that records the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers["Content-Length"])
                hook.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/alerts"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_budget_alerts_then_a_clean_stop_with_a_checkpoint(tmp_path, monkeypatch, caplog):
    """At $3600/h a second costs a dollar: a $2 budget is spent after about two seconds of
    training (steps slowed to 0.2 s each); alerts at 50%, 80%, 100% reach the webhook, the
    burn-rate alert fires at once, and the run stops with a committed checkpoint marked budget."""
    monkeypatch.setattr(job, "STEP_SLEEP_S", 0.2)
    hook = Webhook()
    offers = json.dumps([["aws", "us-east-1", "g6.xlarge", "L4", 1, True, 3600.0]])
    try:
        with MetadataServer("aws") as metadata:
            environ = cloud_env(metadata, cloud="AWS", region="us-east-1", SKYGREEN_OFFERS=offers, ALERT_HOOK=hook.url)
            settings = job.settings(
                tmp_path, budget_usd=2.0, budget_webhook_env="ALERT_HOOK", burn_alert_usd_per_hour=100.0
            )
            with pytest.raises(SystemExit) as stopped:
                job.train(settings, 1000, environ=environ)
    finally:
        hook.close()
    assert stopped.value.code == 0
    kinds = [(b["kind"], b["fraction"]) for b in hook.bodies]
    assert kinds == [("burn", None), ("budget", 0.5), ("budget", 0.8), ("budget", 1.0)]
    assert all(b["run_id"] == "run" and b["budget_usd"] == 2.0 for b in hook.bodies)
    assert hook.bodies[-1]["spent_usd"] >= 2.0
    latest = Checkpointer(f"{tmp_path}/run").load_latest()
    assert latest is not None and latest.manifest.meta["state"] == "budget"
    (segment,) = read_ledger(open_store(f"{tmp_path}/run"))
    assert segment.end == "budget" and segment.step == latest.step < 1000
    assert "skygreen resume run --budget-usd" in caplog.text


class HeldLedgerWrites(LocalStore):
    """A real local bucket whose ledger writes hang, once armed, until `release()`: a bucket that
    answers slowly. A write still held after 60 s fails the test (a training step waited on it)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.armed = False
        self.reached, self.released = threading.Event(), threading.Event()
        self.writers: set[str] = set()

    def put(self, key: str, data) -> None:
        if self.armed and key.startswith("ledger/"):
            self.writers.add(threading.current_thread().name)
            self.reached.set()
            assert self.released.wait(60), "a ledger write was held and never released"
        super().put(key, data)

    def release(self) -> None:
        self.released.set()


def test_a_slow_heartbeat_write_never_holds_a_training_step(tmp_path):
    from skygreen.runtime.run_book import RunBook
    from skygreen.task.settings import RuntimeSettings

    store = HeldLedgerWrites(str(tmp_path / "r"))
    settings = RuntimeSettings(run_id="r", bucket=str(tmp_path), ledger_heartbeat_s=1e-9)  # a beat after every step
    book = RunBook(store=store, settings=settings, device_name=None, gpu_count=0, environ={}, started_at=time.time())
    book.started(step=0, samples=0, samples_per_epoch=None, energy_j=0.0)
    store.armed = True
    book.tick(1)  # the first step only starts the heartbeat's clock
    book.tick(2)  # the first beat: its write hangs at the bucket
    assert store.reached.wait(60), "the heartbeat never wrote"
    for step in range(3, 40):  # training goes on meanwhile; each step's beat folds into the next write
        book.tick(step)
    assert not store.released.is_set() and store.writers == {"skygreen-ledger-heartbeat"}
    assert read_ledger(store)[-1].reached_step is None  # nothing of the beats is written yet
    noted = book.writer.segment.reached_step
    assert noted is not None and noted > 2
    store.release()
    wait_for(lambda: read_ledger(store)[-1].reached_step == noted, "the beats written once the bucket answers")
