"""The task file loader: defaults, every class of bad input, and a property over any input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers import user_env
from skygreen.errors import InputError, SpecError
from skygreen.task.spec import CLOUDS, TaskSpec, load_spec, parse_spec, parse_spec_text


def spec_of(text: str) -> TaskSpec:
    return parse_spec_text(textwrap.dedent(text))


def error_of(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        spec_of(text)
    return info.value


def test_minimal_task_gets_the_defaults_a_user_expects():
    spec = spec_of("run: python train.py\n")
    green = spec.green
    assert green.spot is True and green.on_demand_fallback is False
    assert green.clouds == CLOUDS
    assert green.objective == "cost"
    assert green.gpu_count == 1
    assert green.precision == "auto"
    assert green.checkpoint.keep == 3 and green.checkpoint.every_auto
    assert green.power.mode == "auto"
    assert green.early_stopping is None
    assert green.recovery.strategy == "EAGER_NEXT_REGION"
    assert spec.sky == {"run": "python train.py"}


def test_full_section_is_read_and_removed_from_the_skypilot_part():
    spec = spec_of(
        """
        name: bert
        num_nodes: 2
        skygreen:
          gpus: [a100, H100, l4]
          gpu_count: 4
          clouds: [AWS, gcp]
          objective: carbon
          work: {gpu_hours: 12, gpu: a100}
          max_price_per_hour: 4
          budget_usd: 60
          precision: BF16
          batch: {effective: 64, micro: auto}
          checkpoint: {bucket: "S3://bkt/runs", every: 5m, keep: 4, half_precision: bf16}
          power: {cap: 0.8}
          early_stopping: {metric: val_loss, patience: 2, grace: 5}
          recovery: FAILOVER
          speed: {l4: 0.4}
        run: python train.py
        """
    )
    g = spec.green
    assert g.gpus.names == ("A100", "H100", "L4")
    assert g.clouds == ("aws", "gcp")
    assert g.work.gpu == "A100" and g.work.gpu_hours == 12.0
    assert g.precision == "bf16"
    assert g.batch.effective == 64 and g.batch.micro is None
    assert g.checkpoint.bucket == "s3://bkt/runs" and g.checkpoint.every_s == 300.0
    assert g.power.mode == "fraction" and g.power.cap_fraction == 0.8
    assert g.early_stopping.grace == 5 and g.early_stopping.mode == "min"
    assert g.recovery.strategy == "FAILOVER"
    assert g.speed == {"L4": 0.4}
    assert spec.num_nodes == 2 and "skygreen" not in spec.sky


def test_memory_constraint_instead_of_names():
    g = spec_of("skygreen: {gpus: {min_memory_gb: 24}}\n").green
    assert g.gpus.names is None and g.gpus.min_memory_gb == 24


@pytest.mark.parametrize(
    "text, field, words",
    [
        ("skygreen: {gpuz: [A100]}", "skygreen.gpuz", ["unknown key", "did you mean 'gpus'"]),
        ("skygren: {gpus: [A100]}", "skygren", ["did you mean 'skygreen'"]),
        ("skygreen: {gpu_count: two}", "skygreen.gpu_count", ["expected an integer", "'two'"]),
        ("skygreen: {gpu_count: 0}", "skygreen.gpu_count", ["at least 1"]),
        ("skygreen: {gpu_count: true}", "skygreen.gpu_count", ["expected an integer"]),
        ("skygreen: {budget_usd: -5}", "skygreen.budget_usd", ["greater than 0", "-5"]),
        ("skygreen: {max_price_per_hour: 0}", "skygreen.max_price_per_hour", ["greater than 0"]),
        ("skygreen: {work: {gpu_hours: .nan}}", "skygreen.work.gpu_hours", ["finite"]),
        ("skygreen: {gpus: [A1000]}", "skygreen.gpus[0]", ["unknown GPU", "did you mean 'A100'"]),
        ("skygreen: {gpus: ['A100:8']}", "skygreen.gpus[0]", ["gpu_count"]),
        (
            "skygreen: {clouds: [awz]}",
            "skygreen.clouds[0]",
            ["unknown value 'awz'", "did you mean 'aws'", "aws, gcp, azure"],
        ),
        ("skygreen: {clouds: []}", "skygreen.clouds", ["must not be empty"]),
        ("skygreen: {spot: yes please}", "skygreen.spot", ["true or false"]),
        ("skygreen: {objective: cheap}", "skygreen.objective", ["cost, time, energy, carbon"]),
        ("skygreen: {precision: fp8}", "skygreen.precision", ["auto, bf16, fp16, fp32"]),
        ("skygreen: {checkpoint: {keep: 1}}", "skygreen.checkpoint.keep", ["at least 2"]),
        ("skygreen: {checkpoint: {every: soon}}", "skygreen.checkpoint.every", ["duration"]),
        (
            "skygreen: {checkpoint: {bucket: 'ftp://x/y'}}",
            "skygreen.checkpoint.bucket",
            ["unsupported bucket scheme", "s3://"],
        ),
        (
            "skygreen: {checkpoint: {bucket: 's3//team/ckpt'}}",
            "skygreen.checkpoint.bucket",
            ["not a bucket URL", "'s3//team/ckpt'", "s3://BUCKET", "gs://", "fix: write s3://team/ckpt"],
        ),
        (
            "skygreen: {checkpoint: {bucket: 'gs:/team'}}",
            "skygreen.checkpoint.bucket",
            ["not a bucket URL", "fix: write gs://team, or ./gs:/team"],
        ),
        ("skygreen: {checkpoint: {bucket: 'file:/ckpts'}}", "skygreen.checkpoint.bucket", ["write file:///ckpts"]),
        ("skygreen: {checkpoint: {bucket: 's3://'}}", "skygreen.checkpoint.bucket", ["names no bucket"]),
        ("skygreen: {checkpoint: {bucket: '  '}}", "skygreen.checkpoint.bucket", ["must not be empty"]),
        ("skygreen: {batch: {effective: 8, micro: 16}}", "skygreen.batch.micro", ["larger than the effective"]),
        ("skygreen: {power: {cap: 5000}}", "skygreen.power.cap", ["between 50 and 1500"]),
        ("skygreen: {early_stopping: {patience: 3}}", "skygreen.early_stopping.metric", ["required"]),
        ("skygreen: {recovery: {strategy: EAGER}}", "skygreen.recovery.strategy", ["EAGER_NEXT_REGION"]),
        ("skygreen: {spot: false, on_demand_fallback: true}", "skygreen.on_demand_fallback", ["spot: true"]),
        ("skygreen: {work: {gpu: B200X}}", "skygreen.work.gpu", ["unknown GPU"]),
        ("skygreen: {work: {on: B200X}}", "skygreen.work.on", ["unknown GPU"]),
        ("skygreen: {work: {gpu: A100, on: A100}}", "skygreen.work.on", ["both", "keep only `gpu`"]),
        ("skygreen: [A100]", "skygreen", ["expected a mapping"]),
        ("num_nodes: 0", "num_nodes", ["at least 1"]),
        (
            'skygreen: {budget_usd: 5, budget_alerts: {webhook_env: "HOOK\\n"}}',
            "skygreen.budget_alerts.webhook_env",
            ["not an environment variable name"],
        ),
    ],
)
def test_bad_field_names_path_value_and_fix(text, field, words):
    err = error_of(text)
    message = str(err)
    assert err.field == field
    assert message.startswith(f"{field}:")
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    "text, words",
    [
        ("skygreen: {gpus: [A100}", ["invalid YAML", "line 1"]),
        ("name: a\nname: b\n", ["duplicate key 'name'", "line 2"]),
        ("- just\n- a list\n", ["must be a mapping", "list"]),
        ("42\n", ["must be a mapping", "integer"]),
        ("", ["empty"]),
        ("{1: 2}", ["keys must be strings"]),
    ],
)
def test_file_level_problems(text, words):
    message = str(error_of(text))
    for word in words:
        assert word in message


def test_missing_file_is_input_error_naming_it(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InputError) as info:
        load_spec(missing)
    assert str(missing) in str(info.value) and info.value.exit_code == 2


def test_errors_from_a_file_name_the_file(tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text("skygreen: {gpu_count: -1}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: skygreen.gpu_count")
    assert "(line 1)" in str(info.value).splitlines()[0]


# Any YAML-shaped value, nested a few levels, under the keys the loader knows and a few it does not.
_KEYS = st.sampled_from(
    ["gpus", "gpu_count", "clouds", "spot", "objective", "work", "gpu_hours", "gpu", "on", "budget_usd",
     "batch", "effective", "micro", "checkpoint", "bucket", "every", "keep", "power", "cap",
     "early_stopping", "metric", "patience", "min_memory_gb", "names", "recovery", "speed", "A100", "zzz"]
)  # fmt: skip
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["auto", "A100", "aws", "5m", "s3://b/p", "off", "fp16"]),
)  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=5)),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(section=_VALUES, top=st.dictionaries(st.sampled_from(["name", "num_nodes", "run", "runn"]), _SCALARS))
@example(section=None, top={"num_nodes": "²"})  # a digit to str.isdigit, not to int()
def test_any_input_ends_in_a_clear_error_or_a_valid_spec(section, top):
    data = {**top, "skygreen": section}
    try:
        spec = parse_spec(data)
    except SpecError as e:
        assert e.exit_code == 2
        assert str(e).strip() and e.field
    else:
        assert spec.green.gpu_count >= 1 and spec.green.checkpoint.keep >= 2


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_text_ends_in_a_clear_error_or_a_valid_spec(text):
    try:
        parse_spec_text(text)
    except SpecError as e:
        assert str(e).strip()


def test_round_trip_through_yaml_dump():
    data = {"name": "x", "skygreen": {"gpus": ["L4"], "work": {"gpu_hours": 2}}, "run": "echo"}
    assert parse_spec_text(yaml.safe_dump(data)).green.work.gpu_hours == 2.0


@pytest.mark.parametrize(
    "written, kept",
    [
        ("S3://bkt/runs/", "s3://bkt/runs"),
        ("gs://bkt", "gs://bkt"),
        ("file:///tmp/ckpts", "file:///tmp/ckpts"),
        ("ckpts/run-a", "ckpts/run-a"),  # a plain path is a local directory, as the README says
        ("./s3/team", "./s3/team"),  # a folder named s3, said so
        ("~/buckets", "~/buckets"),
        ("/data/s3//x", "/data/s3//x"),
    ],
)
def test_buckets_a_run_can_open_are_kept(written, kept):
    assert spec_of(f"skygreen: {{checkpoint: {{bucket: '{written}'}}}}\n").green.checkpoint.bucket == kept


def test_a_bucket_without_its_schemes_colon_stops_plan_and_up_and_writes_nothing(private_home, tmp_path):
    """`s3//team/ckpt` once planned fine and `up --local` trained into ./s3/team/ckpt."""
    env = user_env(private_home)
    task = tmp_path / "task.yaml"
    task.write_text(
        "name: t\nskygreen: {gpus: [L4], checkpoint: {bucket: 's3//team/ckpt'}}\nrun: python -c 'print(1)'\n"
    )
    catalog = str(Path(__file__).resolve().parent / "data" / "catalog" / "v8")
    for args in (["plan", str(task), "--catalog", catalog], ["up", str(task), "--local", "--no-smoke"]):
        out = subprocess.run([sys.executable, "-m", "skygreen.cli", *args], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "skygreen.checkpoint.bucket" in out.stderr and "'s3//team/ckpt'" in out.stderr, out.stderr
        assert "fix: write s3://team/ckpt" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "s3").exists()
    status = subprocess.run([sys.executable, "-m", "skygreen.cli", "status", "--json"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert status.returncode == 0 and json.loads(status.stdout) == [], status.stdout + status.stderr
