"""Plans that fit the model in memory: the task's `model:` section, the memory each GPU needs
(checked against the ZeRO paper's published figures), offers that cannot hold the model dropped
with the smallest one that can named, GPU and node counts chosen to fit, and the checkpoint's
size in the save, the interval and the restart."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skygreen.checkpoint.interval import optimal_interval_s
from skygreen.errors import NoOfferError, SpecError
from skygreen.gpus import GPUS
from skygreen.memory.estimate import gathered_bytes
from skygreen.plan.catalog import Catalog, load_catalog
from skygreen.plan.cost import DEFAULT_RESTART_S, HOST_COPY_GB_PER_S, RunModel, checkpoint_cost, estimate
from skygreen.plan.memory import bytes_per_param, checkpoint_gb, fits, memory_need, smallest_nodes
from skygreen.plan.rank import Plan, make_plan
from skygreen.task.spec import PRECISIONS, ModelSpec, TaskSpec, parse_spec_text

FIXTURE_CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
SEVEN_B = "{params: 7e9, sharding: fsdp}"


def spec(section: str, *, num_nodes: int | None = None) -> TaskSpec:
    nodes = f"num_nodes: {num_nodes}\n" if num_nodes is not None else ""
    return parse_spec_text(f"{nodes}skygreen: {section}\nrun: python train.py\n")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(FIXTURE_CATALOG, env={})


def plan_of(catalog: Catalog, section: str, **kw) -> Plan:
    return make_plan(spec(section, **kw), catalog)


# ---------------------------------------------------------------- the ZeRO paper's figures


@pytest.mark.parametrize("precision", PRECISIONS)
def test_adamw_needs_16_bytes_per_parameter_at_every_precision(precision):
    # ZeRO (Rajbhandari et al., SC'20, arXiv 1910.02054) section 3.1: mixed-precision Adam holds
    # 2 + 2 + K bytes per parameter with K = 12 (fp32 weights, momentum, variance): 16 in all.
    assert bytes_per_param(precision) == 16


def test_memory_per_gpu_matches_the_zero_papers_7_5b_model_on_64_gpus():
    # ZeRO, Figure 1 and section 5: a 7.5B-parameter model on Nd = 64 GPUs needs 120 GB per GPU
    # for its model states under plain data parallelism, and 16 x Psi / Nd = 1.875 GB ("1.9 GB")
    # with stage 3 (P_os+g+p).
    model = ModelSpec(params=7.5e9, sharding="ddp")
    assert memory_need(model, precision="fp16", total_gpus=64).states == pytest.approx(120.0)
    sharded = ModelSpec(params=7.5e9, sharding="fsdp")
    # FSDP also holds the gathered unit whole (DeepSpeed's 4 x largest layer), beside the paper's shard.
    gathered = gathered_bytes(None, 7.5e9, "fp16") / 1e9
    assert memory_need(sharded, precision="fp16", total_gpus=64).states - gathered == pytest.approx(1.875)
    assert round(memory_need(sharded, precision="bf16", total_gpus=64).states - gathered, 1) == 1.9


def test_activations_come_on_top_of_the_shard_and_are_not_sharded():
    model = ModelSpec(params=7e9, sharding="fsdp", activation_gb=6.0)
    need = memory_need(model, precision="bf16", total_gpus=8)
    assert need.states == pytest.approx(14.0 + gathered_bytes(None, 7e9, "bf16") / 1e9)
    assert need.activations == pytest.approx(6.0) and need.logits == 0.0
    assert need.low < need.total < need.high
    assert fits(need, 26.6) and not fits(need, 26.4)  # the high end: 20.9 GB of tensors + 15% + 1.5 + 1.0
    with pytest.raises(ValueError, match="total_gpus"):
        memory_need(model, precision="bf16", total_gpus=0)


def test_the_fewest_nodes_that_hold_a_7b_model():
    model = ModelSpec(params=7e9, sharding="fsdp")  # 112 GB of state
    assert smallest_nodes(model, precision="bf16", gpu_memory_gb=80, gpus_per_node=1) == 2  # 56 GB each
    assert smallest_nodes(model, precision="bf16", gpu_memory_gb=40, gpus_per_node=8) == 1  # 14 GB each
    assert smallest_nodes(model, precision="bf16", gpu_memory_gb=24, gpus_per_node=1) is None  # 4 x 28 GB
    eight = ModelSpec(params=7e9, sharding="fsdp", max_nodes=8)
    assert smallest_nodes(eight, precision="bf16", gpu_memory_gb=24, gpus_per_node=1) == 7  # 16 GB + a unit each
    whole = ModelSpec(params=7e9, sharding="ddp")
    assert smallest_nodes(whole, precision="bf16", gpu_memory_gb=80, gpus_per_node=8) is None
    assert smallest_nodes(whole, precision="bf16", gpu_memory_gb=141, gpus_per_node=1) == 1  # an H200 holds 112 GB
    capped = ModelSpec(params=7e9, sharding="fsdp", max_nodes=4)
    assert smallest_nodes(capped, precision="bf16", gpu_memory_gb=24, gpus_per_node=1) is None


def test_checkpoint_size_is_fp32_weights_and_two_moments():
    model = ModelSpec(params=7e9, sharding="fsdp")
    assert checkpoint_gb(model) == pytest.approx(84.0)  # 12 bytes per parameter
    assert checkpoint_gb(model, half_precision="bf16") == pytest.approx(70.0)


# ---------------------------------------------------------------- the task file


def test_model_section_reads_counts_with_suffixes_and_defaults_sharding_by_size():
    assert spec("{model: {params: 7B}}").green.model == ModelSpec(params=7e9, sharding="fsdp", max_nodes=4)
    assert spec("{model: {params: 7B}}").green.model.method.kind == "full"
    small = spec("{model: {params: 350M, activation_gb: 3}}").green.model
    assert small == ModelSpec(params=3.5e8, activation_gb=3.0, sharding="ddp")
    assert spec("{model: {params: 1.5e9, sharding: ddp, max_nodes: 2}}").green.model == ModelSpec(
        params=1.5e9, sharding="ddp", max_nodes=2
    )
    assert spec("{}").green.model is None


@pytest.mark.parametrize(
    ("section", "field", "words"),
    [
        ("{model: {activation_gb: 2}}", "skygreen.model.params", "is required"),
        ("{model: {params: 7X}}", "skygreen.model.params", "expected a parameter count"),
        ("{model: {params: 0}}", "skygreen.model.params", "greater than 0"),
        ("{model: {params: 7e9, sharding: zero3}}", "skygreen.model.sharding", "unknown value"),
        ("{model: {params: 7e9, shard: fsdp}}", "skygreen.model.shard", "unknown key"),
        ("{model: {params: 7e9, activation_gb: -1}}", "skygreen.model.activation_gb", ""),
        ("{model: {params: 7e9, max_nodes: 0}}", "skygreen.model.max_nodes", ""),
        ("{model: 7e9}", "skygreen.model", "mapping"),
    ],
)
def test_bad_model_sections_name_the_field(section, field, words):
    with pytest.raises(SpecError) as info:
        spec(section)
    assert info.value.field == field
    assert words in str(info.value)


# ---------------------------------------------------------------- the plan


def test_a_7b_task_gets_no_offer_that_cannot_hold_it(catalog):
    plan = plan_of(catalog, f"{{model: {SEVEN_B}, on_demand_fallback: true}}")
    for c in plan.candidates:
        assert c.memory_per_gpu_gb is not None
        assert c.memory_per_gpu_gb <= GPUS[c.accelerator].memory_gb
        assert c.memory_gb_per_gpu is not None and c.memory_per_gpu_gb == c.memory_gb_per_gpu["high"]
        assert c.memory_gb_per_gpu["states"] >= 112.0 / (c.accelerator_count * c.num_nodes)
        # a 7B full fine-tune is never offered fewer than 112 GB of GPU memory in all
        assert GPUS[c.accelerator].memory_gb * c.accelerator_count * c.num_nodes >= 112.0
    shapes = {(c.accelerator, c.accelerator_count, c.num_nodes) for c in plan.candidates}
    assert ("A100", 8, 1) in shapes  # 14 GB per GPU on one p4d node
    assert ("H100", 1, 2) in shapes and ("A100-80GB", 1, 2) in shapes  # two 80 GB nodes
    assert ("A100", 1, 4) in shapes  # 28.9 GB of states on each of four 40 GB GPUs, 36.2 GB at the high end
    # 24 GB GPUs and smaller would need more than the default 4 nodes.
    assert not {gpu for gpu, _, _ in shapes} & {"L4", "A10G", "A10", "T4", "V100"}
    # Without the model the same catalog ranks single GPUs that could not hold it.
    assert plan_of(catalog, "{on_demand_fallback: true}").best.accelerator_count == 1


def test_dropped_offers_are_counted_and_the_smallest_that_fits_is_named(catalog):
    plan = plan_of(catalog, f"{{model: {SEVEN_B}}}")
    notice = next(n for n in plan.notices if n.startswith("dropped"))
    assert notice.startswith("dropped 11 offers that cannot hold the model;")
    assert "the smallest that holds it is" in notice and "GB per GPU" in notice


def test_no_offer_for_a_model_too_big_names_the_memory_and_the_smallest_fit(catalog):
    with pytest.raises(NoOfferError) as info:
        plan_of(catalog, "{model: {params: 7e9, sharding: fsdp}, gpus: [L4], gpu_count: 1}")
    message = str(info.value)
    assert "7e+09 parameters, full with adamw under FSDP, 112 GB of weights, gradients and optimizer states" in message
    assert "the smallest that holds it is" in message
    with pytest.raises(NoOfferError) as info:
        plan_of(catalog, "{model: {params: 7e10, sharding: ddp}}")
    assert "no offer in the catalog holds it on up to 4 nodes" in str(info.value)


def test_the_tasks_own_num_nodes_is_kept(catalog):
    plan = plan_of(catalog, f"{{model: {SEVEN_B}}}", num_nodes=2)
    assert {c.num_nodes for c in plan.candidates} == {2}
    assert all(c.memory_per_gpu_gb <= GPUS[c.accelerator].memory_gb for c in plan.candidates)


def test_shapes_that_do_not_split_the_effective_batch_are_left_out(catalog):
    plan = plan_of(catalog, f"{{model: {SEVEN_B}, batch: {{effective: 6}}}}")
    assert plan.candidates and all(6 % (c.accelerator_count * c.num_nodes) == 0 for c in plan.candidates)


def test_assumptions_and_json_give_memory_per_gpu(catalog):
    plan = plan_of(catalog, f"{{model: {SEVEN_B}}}")
    line = plan.assumptions[-1]
    assert line.startswith("model: 7e+09 parameters, full fine-tune, adamw in auto precision")
    assert f"{plan.best.memory_per_gpu_gb:.3g} GB per GPU on the best offer" in line
    assert "checkpoint 84 GB at 0.25 GB/s per node (the default)" in line
    doc = plan.to_json()
    assert doc["candidates"][0]["memory_per_gpu_gb"] == plan.best.memory_per_gpu_gb
    assert doc["candidates"][0]["restart_s"] > DEFAULT_RESTART_S


# ---------------------------------------------------------------- checkpoint size in the cost model


def test_save_and_restore_times_follow_the_checkpoint_size_and_the_rate():
    model = RunModel(work_gpu_hours=100, checkpoint_gb=84.0, checkpoint_sharded=True, num_nodes=2)
    cost = checkpoint_cost(model, 4)
    assert cost.blocking_s == pytest.approx(84.0 / 8 / HOST_COPY_GB_PER_S)  # each GPU copies its shard
    assert cost.upload_s == pytest.approx(84.0 / (0.25 * 2))  # every node uploads its own shards
    assert cost.restart_s == pytest.approx(DEFAULT_RESTART_S + 84.0 / (0.25 * 2))
    measured = RunModel(work_gpu_hours=100, checkpoint_gb=84.0, upload_gb_per_s=1.0, download_gb_per_s=2.0)
    whole = checkpoint_cost(measured, 8)  # DDP: one node holds the whole checkpoint
    assert whole.upload_s == pytest.approx(84.0) and whole.restore_s == pytest.approx(42.0)
    assert whole.blocking_s == pytest.approx(84.0 / HOST_COPY_GB_PER_S)
    flat = checkpoint_cost(RunModel(work_gpu_hours=1), 1)
    assert (flat.blocking_s, flat.upload_s, flat.restart_s) == (10.0, 0.0, DEFAULT_RESTART_S)


def test_a_bigger_checkpoint_lengthens_the_interval_and_the_restart():
    small = RunModel(work_gpu_hours=100, checkpoint_gb=1.0, checkpoint_sharded=True)
    big = RunModel(work_gpu_hours=100, checkpoint_gb=84.0, checkpoint_sharded=True)
    est_small = estimate(small, cloud="aws", gpu="A100", gpus_per_node=8, spot=True)
    est_big = estimate(big, cloud="aws", gpu="A100", gpus_per_node=8, spot=True)
    assert est_small is not None and est_big is not None
    assert est_big.checkpoint_interval_s is not None and est_small.checkpoint_interval_s is not None
    # The interval is never shorter than one upload (84 GB at 0.25 GB/s = 336 s), nor than Daly's.
    assert est_big.checkpoint_interval_s >= 84.0 / 0.25
    mtbf_s = 3600.0 / big.preemption_rate_per_hour["aws"]
    assert est_big.checkpoint_interval_s >= optimal_interval_s(est_big.checkpoint_save_s, mtbf_s) - 1e-6
    assert est_big.restart_s == pytest.approx(DEFAULT_RESTART_S + 336.0)
    assert est_big.est_hours > est_small.est_hours


def test_a_fixed_interval_shorter_than_an_upload_pays_the_wait():
    model = RunModel(work_gpu_hours=10, checkpoint_gb=84.0, checkpoint_interval_s=60.0)
    est = estimate(model, cloud="aws", gpu="A100", gpus_per_node=8, spot=False)
    assert est is not None
    assert est.checkpoint_save_s == pytest.approx(84.0 / 0.25 - 60.0)  # waits for the upload
    assert est.est_hours == pytest.approx(est.compute_hours * (1 + est.checkpoint_save_s / 60.0))


def test_a_measured_transfer_rate_shortens_the_restart_in_the_plan(catalog):
    task = spec(f"{{model: {SEVEN_B}}}")
    default = make_plan(task, catalog).best
    fast = make_plan(task, catalog, measured_transfer_gb_per_s=2.5)
    assert fast.best.restart_s < default.restart_s
    assert "measured by earlier runs of this task" in fast.assumptions[-1]


# ---------------------------------------------------------------- the command


def test_plan_json_from_the_command_gives_memory_per_gpu_and_drops_what_cannot_hold_it(tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text("name: t\nskygreen: {model: {params: 7B, activation_gb: 4}}\nrun: python train.py\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_"))}
    env.update(HOME=str(tmp_path), COLUMNS="200")
    argv = [sys.executable, "-m", "skygreen.cli", "plan", str(path), "--catalog", str(FIXTURE_CATALOG)]
    out = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["candidates"]
    for c in doc["candidates"]:
        memory = c["memory_gb_per_gpu"]
        assert set(memory) == {"states", "activations", "logits", "overhead", "low", "high"}
        assert memory["activations"] == 4 and c["memory_per_gpu_gb"] == memory["high"]
        assert memory["states"] >= 112.0 / (c["accelerator_count"] * c["num_nodes"])
        assert memory["low"] <= memory["high"] <= GPUS[c["accelerator"]].memory_gb
    assert any(line.startswith("model: 7e+09 parameters") for line in doc["assumptions"])
    text = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert text.returncode == 0, text.stderr
    assert "GB per GPU on the best offer" in " ".join((text.stdout + text.stderr).split())
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nskygreen: {model: {params: lots}}\nrun: python train.py\n")
    err = subprocess.run([*argv[:-3], str(bad), *argv[-2:]], capture_output=True, text=True, env=env, timeout=120)
    assert err.returncode == 2 and "skygreen.model.params" in err.stderr and "Traceback" not in err.stderr
    assert math.isfinite(doc["candidates"][0]["est_cost_usd"])


def plan_text(tmp_path: Path, section: str, *args: str, columns: int | None) -> str:
    path = tmp_path / "task.yaml"
    path.write_text(f"name: t\nskygreen: {section}\nrun: python train.py\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_", "COLUMNS"))}
    env.update(HOME=str(tmp_path), **({"COLUMNS": str(columns)} if columns else {}))
    argv = [sys.executable, "-m", "skygreen.cli", "plan", str(path), "--catalog", str(FIXTURE_CATALOG), *args]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def headings_and_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """The first table's column headings (header lines joined) and the body rows of every table."""
    header = [line for line in text.splitlines() if line.startswith("┃")]
    first = header[: next(i for i, line in enumerate(header) if line.lstrip("┃ ").startswith("#")) + 1]
    cells = [[cell.strip() for cell in line.strip("┃").split("┃")] for line in first]
    headings = [" ".join(part for part in column if part) for column in zip(*cells, strict=True)]
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]
    return headings, rows


