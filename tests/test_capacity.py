"""Relaunching a rendered task on the other kind of capacity (`skygreen.deadline.capacity`)."""

from __future__ import annotations

import json

from skygreen.deadline.capacity import with_capacity
from skygreen.ledger.place import current_place

TASK = {
    "run": "python train.py",
    "envs": {"SKYGREEN_RUN_ID": "r", "SKYGREEN_OFFERS": "[]"},
    "resources": {
        "use_spot": True,
        "ordered": [
            {"infra": "aws/us-east-1", "accelerators": "L4:1", "use_spot": True},
            {"infra": "aws/us-east-1", "accelerators": "L4:1", "use_spot": False},
            {"infra": "gcp/us-central1", "accelerators": "L4:1", "use_spot": True},
        ],
    },
}
OFFERS = [
    {"cloud": "aws", "region": "us-east-1", "instance_type": "g6.xlarge", "accelerator": "L4", "accelerator_count": 1,
     "spot_price_usd_per_hour": 0.35, "on_demand_price_usd_per_hour": 0.80},
    {"cloud": "gcp", "region": "us-central1", "instance_type": "g2-standard-4", "accelerator": "L4",
     "accelerator_count": 1, "spot_price_usd_per_hour": 0.22, "on_demand_price_usd_per_hour": None},
]  # fmt: skip


def test_on_demand_flips_every_candidate_once_and_prices_the_offers_on_demand():
    out = with_capacity(TASK, spot=False, offers=OFFERS)
    assert out["resources"]["use_spot"] is False
    assert out["resources"]["ordered"] == [
        {"infra": "aws/us-east-1", "accelerators": "L4:1", "use_spot": False},
        {"infra": "gcp/us-central1", "accelerators": "L4:1", "use_spot": False},
    ]
    assert out["envs"]["SKYGREEN_CAPACITY"] == "on-demand"
    # an offer without an on-demand price is left out: its VM's ledger then says the price is unknown
    assert json.loads(out["envs"]["SKYGREEN_OFFERS"]) == [["aws", "us-east-1", "g6.xlarge", "L4", 1, False, 0.8]]
    assert TASK["resources"]["use_spot"] is True  # the input is not changed
    back = with_capacity(out, spot=True, offers=OFFERS)
    assert back["resources"]["use_spot"] is True and back["envs"]["SKYGREEN_CAPACITY"] == "spot"
    assert [o[6] for o in json.loads(back["envs"]["SKYGREEN_OFFERS"])] == [0.35, 0.22]


def test_a_local_task_keeps_its_offers_and_its_ledger_says_the_capacity():
    local = {"run": "python train.py", "envs": {"SKYGREEN_RUN_ID": "r"}}
    out = with_capacity(local, spot=False)
    assert out == {"run": "python train.py", "envs": {"SKYGREEN_RUN_ID": "r", "SKYGREEN_CAPACITY": "on-demand"}}
    place = current_place(out["envs"], gpu=None)
    assert (place.cloud, place.spot, place.label) == ("local", False, "local (CPU, on-demand)")
    assert current_place({}, gpu=None).spot is None
