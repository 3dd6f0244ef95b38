"""Render: every YAML skygreen writes is a task SkyPilot's own parser accepts, offline.

SkyPilot validates with `sky.Task.from_yaml_config` (schema, resources, secrets) on a private
HOME; the shell it runs is executed for real with bash, so quoting mistakes show up as wrong
argv, not as a string that merely looks right.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skygreen import __version__
from skygreen.errors import SpecError
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.gpus import GPU_NAMES
from skygreen.launch.render import (
    LAPTOP_ONLY,
    RuntimeInstall,
    container_requirements,
    declared_secrets,
    render_task,
    secret_values,
    to_yaml,
)
from skygreen.plan.rank import Candidate, Plan
from skygreen.task.settings import RuntimeSettings
from skygreen.task.spec import PRECISIONS, RECOVERY_STRATEGIES, TaskSpec, parse_spec

REPO = Path(__file__).resolve().parents[1]
TASKS = sorted((REPO / "tasks").glob("*.yaml"))
WORKDIR = Path(tempfile.mkdtemp(prefix="skygreen-render-"))
REGIONS = {"aws": ["us-east-1", "eu-west-1"], "gcp": ["us-central1", "europe-west4"], "azure": ["eastus", "westeurope"]}


def sky_accepts(sky, task: dict) -> Any:
    """Parse the YAML text skygreen writes, exactly as SkyPilot's client would."""
    config = yaml.safe_load(to_yaml(task))
    return sky.Task.from_yaml_config(copy.deepcopy(config))


def candidate(cloud: str, region: str, gpu: str, count: int = 1, *, spot: bool = True, price: float = 1.0) -> Candidate:
    return Candidate(
        cloud=cloud, region=region, zone=None, instance_type="some-vm", accelerator=gpu, accelerator_count=count,
        spot=spot, price_usd_per_hour=price, on_demand_price_usd_per_hour=price * 3, spot_price_usd_per_hour=price,
        est_hours=1.0, est_cost_usd=price, energy_kwh=0.3, co2e_kg=0.1,
    )  # fmt: skip


def settings_for(spec, run_id: str = "demo-20260101-000000-abcd") -> RuntimeSettings:
    return RuntimeSettings.from_spec(spec.green, run_id=run_id, bucket="s3://bucket/runs")


def spec_of(**task) -> TaskSpec:
    task.setdefault("run", "python train.py")
    return parse_spec(task)


# ---------------------------------------------------------------- the shipped tasks


@pytest.mark.parametrize("path", TASKS, ids=lambda p: p.name)
def test_every_shipped_task_renders_to_yaml_skypilot_accepts(path, sky, private_home):
    from skygreen.api import plan as make_plan
    from skygreen.task.spec import load_spec

    assert TASKS, "tasks/ holds no task files"
    spec = load_spec(path)
    plan = make_plan(spec)
    cloud = render_task(
        spec, plan, settings=settings_for(spec), task_dir=path.parent, install=RuntimeInstall(source_dir=str(REPO))
    )
    local = render_task(spec, None, settings=settings_for(spec), task_dir=path.parent)
    for task in (cloud, local):
        parsed = sky_accepts(sky, task)
        assert parsed.envs["SKYGREEN_RUN_ID"] == "demo-20260101-000000-abcd"
        assert "skygreen" not in yaml.safe_load(to_yaml(task))
    resources = list(sky_accepts(sky, cloud).resources)
    assert len(resources) == len(cloud["resources"]["ordered"]) >= 1
    assert all(r.use_spot == spec.green.spot for r in resources)
    best = plan.candidates[0]
    assert cloud["resources"]["ordered"][0] == {
        "infra": f"{best.cloud}/{best.region}",
        "accelerators": f"{best.accelerator}:{best.accelerator_count}",
        "use_spot": best.spot,
    }


def test_preempted_exit_code_is_the_one_rendered_and_never_changes():
    """Clusters already running rendered YAML recover on 75 (EX_TEMPFAIL): it is a contract."""
    import skygreen.runtime

    assert PREEMPTED_EXIT_CODE == skygreen.runtime.PREEMPTED_EXIT_CODE == 75