def test_the_plan_table_shows_memory_per_gpu_when_the_task_has_a_model(tmp_path):
    section = "{model: {params: 7B, activation_gb: 4}, work: {gpu_hours: 100, gpu: A100}}"
    candidates = json.loads(plan_text(tmp_path, section, "--json", columns=None))["candidates"]
    text = plan_text(tmp_path, section, "--top", "10", columns=120)
    assert max(len(line) for line in text.splitlines()) <= 120
    headings, rows = headings_and_rows(text)
    column = headings.index("mem GB/GPU")
    shown = min(10, len(candidates))
    for row, c in zip(rows[:shown], candidates[:shown], strict=True):
        assert row[column] == f"{c['memory_per_gpu_gb']:.3g}", (row, c)  # differs by GPU count: 60, 18, 32, ...
    assert len({row[column] for row in rows[:shown]}) > 1
    # too narrow for it: left out whole and named, like any other column; stacked offers still say it
    narrow = plan_text(tmp_path, section, columns=80)
    assert "mem GB/GPU" not in " ".join(headings_and_rows(narrow)[0])
    assert "Not shown at 80 columns:" in narrow and "mem" in narrow.split("Not shown", 1)[1].split("(")[0]
    stacked = plan_text(tmp_path, section, "--top", "1", columns=40)
    assert f"{candidates[0]['memory_per_gpu_gb']:.3g} GB per GPU" in " ".join(stacked.split())
    # a task without a model has no such column
    plain, _ = headings_and_rows(plan_text(tmp_path, "{work: {gpu_hours: 100, gpu: A100}}", columns=200))
    assert "mem GB/GPU" not in plain and "CO2e kg" in plain
