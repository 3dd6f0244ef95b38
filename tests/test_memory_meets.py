"""The plan's memory estimate travels to the runtime and meets the peak it measures in the ledger:
the record and its variable, the estimate `up` hands over (the plan's own figures), the runtime's
measure on CPU, the segment that carries both, and `status` showing them side by side. A real
local run that records both is in tests/test_changeover.py (the kill -9 run)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from skygreen.errors import RuntimeSetupError
from skygreen.launch.report import print_status_detail
from skygreen.launch.status import RunStatus, memory_view
from skygreen.ledger.records import Place, Segment
from skygreen.memory.planned import PlannedMemory
from skygreen.plan.catalog import load_catalog
from skygreen.plan.memory import planned_memory
from skygreen.plan.rank import make_plan
from skygreen.runtime.peak_memory import CPU_MEASURE, HostPeak, PeakWindow, resident_tensor_bytes
from skygreen.task.settings import RuntimeSettings
from skygreen.task.spec import parse_spec_text

FIXTURE_CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
LORA_7B = "{params: 7e9, method: lora, seq_len: 2048}"


def test_the_estimate_travels_as_one_variable_and_a_bad_one_is_named():
    planned = PlannedMemory(low_gb=15.2, high_gb=19.75, tensors_gb=14.1, gpus=2)
    env = RuntimeSettings(run_id="r", bucket="/b", memory_planned_gb=planned).to_env()
    assert env["SKYGREEN_MEMORY_PLANNED_GB"] == "low=15.2,high=19.75,tensors=14.1,gpus=2"
    assert RuntimeSettings.from_env(env).memory_planned_gb == planned
    assert planned.to_json() == {"low": 15.2, "high": 19.75, "tensors": 14.1, "gpus": 2}
    for text, words in [
        ("low=2,high=1,tensors=1,gpus=1", "above high"),
        ("low=1,high=2,tensors=1", "gpus= is missing"),
        ("low=1,high=2,tensors=x,gpus=1", "not a number"),
        ("low=1,high=2,tensors=1,gpus=1,mid=3", "expected low=N,high=N,tensors=N,gpus=N"),
    ]:
        with pytest.raises(RuntimeSetupError, match="SKYGREEN_MEMORY_PLANNED_GB") as caught:
            RuntimeSettings.from_env({**env, "SKYGREEN_MEMORY_PLANNED_GB": text})
        assert words in str(caught.value)


def test_up_hands_over_the_plans_own_figures_for_its_first_offers_gpus():
    spec = parse_spec_text(f"skygreen: {{gpus: [L4, A10G], model: {LORA_7B}}}\nrun: python train.py\n")
    plan = make_plan(spec, load_catalog(FIXTURE_CATALOG, env={}))
    best = plan.candidates[0]
    planned = planned_memory(spec.green.model, precision=spec.green.precision, total_gpus=best.accelerator_count)
    assert planned is not None and best.memory_gb_per_gpu is not None
    shown = best.memory_gb_per_gpu
    assert (planned.low_gb, planned.high_gb) == (shown["low"], shown["high"])
    assert planned.tensors_gb == pytest.approx(shown["states"] + shown["activations"] + shown["logits"], abs=2e-3)
    assert planned.gpus == best.accelerator_count
    bare = parse_spec_text("skygreen: {gpus: [L4]}\nrun: python train.py\n")
    assert planned_memory(bare.green.model, precision="auto", total_gpus=1) is None


@pytest.mark.skipif(not HostPeak.available(), reason="needs /proc/self/clear_refs (Linux)")
def test_on_cpu_the_window_measures_resident_tensors_plus_what_its_steps_allocate():
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    params = 256 * 256 + 256
    resident = 4 * params * 4 + 2 * 4  # weights, gradients, two moments; a step count per parameter
    assert resident_tensor_bytes(model, optimizer) == resident

    window = PeakWindow(HostPeak(lambda: resident_tensor_bytes(model, optimizer)), steps=2)
    window.before_step(ready=False)  # still probing: not open
    assert window.after_step() is None and not window.done
    window.before_step(ready=True)
    big = torch.ones(50_000_000)  # 200 MB touched inside the window, then freed
    big.add_(1.0)
    del big
    assert window.after_step() is None  # one of two steps
    window.before_step(ready=True)
    peak = window.after_step()
    assert window.done and peak is not None
    assert 0.99 * (resident + 200e6) <= peak < resident + 400e6  # pages freed before may be reused
    assert window.after_step() is None  # measured once per life
    assert PeakWindow(None).done  # nothing to measure with: never opens


def _segment(n: int, *, planned: dict | None = None, peak: float | None = None) -> Segment:
    return Segment(run_id="r", key=f"ledger/2026010{n}T000000000Z-0000000{n}.json", place=Place(cloud="local"),
                   started_at=float(n), updated_at=float(n), segment=n, memory_planned_gb=planned,
                   memory_peak_gb=peak, memory_measure=None if peak is None else CPU_MEASURE)  # fmt: skip


def test_the_segment_keeps_both_and_status_shows_them_side_by_side():
    planned = PlannedMemory(low_gb=0.55, high_gb=1.62, tensors_gb=0.0042, gpus=1).to_json()
    stored = _segment(2, planned=planned, peak=0.0061)
    back = Segment.from_json(stored.to_json())
    assert (back.memory_planned_gb, back.memory_peak_gb, back.memory_measure) == (planned, 0.0061, CPU_MEASURE)

    assert memory_view([]) is None and memory_view([_segment(1)]) is None
    view = memory_view([_segment(1, planned=planned, peak=0.0059), stored, _segment(3, planned=planned)])
    assert view == {"planned_gb": planned, "peak_gb": 0.0061, "measure": CPU_MEASURE, "segment": 2}
    unmeasured = memory_view([_segment(1, planned=planned)])
    assert unmeasured is not None and unmeasured["peak_gb"] is None

    out = io.StringIO()
    print_status_detail(_status(view), out)
    (line,) = [row for row in out.getvalue().splitlines() if row.startswith("memory/GPU")]
    assert line.split(None, 1)[1] == (
        f"planned 0.55-1.62 GB (tensors 0.0042 GB on 1 GPU); measured peak 0.0061 GB ({CPU_MEASURE}, segment 2)"
    )


def _status(memory: dict) -> RunStatus:
    return RunStatus(run_id="r", task="t.yaml", mode="local", state="SUCCEEDED", detail=None, job_id="1",
                     launches=1, step=10, model_sha256=None, checkpoint_at=None, completed=True, preemptions=0,
                     recoveries=0, spend_usd=0.0, spend_estimated=False, energy_kwh=None, wall_s=None,
                     checkpoint_interval_s=None, where=None, checkpoint_url="/b/r", memory=memory)  # fmt: skip


def test_the_rendered_task_carries_the_estimate_for_the_first_offer_or_the_tasks_own_gpus(tmp_path):
    from skygreen.launch.runs import _render  # the composition `up` renders with

    text = f"skygreen: {{gpus: [A100], gpu_count: 8, model: {LORA_7B}}}\nrun: python train.py\n"
    spec = parse_spec_text(text)
    plan = make_plan(spec, load_catalog(FIXTURE_CATALOG, env={}))
    best = plan.candidates[0]
    cloud = _render(spec, plan, run_id="r-1", bucket="s3://b/runs", task_dir=tmp_path)
    shown = PlannedMemory.parse(cloud["envs"]["SKYGREEN_MEMORY_PLANNED_GB"])
    assert best.memory_gb_per_gpu is not None and shown.gpus == best.accelerator_count * best.num_nodes == 8
    assert (shown.low_gb, shown.high_gb) == (best.memory_gb_per_gpu["low"], best.memory_gb_per_gpu["high"])
    local = _render(spec, None, run_id="r-1", bucket=str(tmp_path), task_dir=tmp_path)
    assert PlannedMemory.parse(local["envs"]["SKYGREEN_MEMORY_PLANNED_GB"]) == shown  # --local: the task's 8 GPUs
    bare = parse_spec_text("skygreen: {gpus: [L4]}\nrun: python train.py\n")
    assert "SKYGREEN_MEMORY_PLANNED_GB" not in _render(bare, None, run_id="r-1", bucket="/b", task_dir=tmp_path)["envs"]
