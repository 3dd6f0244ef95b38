"""`checkpoint.every: auto` at run time counts dollars as the plan does (issue 29).

A save whose bytes cross from the VM's place to the bucket's costs money; the runtime then takes
the plan's dollar-optimal interval (`skygreen.bill.interval.auto_interval_s`) for the bytes it
measured. Free bytes (the bucket in the VM's region, or no known price) keep Daly's optimum.
"""

from __future__ import annotations

import json
import math

import pytest

from skygreen.bill.interval import DOLLAR_LOSS_CAP, SaveBill, auto_interval_s
from skygreen.bill.rates import Place, internet_egress_usd
from skygreen.bill.traffic import HOURS_PER_MONTH
from skygreen.checkpoint.interval import IntervalPolicy, optimal_interval_s
from skygreen.plan.cost import PROVISION_S, _auto_interval_s
from skygreen.task.settings import RuntimeSettings

AZURE_VM = Place(cloud="azure", region="westus3")
S3_BUCKET = Place(cloud="aws", region="us-east-1")
PRICE_PER_NODE = 8.19  # $/h, an A100-80GB:4 spot offer
STALL_S = 12.0
UPLOAD_S = 300.0
SAVE_BYTES = 84_000_000_000  # a 7B model's full state
RATE = 0.24  # preemptions per hour
MTBF_S = 3600.0 / RATE


def _bill(vm: Place, bucket: Place, *, nodes: int = 1) -> SaveBill:
    return SaveBill(vm=vm, bucket=bucket, price_usd_per_hour=PRICE_PER_NODE * nodes, restart_s=PROVISION_S)


def test_free_bytes_keep_dalys_interval_exactly():
    daly = IntervalPolicy(preemptions_per_hour=RATE)
    same_region = IntervalPolicy(preemptions_per_hour=RATE, bill=_bill(S3_BUCKET, S3_BUCKET))
    for stall_s in (0.5, STALL_S, 90.0):
        expected = daly.auto_interval_s(stall_s, UPLOAD_S)
        assert same_region.save_usd(stall_s, SAVE_BYTES) == 0.0
        assert same_region.auto_interval_s(stall_s, UPLOAD_S, SAVE_BYTES) == expected
        assert expected == max(optimal_interval_s(stall_s, MTBF_S), UPLOAD_S)
    assert auto_interval_s(stall_s=STALL_S, save_usd=0.0, price_usd_per_hour=30.0, mtbf_s=MTBF_S, restart_s=300.0) == (
        optimal_interval_s(STALL_S, MTBF_S)
    )
    assert auto_interval_s(stall_s=STALL_S, save_usd=7.0, price_usd_per_hour=None, mtbf_s=MTBF_S, restart_s=300.0) == (
        optimal_interval_s(STALL_S, MTBF_S)
    ), "an unknown price: Daly's"


def test_costly_bytes_lengthen_the_interval_to_the_plans_value():
    bill = _bill(AZURE_VM, S3_BUCKET)
    policy = IntervalPolicy(preemptions_per_hour=RATE, bill=bill)
    daly_s = optimal_interval_s(STALL_S, MTBF_S)
    gb = SAVE_BYTES / 1e9
    month_gb = gb * HOURS_PER_MONTH * 3600 / daly_s
    save_usd = gb * internet_egress_usd("azure", month_gb) / month_gb  # Azure's internet egress, paid by the VM
    assert policy.save_usd(STALL_S, SAVE_BYTES) == pytest.approx(save_usd)
    assert 5.0 < save_usd < 8.0
    plan_s = _auto_interval_s(STALL_S, RATE, PROVISION_S + UPLOAD_S, save_usd, PRICE_PER_NODE)
    got_s = policy.auto_interval_s(STALL_S, UPLOAD_S, SAVE_BYTES)
    assert got_s == pytest.approx(plan_s, rel=1e-12)
    cap_s = 2 * (DOLLAR_LOSS_CAP * MTBF_S - PROVISION_S - UPLOAD_S)
    assert max(daly_s, policy.max_interval_s) < got_s <= cap_s, "longer than Daly's and the 1 h clamp, held by the cap"
    cheap = auto_interval_s(
        stall_s=STALL_S, save_usd=0.05, price_usd_per_hour=PRICE_PER_NODE, mtbf_s=MTBF_S, restart_s=0
    )
    assert daly_s < cheap < got_s, "a cent-sized save stretches the interval a little"
    assert math.isclose(cheap, optimal_interval_s(STALL_S + 3600 * 0.05 / PRICE_PER_NODE, MTBF_S)), (
        "the save's dollars as extra stall"
    )


