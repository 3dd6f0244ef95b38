"""The runtime settings: typed records, validated once, carried by one codec driven by field types."""

from __future__ import annotations

import subprocess
import sys

import pytest

from skygreen.errors import RuntimeSetupError
from skygreen.memory.planned import PlannedMemory
from skygreen.power.policy import CapRequest
from skygreen.runtime.hold import hold_steps
from skygreen.task.settings import RuntimeSettings, decode, encode, env_names
from skygreen.task.spec import EarlyStopConfig

BASE = {"SKYGREEN_RUN_ID": "r1", "SKYGREEN_BUCKET": "s3://b/runs"}


def full() -> RuntimeSettings:
    return RuntimeSettings(
        run_id="r1",
        bucket="s3://b/runs",
        precision="bf16",
        effective_batch=64,
        micro_batch=8,
        checkpoint_every_steps=100,
        checkpoint_every_s=600.0,
        checkpoint_keep=2,
        checkpoint_half_precision="bf16",
        checkpoint_dir="out",
        checkpoint_marker="trainer_state.json",
        checkpoint_quiet_s=30.0,
        checkpoint_region="us-west-2",
        trainer="transformers",
        power_cap=CapRequest.parse("0.6"),
        power_required=True,
        power_eta=0.3,
        early_stop=EarlyStopConfig(metric="val_loss", mode="max", patience=4, min_delta=0.01, grace=2),
        preemptions_per_hour=0.2,
        preemptions_per_hour_by_cloud={"aws": 0.47, "gcp": 0.24},
        cloud="aws",
        budget_usd=40.0,
        budget_alerts=(0.8, 0.5, 1.0),
        budget_webhook_env="SLACK_URL",
        burn_alert_usd_per_hour=3.5,
        offers="aws:us-east-1:L4:1:0.8",
        user="alice",
        launch=2,
        ledger_heartbeat_s=5.0,
        memory_planned_gb=PlannedMemory(low_gb=15.2, high_gb=19.75, tensors_gb=14.1, gpus=2),
    )


def test_every_field_round_trips_through_one_variable_each():
    settings = full()
    env = settings.to_env()
    assert RuntimeSettings.from_env(env) == settings
    assert env["SKYGREEN_POWER_CAP"] == "0.6"
    assert env["SKYGREEN_BUDGET_ALERTS"] == "0.5,0.8,1", "sorted, as validated"
    assert env["SKYGREEN_PREEMPTIONS_PER_HOUR_BY_CLOUD"] == "aws=0.47,gcp=0.24"
    assert env["SKYGREEN_EARLY_STOP_GRACE"] == "2" and env["SKYGREEN_POWER_REQUIRED"] == "true"
    assert set(env) == env_names(), "every variable the codec knows is written for a full settings"
    minimal = RuntimeSettings(run_id="r", bucket="/b")
    assert RuntimeSettings.from_env(minimal.to_env()) == minimal
    assert minimal.to_env() == {"SKYGREEN_RUN_ID": "r", "SKYGREEN_BUCKET": "/b", "SKYGREEN_PRECISION": "auto",
                                "SKYGREEN_CHECKPOINT_KEEP": "3", "SKYGREEN_POWER_CAP": "auto",
                                "SKYGREEN_POWER_REQUIRED": "false"}  # fmt: skip


def test_a_single_variable_overrides_one_setting_as_with_sky_jobs_launch_env():
    env = {**full().to_env(), "SKYGREEN_BUDGET_USD": "80", "SKYGREEN_POWER_CAP": "off"}
    settings = RuntimeSettings.from_env(env)
    assert settings.budget_usd == 80.0 and settings.power_cap == CapRequest(mode="off")
    assert RuntimeSettings.from_env(env, precision="fp32").precision == "fp32", "code wins"


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("SKYGREEN_CHECKPOINT_KEEP", "two", "expected an integer"),
        ("SKYGREEN_CHECKPOINT_KEEP", "0", "must be an integer >= 1"),
        ("SKYGREEN_BUDGET_USD", "0", "must be a number of dollars > 0, got 0.0"),
        ("SKYGREEN_BUDGET_USD", "-1", "must be a number of dollars > 0, got -1.0"),
        ("SKYGREEN_BUDGET_USD", "nan", "must be a number of dollars > 0, got nan"),
        ("SKYGREEN_BURN_ALERT_USD_PER_HOUR", "-1", "must be a finite number >= 0"),
        ("SKYGREEN_POWER_REQUIRED", "maybe", "expected true or false"),
        ("SKYGREEN_POWER_CAP", "lots", "power cap must be auto, off, watts or a fraction"),
        ("SKYGREEN_BUDGET_ALERTS", "0.5,1.5", "every fraction must be in (0, 1]"),
        ("SKYGREEN_BUDGET_ALERTS", "half", "expected a number"),
        ("SKYGREEN_PREEMPTIONS_PER_HOUR_BY_CLOUD", "aws", "KEY=VALUE"),
        ("SKYGREEN_PREEMPTIONS_PER_HOUR_BY_CLOUD", "aws=-1", "each rate a number >= 0"),
        ("SKYGREEN_PRECISION", "fp8", "must be one of auto, bf16, fp16, fp32"),
        ("SKYGREEN_EARLY_STOP_MODE", "max", "but SKYGREEN_EARLY_STOP_METRIC is not"),
        ("SKYGREEN_EARLY_STOP_PATIENCE", "x", "expected an integer"),
        ("SKYGREEN_LAUNCH", "0", "must be an integer >= 1"),
        ("SKYGREEN_LAUNCH", "two", "expected an integer"),
        ("SKYGREEN_LEDGER_HEARTBEAT_S", "0", "must be a number of seconds > 0"),
        ("SKYGREEN_LEDGER_HEARTBEAT_S", "soon", "expected a number"),
    ],
)
def test_a_bad_variable_is_refused_naming_it_and_the_value(name, raw, expected):
    with pytest.raises(RuntimeSetupError) as info:
        RuntimeSettings.from_env({**BASE, name: raw})
    assert name in str(info.value) and expected in str(info.value)