# ---------------------------------------------------------------- property-based specs

NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)
ENV_NAMES = st.from_regex(r"[A-Z][A-Z0-9_]{0,12}", fullmatch=True).filter(lambda n: not n.startswith("SKYGREEN_"))
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("\n\t"), max_size=30)
ARGS = st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12), max_size=5)


@st.composite
def specs_and_plans(draw):
    gpus = draw(st.lists(st.sampled_from(GPU_NAMES), min_size=1, max_size=4, unique=True))
    gpu_count = draw(st.sampled_from([1, 1, 2, 4, 8]))
    green = {
        "gpus": gpus,
        "gpu_count": gpu_count,
        "spot": draw(st.booleans()),
        "max_candidates": draw(st.integers(1, 8)),
        "precision": draw(st.sampled_from(PRECISIONS)),
        "recovery": {
            "strategy": draw(st.sampled_from(RECOVERY_STRATEGIES)),
            "max_restarts_on_errors": draw(st.integers(0, 10)),
        },
        "checkpoint": {
            "bucket": "s3://bucket/runs",
            "every": draw(st.sampled_from(["auto", 100, "30s"])),
            "keep": draw(st.integers(2, 5)),
        },
    }
    secret_names = draw(st.lists(ENV_NAMES, max_size=3, unique=True))
    secrets = {
        name: (None if draw(st.booleans()) else f"sekrit-{i}-{draw(st.integers(1000, 9999))}")
        for i, name in enumerate(secret_names)
    }
    envs = {k: v for k, v in draw(st.dictionaries(ENV_NAMES, TEXT, max_size=3)).items() if k not in secrets}
    task = {
        "name": draw(NAMES),
        "skygreen": green,
        "run": "python train.py " + shlex.join(draw(ARGS)),
        "num_nodes": draw(st.integers(1, 3)),
    }
    if envs:
        task["envs"] = envs
    if secrets:
        task["secrets"] = secrets
    if draw(st.booleans()):
        task["setup"] = draw(TEXT) or "true"
    if draw(st.booleans()):
        task["resources"] = {"disk_size": draw(st.integers(50, 500))}
    offers = draw(
        st.lists(
            st.tuples(st.sampled_from(sorted(REGIONS)), st.integers(0, 1), st.sampled_from(gpus), st.booleans()),
            min_size=1,
            max_size=10,
        )
    )
    plan = Plan(
        candidates=tuple(candidate(c, REGIONS[c][r], g, gpu_count, spot=s) for c, r, g, s in offers), objective="cost"
    )
    return parse_spec(task), plan, secrets


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=specs_and_plans())
def test_generated_specs_render_to_yaml_skypilot_accepts(drawn, sky):
    spec, plan, secrets = drawn
    task = render_task(
        spec, plan, settings=settings_for(spec), task_dir=WORKDIR, install=RuntimeInstall(source_dir=str(REPO))
    )
    text = to_yaml(task)
    parsed = sky_accepts(sky, task)

    assert "instance_type" not in text and "skygreen:" not in text
    recovery = task["resources"]["job_recovery"]
    assert recovery == {
        "strategy": spec.green.recovery.strategy,
        "max_restarts_on_errors": spec.green.recovery.max_restarts_on_errors,
        "recover_on_exit_codes": [PREEMPTED_EXIT_CODE],
    }
    ordered = task["resources"]["ordered"]
    assert 1 <= len(ordered) <= spec.green.max_candidates
    assert len({json.dumps(e, sort_keys=True) for e in ordered}) == len(ordered)
    first = plan.candidates[0]
    assert ordered[0]["infra"] == f"{first.cloud}/{first.region}"
    assert len(list(parsed.resources)) == len(ordered)
    assert parsed.envs["SKYGREEN_RUN_ID"] == "demo-20260101-000000-abcd"
    assert parsed.num_nodes == spec.num_nodes
    for name, value in secrets.items():
        assert task["secrets"][name] is None
        if value is not None:
            assert value not in text
    for name, value in dict(spec.sky.get("envs") or {}).items():
        assert parsed.envs[name] == value