def _settings(bucket: str, region: str | None = None) -> RuntimeSettings:
    """The settings as `skygreen up` renders them for the VM (`SKYGREEN_*`)."""
    environ = {"SKYGREEN_RUN_ID": "r1", "SKYGREEN_BUCKET": bucket, "SKYGREEN_PREEMPTIONS_PER_HOUR": str(RATE)}
    return RuntimeSettings.from_env({**environ, **({"SKYGREEN_CHECKPOINT_REGION": region} if region else {})})


def _landed(cloud: str, region: str, *, price: float | None = PRICE_PER_NODE, nodes: int = 1) -> dict[str, str]:
    offers = [] if price is None else [[cloud, region, "Standard_NC96ads_A100_v4", "A100-80GB", 4, True, price]]
    return {
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": cloud.upper(), "region": region}),
        "SKYPILOT_NUM_NODES": str(nodes),
        "SKYPILOT_NUM_GPUS_PER_NODE": "4",
        "SKYGREEN_OFFERS": json.dumps(offers),
    }


def test_the_schedule_takes_the_bill_from_settings_and_says_what_a_save_costs(caplog):
    from skygreen.runtime.services import open_schedule, save_bill

    caplog.set_level("INFO", logger="skygreen.checkpoint")
    settings = _settings("s3://ckpt/team", "us-east-1")
    environ = _landed("azure", "westus3", nodes=2)
    assert save_bill(settings, environ) == _bill(AZURE_VM, S3_BUCKET, nodes=2)
    schedule = open_schedule(settings, environ=environ, start_step=0, start_s=0.0)
    assert schedule.cost_meta() == {}
    schedule.saved(10, 100.0, save_cost_s=STALL_S, upload_s=UPLOAD_S, save_bytes=SAVE_BYTES)
    policy = IntervalPolicy(preemptions_per_hour=RATE, bill=_bill(AZURE_VM, S3_BUCKET, nodes=2))
    assert schedule.interval_s == policy.auto_interval_s(STALL_S, UPLOAD_S, SAVE_BYTES)
    assert schedule.interval_s > optimal_interval_s(STALL_S, MTBF_S)
    save_usd = policy.save_usd(STALL_S, SAVE_BYTES)
    assert schedule.cost_meta() == {"checkpoint_save_usd": round(save_usd, 6)}
    assert f"every {schedule.interval_s:.0f} s (least total cost: a save moves ${save_usd:.4g}" in caplog.text
    assert "azure/westus3 -> aws/us-east-1 at $16.38/h" in caplog.text

    for free_settings, free_environ in (
        (_settings("s3://ckpt/team"), _landed("aws", "us-east-1")),  # the bucket in the VM's region
        (settings, _landed("azure", "westus3", price=None)),  # no offer: the price is unknown
        (settings, {}),  # a local run
        (_settings("/tmp/ckpt"), environ),  # a local bucket
    ):
        free = open_schedule(free_settings, environ=free_environ, start_step=0, start_s=0.0)
        free.saved(10, 100.0, save_cost_s=STALL_S, upload_s=UPLOAD_S, save_bytes=SAVE_BYTES)
        assert free.interval_s == max(optimal_interval_s(STALL_S, MTBF_S), UPLOAD_S)
        assert free.cost_meta() in ({}, {"checkpoint_save_usd": 0.0})
        assert "(Daly," in free.describe()
