"""The preemption rate the runtime assumes is the one of the cloud it landed on.

A managed job's fallbacks span clouds, so `skygreen up` renders the per-cloud table (the
planner's rates with the task's overrides) into the task, and the runtime picks its row once
`SKYPILOT_CLUSTER_INFO` tells it the cloud. Through the real `skygreen up --dryrun`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from skygreen.checkpoint.interval import PREEMPTION_RATE_PER_HOUR
from skygreen.errors import RuntimeSetupError
from skygreen.runtime.preemption import landed_cloud
from skygreen.task.settings import RuntimeSettings

CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
SKY_NAME = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}


@pytest.fixture
def rendered(tmp_path) -> dict:
    task = tmp_path / "task.yaml"
    task.write_text(
        "name: spread\n"
        "skygreen:\n"
        "  gpus: [T4, L4]\n"
        "  work: {gpu_hours: 4, gpu: A100}\n"
        "  max_candidates: 12\n"
        "  preemption: {rate_per_hour: {gcp: 0.05}}\n"
        "  checkpoint: {bucket: s3://bucket/runs}\n"
        "run: python train.py\n"
    )
    (tmp_path / "train.py").write_text("print('train')\n")
    out_yaml = tmp_path / "sky.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_"))}
    env.update(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "data"), COLUMNS="200")
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "up", str(task), "--dryrun", "--no-smoke", "--catalog", str(CATALOG), "-o", str(out_yaml)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out_yaml.read_text())


def test_up_renders_the_rate_of_every_cloud_among_the_fallbacks(rendered):
    clouds = {o["infra"].split("/")[0] for o in rendered["resources"]["ordered"]}
    assert len(clouds) >= 2  # the fallbacks span clouds
    envs = rendered["envs"]
    assert "SKYGREEN_PREEMPTIONS_PER_HOUR" not in envs  # no single rate taken from the first cloud
    table = dict(item.split("=") for item in envs["SKYGREEN_PREEMPTIONS_PER_HOUR_BY_CLOUD"].split(","))
    assert set(table) == clouds
    for cloud, rate in table.items():
        expected = 0.05 if cloud == "gcp" else PREEMPTION_RATE_PER_HOUR[cloud]
        assert float(rate) == expected


def test_the_runtime_takes_the_row_of_the_cloud_it_landed_on(rendered):
    envs = {k: str(v) for k, v in rendered["envs"].items() if v is not None}
    clouds = {o["infra"].split("/")[0] for o in rendered["resources"]["ordered"]}
    rates = set()
    for cloud in clouds:
        environ = {
            **envs,
            "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": SKY_NAME[cloud], "region": "r", "num_nodes": 1}),
        }
        settings = RuntimeSettings.from_env(environ)
        rate = settings.preemption_rate_on(landed_cloud(settings.cloud, environ))
        assert rate == (0.05 if cloud == "gcp" else PREEMPTION_RATE_PER_HOUR[cloud])
        rates.add(rate)
    assert len(rates) >= 2  # a different cloud, a different rate


def test_an_unknown_cloud_assumes_the_highest_rate_and_a_fixed_rate_wins():
    environ = {
        "SKYGREEN_RUN_ID": "r",
        "SKYGREEN_BUCKET": "/tmp/b",
        "SKYGREEN_PREEMPTIONS_PER_HOUR_BY_CLOUD": "aws=0.47,gcp=0.24",
    }
    assert RuntimeSettings.from_env(environ).preemption_rate_on(None) == 0.47
    fixed = {**environ, "SKYGREEN_PREEMPTIONS_PER_HOUR": "0.1"}
    assert RuntimeSettings.from_env(fixed).preemption_rate_on("gcp") == 0.1
    assert RuntimeSettings.from_env({"SKYGREEN_RUN_ID": "r", "SKYGREEN_BUCKET": "/b"}).preemption_rate_on("aws") is None


@pytest.mark.parametrize("raw", ["aws", "aws=fast", "=0.2", "aws=-1"])
def test_a_malformed_table_names_the_variable(raw):
    environ = {"SKYGREEN_RUN_ID": "r", "SKYGREEN_BUCKET": "/b", "SKYGREEN_PREEMPTIONS_PER_HOUR_BY_CLOUD": raw}
    with pytest.raises(RuntimeSetupError) as info:
        RuntimeSettings.from_env(environ)
    assert "SKYGREEN_PREEMPTIONS_PER_HOUR_BY_CLOUD" in str(info.value)


def test_settings_round_trip_through_the_environment():
    settings = RuntimeSettings(run_id="r", bucket="s3://b", preemptions_per_hour_by_cloud={"gcp": 0.24, "aws": 0.47})
    assert RuntimeSettings.from_env(settings.to_env()) == settings