# ---------------------------------------------------------------- the shell, run for real


def run_script(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@settings(max_examples=25, deadline=None)
@given(args=ARGS)
def test_run_script_passes_the_users_arguments_through_unchanged(args):
    program = "import json, sys; print(json.dumps(sys.argv[1:]))"
    spec = spec_of(run=f"{shlex.quote(sys.executable)} -c {shlex.quote(program)} {shlex.join(args)}")
    task = render_task(spec, None, settings=settings_for(spec), task_dir=WORKDIR)
    out = run_script(task["run"], dict(os.environ), WORKDIR)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == args


@settings(max_examples=15, deadline=None)
@given(args=ARGS)
def test_several_gpus_start_torchrun_with_skypilots_node_layout(args, tmp_path_factory):
    bin_dir = tmp_path_factory.mktemp("bin")
    fake = bin_dir / "torchrun"  # records its argv instead of starting workers
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    spec = spec_of(skygreen={"gpu_count": 4}, num_nodes=2, run="python -u train.py " + shlex.join(args))
    plan = Plan(candidates=(candidate("aws", "us-east-1", "A100", 4),), objective="cost")
    task = render_task(spec, plan, settings=settings_for(spec), task_dir=WORKDIR)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SKYPILOT_NUM_NODES="2",
               SKYPILOT_NODE_RANK="1", SKYPILOT_NUM_GPUS_PER_NODE="4", SKYPILOT_NODE_IPS="10.0.0.7\n10.0.0.8")  # fmt: skip
    out = run_script(task["run"], env, WORKDIR)
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)
    assert argv[:5] == [
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=4",
        "--master_addr=10.0.0.7",
        "--master_port=29500",
    ]
    assert argv[5:] == ["-u", "train.py", *args]