def test_the_launch_and_the_ledger_heartbeat_reach_the_runtime_through_the_codec(tmp_path):
    from skygreen.runtime.ranks import World
    from skygreen.runtime.run_book import HEARTBEAT_S, RunBook
    from skygreen.runtime.services import open_checkpointer

    env = {**BASE, "SKYGREEN_BUCKET": str(tmp_path), "SKYGREEN_LAUNCH": "3", "SKYGREEN_LEDGER_HEARTBEAT_S": "0.5"}
    settings = RuntimeSettings.from_env(env)
    assert (settings.launch, settings.ledger_heartbeat_s) == (3, 0.5)
    world = World(rank=0, size=1, local_rank=0)
    assert open_checkpointer(settings, world=world).launch == 3
    book = RunBook.open(settings, store=open_checkpointer(settings, world=world).store, world=world,
                        device_name=None, environ=env, metering=False)  # fmt: skip
    assert book is not None and book.heartbeat_s == 0.5
    default = RunBook.open(RuntimeSettings.from_env({**BASE, "SKYGREEN_BUCKET": str(tmp_path)}), world=world,
                           store=book.writer.store, device_name=None, environ={}, metering=False)  # fmt: skip
    assert default is not None and default.heartbeat_s == HEARTBEAT_S


def test_settings_built_in_code_are_validated_too():
    with pytest.raises(RuntimeSetupError, match="SKYGREEN_MICRO_BATCH"):
        RuntimeSettings(run_id="r", bucket="/b", micro_batch=0)
    with pytest.raises(RuntimeSetupError, match="SKYGREEN_POWER_CAP"):
        RuntimeSettings(run_id="r", bucket="/b", power_cap="0.6")  # type: ignore[arg-type]
    with pytest.raises(RuntimeSetupError, match="SKYGREEN_RUN_ID is not set"):
        RuntimeSettings.from_env({"SKYGREEN_BUCKET": "/b"})


def test_the_one_decoder_reads_the_other_runtime_variables():
    assert decode("1,4,5", tuple[int, ...], "X") == (1, 4, 5)
    assert decode("a=1,b=2", dict[str, float], "X") == {"a": 1.0, "b": 2.0}
    assert encode((0.5, 1.0), tuple[float, ...]) == "0.5,1"
    assert hold_steps({"SKYGREEN_TEST_HOLD_AT_STEPS": "3, 6"}) == frozenset({3, 6})
    with pytest.raises(RuntimeSetupError, match="SKYGREEN_TEST_HOLD_AT_STEPS"):
        hold_steps({"SKYGREEN_TEST_HOLD_AT_STEPS": "3,six"})


def test_a_bad_variable_stops_the_real_runtime_with_exit_2_and_no_traceback(tmp_path):
    """The user's script under `skygreen up`: a bad override is a clear error, not a traceback."""
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nfrom skygreen.errors import RuntimeSetupError\nfrom skygreen.task.settings import RuntimeSettings\n"
        "try:\n    RuntimeSettings.from_env()\nexcept RuntimeSetupError as e:\n    print(e, file=sys.stderr)\n"
        "    sys.exit(2)\n"
    )
    env = {**BASE, "SKYGREEN_BUDGET_ALERTS": "2", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "SKYGREEN_BUDGET_ALERTS" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("budget", [0.0, -5.0, float("nan")])
def test_a_budget_that_is_not_positive_is_refused_with_its_fix(budget):
    with pytest.raises(RuntimeSetupError) as info:
        RuntimeSettings(run_id="r1", bucket="/b", budget_usd=budget)
    message = str(info.value)
    assert message.startswith("SKYGREEN_BUDGET_USD (budget_usd): must be a number of dollars > 0")
    assert "fix: set a budget such as 40, or unset it for no budget" in message
    assert RuntimeSettings(run_id="r1", bucket="/b", budget_usd=0.01).budget_usd == 0.01


def test_a_budget_of_0_stops_a_real_trainer_script_with_exit_2_and_no_traceback(tmp_path):
    """tasks/lightning_task.py as `skygreen up` starts it, with `--env SKYGREEN_BUDGET_USD=0`
    added: the callback's settings refuse it before training (the ledger's budget policy would
    raise it from `fit()` with a traceback), and nothing is committed."""
    pytest.importorskip("lightning")
    from local_runs import LIGHTNING_TASK, finish

    work = LIGHTNING_TASK.workdir(tmp_path, "work")
    bucket = tmp_path / "bucket"
    proc = LIGHTNING_TASK.train(work, LIGHTNING_TASK.env(tmp_path, bucket, SKYGREEN_BUDGET_USD="0"))
    out = finish(proc, 600)
    assert proc.returncode == 2, out
    assert "SKYGREEN_BUDGET_USD (budget_usd): must be a number of dollars > 0, got 0.0" in out
    assert "fix: set a budget such as 40" in out and "Traceback" not in out
    assert not bucket.exists() or not [p for p in bucket.rglob("*") if p.is_file()]
