"""The pure policies behind the runtime: precision choice, early stopping, settings, data order."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from skygreen.errors import RuntimeSetupError
from skygreen.runtime.early_stop import EarlyStopConfig, EarlyStopper
from skygreen.runtime.precision import DeviceFacts, catalog_facts, choose_precision, cpu_facts, cuda_facts

# -- precision ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gpu, expected, scaler, warns",
    [
        ("H100", "bf16", False, False),
        ("A100", "bf16", False, False),
        ("L4", "bf16", False, False),
        ("A10G", "bf16", False, False),
        ("V100", "fp16", True, False),
        ("T4", "fp16", True, False),
        ("P100", "fp32", False, True),
        ("K80", "fp32", False, True),
    ],
)
def test_auto_precision_per_gpu(gpu, expected, scaler, warns):
    choice = choose_precision("auto", catalog_facts(gpu))
    assert (choice.precision, choice.grad_scaler, choice.warning is not None) == (expected, scaler, warns)
    if warns:
        assert "no tensor cores" in choice.warning and "\n" not in choice.warning


@pytest.mark.parametrize(
    "capability, expected",
    [
        ((9, 0), "bf16"),
        ((8, 0), "bf16"),
        ((8, 6), "bf16"),
        ((7, 5), "fp16"),
        ((7, 0), "fp16"),
        ((6, 0), "fp32"),
        ((3, 7), "fp32"),
    ],
)
def test_auto_precision_from_compute_capability(capability, expected):
    assert choose_precision("auto", cuda_facts("some GPU", capability)).precision == expected


def test_catalog_and_capability_agree_for_every_known_gpu():
    capabilities = {"H200": (9, 0), "H100": (9, 0), "A100-80GB": (8, 0), "A100": (8, 0), "L40S": (8, 9), "A10G": (8, 6),
                    "A10": (8, 6), "L4": (8, 9), "V100": (7, 0), "V100-32GB": (7, 0), "T4": (7, 5), "P100": (6, 0), "K80": (3, 7)}  # fmt: skip
    from skygreen.gpus import GPUS

    assert set(capabilities) == set(GPUS)
    for name, cap in capabilities.items():
        assert choose_precision("auto", catalog_facts(name)) == choose_precision("auto", cuda_facts(name, cap))


def test_cpu_precision():
    assert choose_precision("auto", cpu_facts()).precision == "fp32"
    assert choose_precision("fp32", cpu_facts()).precision == "fp32"
    assert choose_precision("bf16", cpu_facts()).precision == "bf16"
    fp16 = choose_precision("fp16", cpu_facts())
    assert fp16.precision == "bf16" and not fp16.grad_scaler and "bf16" in fp16.warning


def test_explicit_precisions_on_gpus():
    assert choose_precision("fp16", catalog_facts("A100")).grad_scaler
    assert choose_precision("fp32", catalog_facts("H100")).precision == "fp32"
    assert "no tensor cores" in choose_precision("fp16", catalog_facts("P100")).warning
    with pytest.raises(RuntimeSetupError, match=r"(?s)bf16.*V100.*fix: use precision auto"):
        choose_precision("bf16", catalog_facts("V100"))
    with pytest.raises(RuntimeSetupError, match="unknown value 'fp8'"):
        choose_precision("fp8", cpu_facts())
    with pytest.raises(ValueError):
        DeviceFacts(kind="tpu")


def test_cluster_default_precision_reaches_the_runtime(tmp_path):
    """SKYGREEN_DEFAULT_PRECISION stands in for auto; a task's or the code's explicit choice wins."""
    import torch

    import ddp_train as job
    from skygreen.runtime.run import Run
    from skygreen.task.settings import RuntimeSettings

    def run_with(environ, **kw):
        net = job.model()
        return Run(
            model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), dataset=job.dataset(), environ=environ, **kw
        )

    base = {"SKYGREEN_RUN_ID": "r", "SKYGREEN_BUCKET": str(tmp_path), "SKYGREEN_EFFECTIVE_BATCH": "12"}
    assert run_with(base).precision.precision == "fp32"
    assert run_with({**base, "SKYGREEN_DEFAULT_PRECISION": "bf16"}).precision.precision == "bf16"
    assert (
        run_with({**base, "SKYGREEN_PRECISION": "auto", "SKYGREEN_DEFAULT_PRECISION": "bf16"}).precision.precision
        == "bf16"
    )
    assert (
        run_with({**base, "SKYGREEN_PRECISION": "fp32", "SKYGREEN_DEFAULT_PRECISION": "bf16"}).precision.precision
        == "fp32"
    )
    assert run_with({**base, "SKYGREEN_DEFAULT_PRECISION": "bf16"}, precision="fp32").precision.precision == "fp32"
    with pytest.raises(RuntimeSetupError, match="SKYGREEN_DEFAULT_PRECISION"):
        run_with({**base, "SKYGREEN_DEFAULT_PRECISION": "fp8"})
    with pytest.raises(RuntimeSetupError, match="SKYGREEN_DEFAULT_PRECISION"):
        run_with({**base, "SKYGREEN_PRECISION": "auto", "SKYGREEN_DEFAULT_PRECISION": "fp8"})
    with pytest.raises(RuntimeSetupError, match="effective batch is not set"):
        run_with({k: v for k, v in base.items() if k != "SKYGREEN_EFFECTIVE_BATCH"})
    with pytest.raises(RuntimeSetupError, match="micro-batch 5 does not divide the per-rank batch 12"):
        run_with(base, micro_batch=5)
    settings = RuntimeSettings(run_id="r", bucket=str(tmp_path), effective_batch=12)
    assert run_with({}, settings=settings, effective_batch=24).effective_batch == 24  # code wins


# -- early stopping -------------------------------------------------------------------------


def feed(stopper: EarlyStopper, values) -> list[bool]:
    return [stopper.update(v) for v in values]


def test_patience_and_min_delta():
    s = EarlyStopper(EarlyStopConfig(metric="val_loss", patience=2, min_delta=0.1))
    assert feed(s, [1.0, 0.95, 0.8, 0.75, 0.72]) == [False, False, False, False, True]
    assert s.best == 0.8


def test_grace_ignores_a_curriculum_bump():
    values = [1.0, 1.5, 2.0, 0.9, 0.8]
    assert feed(EarlyStopper(EarlyStopConfig(metric="m", patience=2)), values)[2] is True
    graced = EarlyStopper(EarlyStopConfig(metric="m", patience=2, grace=2))
    assert feed(graced, values) == [False, False, False, False, False]
    assert graced.best == 0.8


def test_max_mode_and_nan():
    s = EarlyStopper(EarlyStopConfig(metric="acc", mode="max", patience=2))
    assert feed(s, [0.5, 0.6, float("nan"), 0.6]) == [False, False, False, True]


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=30), st.integers(0, 30))
def test_state_survives_a_resume_anywhere(values, cut):
    config = EarlyStopConfig(metric="m", patience=3, min_delta=0.01, grace=1)
    straight = EarlyStopper(config)
    expected = feed(straight, values)
    first = EarlyStopper(config)
    got = feed(first, values[:cut])
    resumed = EarlyStopper(config)
    resumed.load_state_dict(first.state_dict())
    got += feed(resumed, values[cut:])
    assert got == expected and resumed.state_dict() == straight.state_dict()


def test_bad_config_is_refused():
    bads: list[dict[str, Any]] = [dict(mode="median"), dict(patience=0), dict(min_delta=-1.0), dict(grace=-1)]
    for bad in [*bads, dict(metric="")]:
        with pytest.raises(ValueError):
            EarlyStopConfig(**{"metric": "m", **bad})


def test_early_stop_in_a_run_writes_a_completed_checkpoint_and_survives_resume(tmp_path):
    import ddp_train as job
    from skygreen.runtime.checkpointer import Checkpointer

    metrics = {1: 1.0, 2: 0.5, 3: 0.6, 4: 0.7, 5: 0.4}  # patience 2: stops after step index 4
    settings = job.settings(
        tmp_path, early_stop=EarlyStopConfig(metric="val_loss", patience=2), checkpoint_every_steps=1
    )
    with pytest.raises(job.Crash):  # dies after the first bad evaluation; the state must come back
        job.train(settings, 20, metrics=metrics, crash_at=(4, 0))
    run = job.train(settings, 20, metrics=metrics)
    assert run.step_index == 5 and run.stopper.stopped and run.counters["restarts"] == 1
    final = Checkpointer(f"{tmp_path}/run").load_latest()
    assert final.step == 5 and final.manifest.meta["state"] == "completed" and final.manifest.pinned
    assert final.state["early_stop"] == {"evaluations": 4, "best": 0.5, "bad_evaluations": 2, "stopped": True}


# -- data order -----------------------------------------------------------------------------


@given(st.integers(1, 50), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(0, 200))
def test_micro_batches_of_all_ranks_cover_each_window_exactly(dataset_len, micro, accum, world, start):
    from skygreen.runtime.data import MicroBatchSampler, SampleStream

    stream = SampleStream(dataset_len, seed=3)
    effective = micro * accum * world
    drawn = []
    for rank in range(world):
        it = iter(
            MicroBatchSampler(
                stream, start=start, effective_batch=effective, micro_batch=micro, rank=rank, world_size=world
            )
        )
        for _ in range(accum * 2):  # two optimizer steps
            drawn.extend(next(it))
    assert sorted(drawn) == sorted(stream.take(start, 2 * effective))
    epoch0 = stream.epoch_order(0)
    assert sorted(epoch0) == list(range(dataset_len))


def test_laptop_side_runtime_modules_import_no_torch():
    """`skygreen up` reads PREEMPTED_EXIT_CODE and runs the smoke test without importing torch."""
    import subprocess

    code = (
        "import sys, skygreen.runtime, skygreen.launch.smoke, skygreen.runtime.precision, skygreen.runtime.early_stop\n"
        "assert skygreen.runtime.PREEMPTED_EXIT_CODE == 75\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'sky', 'pynvml'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