def test_sigterm_during_the_run_exits_with_the_preempted_code():
    """A signal to the job (a spot reclaim, a cancel) ends the script with the code SkyPilot
    is told to recover on, even when the training process dies of the signal itself."""
    spec = spec_of(run="echo started; exec sleep 300")
    task = render_task(spec, None, settings=settings_for(spec), task_dir=WORKDIR)
    proc = subprocess.Popen(["bash", "-c", task["run"]], cwd=WORKDIR, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        # gate: the command runs, so the script's trap is in place (a fixed sleep may not be enough)
        assert proc.stdout.readline() == "started\n"
        proc.terminate()
        assert proc.wait(timeout=120) == PREEMPTED_EXIT_CODE
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_a_failing_command_keeps_its_exit_code():
    spec = spec_of(run="exit 3")
    task = render_task(spec, None, settings=settings_for(spec), task_dir=WORKDIR)
    assert run_script(task["run"], dict(os.environ), WORKDIR).returncode == 3


def test_setup_installs_the_runtime_then_runs_the_users_setup_quoted():
    spec = spec_of(setup="echo 'it''s' \"$HOME\"")
    plan = Plan(candidates=(candidate("gcp", "us-central1", "L4"),), objective="cost")
    released = render_task(spec, plan, settings=settings_for(spec), task_dir=WORKDIR)
    assert 'python -m pip install --quiet --upgrade-strategy only-if-needed "$@"' in released["setup"]
    assert f"skygreen_pip --no-deps skygreen=={__version__}\n" in released["setup"]
    requirements = " ".join(shlex.quote(r) for r in container_requirements())
    assert f"skygreen_pip {requirements}\n" in released["setup"]
    # A fresh image installs the bucket's client before the rest, so that the prefetch can start.
    assert "skygreen_pip 'boto3>=1.28'\n    skygreen_prefetch\n" in released["setup"]
    for bucket, first in (
        ("gs://b/runs", "skygreen_pip 'google-cloud-storage>=2.14'"),
        ("az://acct/ckpts/runs", "skygreen_pip 'azure-storage-blob>=12.19' 'azure-identity>=1.15'"),
        ("/tmp/b", ":  # a local"),
    ):
        settings = RuntimeSettings.from_spec(spec.green, run_id="demo-20260101-000000-abcd", bucket=bucket)
        other = render_task(spec, plan, settings=settings, task_dir=WORKDIR)["setup"]
        assert other.index(first) < other.index("    skygreen_prefetch\n") and "skygreen_pip 'boto3" not in other
    assert "bash -c " + shlex.quote(spec.sky["setup"]) in released["setup"]
    from_source = render_task(
        spec, plan, settings=settings_for(spec), task_dir=WORKDIR, install=RuntimeInstall(source_dir=str(REPO))
    )
    assert from_source["file_mounts"] == {"~/.skygreen/src": str(REPO)}
    assert 'skygreen_pip --no-deps "$HOME/.skygreen/src"' in from_source["setup"]
    subprocess.run(["bash", "-n", "-c", from_source["setup"]], check=True)


def test_the_vm_installs_the_runtime_extra_without_the_laptop_side():
    names = {re.split(r"[<>=!~\[]", r, maxsplit=1)[0].lower() for r in container_requirements()}
    assert {"torch", "numpy", "boto3", "google-cloud-storage", "azure-storage-blob", "nvidia-ml-py", "pyyaml"} <= names
    assert not names & set(LAPTOP_ONLY)


def test_an_azure_bucket_installs_the_azure_extra_on_the_vm():
    """What setup installs for an az:// bucket's managed identity is the `azure` extra's pin."""
    from importlib.metadata import requires

    from skygreen.launch.render import AZURE_IDENTITY

    azure_extra = [r.split(";")[0].strip() for r in requires("skygreen") or [] if 'extra == "azure"' in r]
    assert azure_extra == [AZURE_IDENTITY]


def test_requirement_lines_are_read_as_pip_reads_them():
    """Spacing, quoting, name case, extras and environment markers of `Requires-Dist` lines:
    the runtime extra's requirements (markers dropped), base ones unless laptop-only."""
    from skygreen.launch.render import runtime_requirements

    declared = [
        "Rich >= 13",  # laptop-only, whatever its case and spacing
        "Click>=8.0",
        "PyYAML>=6",
        "torch >= 2.4 ; extra == 'runtime'",
        'numpy>=1.24; python_version >= "3.8" and extra == "runtime"',
        "boto3[crt]>=1.28;extra=='runtime'",
        "datasets>=2.19; extra == 'tasks'",
        'tomli>=2; python_version < "3.0"',  # a base requirement for another interpreter
        'matplotlib>=3.7; extra == "report"',
    ]
    assert runtime_requirements(declared) == ("PyYAML>=6", "torch>=2.4", "numpy>=1.24", "boto3[crt]>=1.28")


def test_the_runtime_imports_nothing_the_vm_does_not_install():
    """What training imports in the container (runtime, stores, settings) loads no laptop-only
    package, so installing skygreen with --no-deps plus `container_requirements()` suffices."""
    code = (
        "import sys, skygreen.runtime.run, skygreen.runtime.checkpointer, skygreen.runtime.smoke_mode, "
        "skygreen.checkpoint.s3_store, skygreen.checkpoint.gcs_store, skygreen.checkpoint.local_store, "
        "skygreen.task.settings\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert not loaded & {"sky", "click", "rich"}


# ---------------------------------------------------------------- errors, with the fix


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ({"resources": {"accelerators": "A100:1"}}, "resources.accelerators"),
        ({"resources": {"use_spot": False}}, "resources.use_spot"),
        ({"resources": {"job_recovery": "FAILOVER"}}, "resources.job_recovery"),
        ({"envs": {"SKYGREEN_RUN_ID": "mine"}}, "envs.SKYGREEN_RUN_ID"),
        ({"envs": {"TOKEN": None}}, "envs.TOKEN"),
        ({"skygreen": {"gpu_count": 2}, "run": "cd src\npython train.py"}, "run"),
        ({"skygreen": {"gpu_count": 2}, "run": "./train.sh"}, "run"),
    ],
)
def test_what_skygreen_owns_or_cannot_run_is_a_clear_spec_error(task, field):
    spec = spec_of(**task)
    plan = Plan(candidates=(candidate("aws", "us-east-1", "A100", spec.green.gpu_count),), objective="cost")
    with pytest.raises(SpecError) as caught:
        render_task(spec, plan, settings=settings_for(spec), task_dir=WORKDIR)
    assert caught.value.field == field
    assert "fix:" in str(caught.value)


def test_a_command_that_calls_torchrun_itself_is_left_alone():
    spec = spec_of(skygreen={"gpu_count": 2}, run="torchrun --nproc_per_node=2 train.py")
    plan = Plan(candidates=(candidate("aws", "us-east-1", "A100", 2),), objective="cost")
    task = render_task(spec, plan, settings=settings_for(spec), task_dir=WORKDIR)
    assert "skygreen_command='torchrun --nproc_per_node=2 train.py'" in task["run"]


# ---------------------------------------------------------------- secrets


def test_secret_values_come_from_the_environment_and_stay_out_of_the_yaml():
    spec = spec_of(secrets={"WANDB_API_KEY": None, "HF_TOKEN": "file-value-4711", "secrets:ORG_KEY": None})
    assert declared_secrets(spec) == ("WANDB_API_KEY", "HF_TOKEN", "secrets:ORG_KEY")
    values = secret_values(spec, {"WANDB_API_KEY": "env-value-0815"})
    assert values == {"WANDB_API_KEY": "env-value-0815", "HF_TOKEN": "file-value-4711"}
    task = render_task(spec, None, settings=settings_for(spec), task_dir=WORKDIR)
    assert task["secrets"] == {"WANDB_API_KEY": None, "HF_TOKEN": None, "secrets:ORG_KEY": None}
    assert "file-value-4711" not in to_yaml(task)


# ---------------------------------------------------------------- packaging


def test_templates_ship_inside_the_built_wheel(tmp_path):
    """`templates/` reaches installed packages through the `skygreen/templates` link."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "skygreen", src / "skygreen", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "templates", src / "templates")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    import zipfile

    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (REPO / "templates").iterdir():
        assert f"skygreen/templates/{template.name}" in names


# ---------------------------------------------------------------- fallbacks across GPU counts


def sharded_catalog():
    from skygreen.plan.catalog import Catalog, Offer

    def offer(cloud: str, region: str, gpu: str, count: int, spot_price: float) -> Offer:
        return Offer(
            cloud=cloud, region=region, instance_type=f"{gpu.lower()}-{count}", accelerator=gpu,
            accelerator_count=count, on_demand_price_usd_per_hour=spot_price * 3, spot_price_usd_per_hour=spot_price,
        )  # fmt: skip

    offers = (
        offer("aws", "us-east-1", "A100", 8, 10.0),  # 14 GB per GPU: the cheapest run
        offer("gcp", "us-central1", "A100-80GB", 4, 9.0),  # 28 GB per GPU
        offer("azure", "eastus", "H100", 8, 30.0),
        offer("gcp", "us-central1", "A100-80GB", 1, 3.0),  # holds 7B only on 2 nodes
        offer("aws", "us-east-1", "L4", 1, 0.1),  # never holds it on up to 4 nodes
        offer("aws", "us-east-1", "A100", 2, 4.0),  # 28 GB per GPU on 2 nodes
        offer("azure", "eastus", "T4", 1, 0.05),  # neither
    )
    return Catalog(offers=offers, source="test", regions={cloud: tuple(names) for cloud, names in REGIONS.items()})


def test_a_sharded_model_renders_fallbacks_with_other_gpu_counts_that_skypilot_accepts(sky):
    from skygreen.plan.rank import make_plan

    spec = spec_of(
        name="llm",
        skygreen={
            "model": {"params": "7B", "sharding": "fsdp"},
            "batch": {"effective": 48},
            "work": {"gpu_hours": 800},
        },
    )
    plan = make_plan(spec, sharded_catalog())
    task = render_task(spec, plan, settings=settings_for(spec), task_dir=WORKDIR)
    ordered = task["resources"]["ordered"]
    # One node: the winner and its fallbacks of another GPU type and count, in the plan's order;
    # the 2-node shapes cannot share a task whose num_nodes is 1; the L4 and T4 cannot hold it.
    assert plan.best.num_nodes == 1 and "num_nodes" not in task
    assert [e["accelerators"] for e in ordered] == [
        f"{c.accelerator}:{c.accelerator_count}" for c in plan.candidates if c.num_nodes == 1
    ]
    assert {e["accelerators"] for e in ordered} == {"A100:8", "A100-80GB:4", "H100:8"}
    assert {(c.accelerator, c.num_nodes) for c in plan.candidates if c.num_nodes == 2} == {
        ("A100", 2),
        ("A100-80GB", 2),
    }
    assert not {c.accelerator for c in plan.candidates} & {"L4", "T4"}
    assert "torchrun" in task["run"] and "SKYPILOT_NUM_GPUS_PER_NODE" in task["run"]
    assert task["envs"]["SKYGREEN_EFFECTIVE_BATCH"] == "48"  # every count keeps the effective batch
    parsed = sky_accepts(sky, task)
    assert parsed.num_nodes == 1
    assert sorted(str(r.accelerators) for r in parsed.resources) == sorted(
        str({gpu: count}) for gpu, count in (("A100", 8), ("A100-80GB", 4), ("H100", 8))
    )


def test_a_model_that_needs_two_nodes_renders_num_nodes_two(sky):
    from skygreen.plan.rank import make_plan

    spec = spec_of(name="llm", skygreen={"model": {"params": "7B"}, "gpus": ["A100-80GB"], "gpu_count": 1})
    plan = make_plan(spec, sharded_catalog())
    assert (plan.best.accelerator_count, plan.best.num_nodes) == (1, 2)
    task = render_task(spec, plan, settings=settings_for(spec), task_dir=WORKDIR)
    assert task["num_nodes"] == 2
    assert task["resources"]["ordered"] == [
        {"infra": "gcp/us-central1", "accelerators": "A100-80GB:1", "use_spot": True}
    ]
    assert "torchrun" in task["run"]
    assert sky_accepts(sky, task).num_nodes == 2


def test_a_bucket_set_lists_the_picks_bucket_places_first_then_keeps_max_candidates():
    """EAGER_NEXT_REGION relaunches at the first entry outside the preempted region: with a bucket
    per cloud the places of the pick's bucket come right after it, even from below the cut."""
    buckets = {"aws": "s3://team", "azure": "az://acct/team"}
    spec = spec_of(skygreen={"checkpoint": {"buckets": buckets}, "max_candidates": 3})
    offers = [("aws", "us-east-1", 1.0), ("azure", "eastus", 1.1), ("azure", "westus2", 1.2), ("aws", "us-east-2", 1.3)]
    plan = Plan(candidates=tuple(candidate(c, r, "A100", price=p) for c, r, p in offers), objective="cost")
    task = render_task(spec, plan, settings=settings_for(spec), task_dir=WORKDIR)
    infra = [entry["infra"] for entry in task["resources"]["ordered"]]
    assert infra == ["aws/us-east-1", "aws/us-east-2", "azure/eastus"]
    one = spec_of(skygreen={"checkpoint": {"bucket": "s3://team"}, "max_candidates": 3})
    task = render_task(one, plan, settings=settings_for(one), task_dir=WORKDIR)
    assert [entry["infra"] for entry in task["resources"]["ordered"]] == [
        "aws/us-east-1",
        "azure/eastus",
        "azure/westus2",
    ]
