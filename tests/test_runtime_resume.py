"""Exact resume: a run interrupted and resumed ends bit-identical to an uninterrupted one.

CPU, fp32, zero tolerance: the final checkpoints of both runs are compared tensor by tensor
(model, optimizer, scheduler, GradScaler, every RNG stream, data position, early-stopping
state, micro-batch, counters), except the counters that measure wall time and restarts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import ddp_train as job
from skygreen.errors import RuntimeSetupError
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.tensors import first_difference

TOTAL_STEPS = 10
# Wall time and the restart count legitimately differ between the two histories.
IGNORE = frozenset({"state['training']['counters']['wall_s']", "state['training']['counters']['restarts']"})


def final_checkpoint(bucket: Path, run_id: str = "run"):
    loaded = Checkpointer(f"{bucket}/{run_id}").load_latest()
    assert loaded is not None
    assert loaded.manifest.meta["state"] == "completed"
    return loaded


def assert_identical(a, b) -> None:
    assert a.step == b.step
    assert first_difference(a.state, b.state, ignore=IGNORE) is None, first_difference(a.state, b.state, ignore=IGNORE)
    assert first_difference(a.rank_state, b.rank_state) is None, first_difference(a.rank_state, b.rank_state)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted runs, one per dataset size."""
    out = {}
    for length in (36, 42):
        bucket = tmp_path_factory.mktemp(f"reference{length}")
        job.train(job.settings(bucket), TOTAL_STEPS, dataset_len=length)
        out[length] = final_checkpoint(bucket)
    return out


def resume_through(bucket: Path, crashes: list[tuple[int, int]], dataset_len: int, **overrides):
    for crash in crashes:
        with pytest.raises(job.Crash):
            job.train(job.settings(bucket, **overrides), TOTAL_STEPS, crash_at=crash, dataset_len=dataset_len)
    run = job.train(job.settings(bucket, **overrides), TOTAL_STEPS, dataset_len=dataset_len)
    assert run.counters["restarts"] == len(crashes)
    return final_checkpoint(bucket)


@pytest.mark.parametrize(
    "case, dataset_len, crashes",
    [
        # 36 samples, 12 per step: the checkpoint at step 4 is 12 samples into epoch 1.
        ("mid-epoch", 36, [(5, 0)]),
        # the checkpoint at step 6 is exactly the end of epoch 1 (72 samples).
        ("epoch boundary", 36, [(7, 0)]),
        # crash after two of four micro-steps: the window is recomputed from the step-4 checkpoint;
        # with 42 samples that window (48..60) and others straddle an epoch boundary.
        ("inside an accumulation window", 42, [(5, 2)]),
        ("chained three times", 42, [(3, 1), (6, 3), (8, 0)]),
    ],
)
def test_resumed_run_is_bit_identical(tmp_path, reference, case, dataset_len, crashes):
    resumed = resume_through(tmp_path, crashes, dataset_len)
    assert_identical(reference[dataset_len], resumed)


def test_the_comparison_would_catch_a_lost_rng_restore(tmp_path, reference, monkeypatch):
    """Control: resume without restoring RNG state, and the final states differ."""
    from skygreen.runtime import rng

    monkeypatch.setattr(rng, "restore", lambda state: None)
    resumed = resume_through(tmp_path, [(5, 0)], 42)
    assert first_difference(reference[42].state, resumed.state, ignore=IGNORE) is not None


def test_resume_restores_position_counters_and_micro_batch(tmp_path):
    with pytest.raises(job.Crash):
        job.train(job.settings(tmp_path), TOTAL_STEPS, crash_at=(5, 1))
    loaded = Checkpointer(f"{tmp_path}/run").load_latest()
    assert loaded.step == 4
    training = loaded.state["training"]
    assert (training["step"], training["samples_seen"], training["completed"]) == (4, 48, False)
    assert loaded.state["training"]["batch"]["micro"] == 3
    meta = loaded.manifest.meta
    assert meta["state"] == "running" and meta["epoch"] == 1 and meta["accum_steps"] == 4
    assert {"energy_j", "wall_s", "preemptions", "micro_batch", "precision", "checkpoint_interval_s"} <= set(meta)


def test_a_completed_run_does_not_train_again(tmp_path):
    job.train(job.settings(tmp_path), 4)
    first = final_checkpoint(tmp_path)
    run = job.train(job.settings(tmp_path), 4)
    assert run.completed and run.step_index == 4
    again = final_checkpoint(tmp_path)
    assert again.manifest.created_at == first.manifest.created_at


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    """micro 3 x accum 4 and micro 12 x accum 1 take the same samples per step; the loss is
    normalised, so the weights agree to float rounding (not bitwise: the sums differ in order)."""
    no_dropout = lambda net: net[2].__setattr__("p", 0.0)  # noqa: E731
    a = job.train(job.settings(tmp_path / "a", micro_batch=3), 4, hooks=no_dropout, noise=False)
    b = job.train(job.settings(tmp_path / "b", micro_batch=12), 4, hooks=no_dropout, noise=False)
    assert a.accum_steps == 4 and b.accum_steps == 1
    for pa, pb in zip(a.module.parameters(), b.module.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def _misused_run(tmp_path, body):
    net = job.model()
    run = job.Run(
        model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), dataset=job.dataset(),
        settings=job.settings(tmp_path), environ={},
    )  # fmt: skip
    with run:
        for step in run.steps(3):
            with step:
                body(run, step)


def test_a_step_without_optimizer_step_is_a_clear_error(tmp_path):
    def body(run, step):
        for x, y in step.micro_batches():
            step.backward(torch.nn.functional.cross_entropy(run.model(x), y))

    with pytest.raises(RuntimeSetupError, match=r"ended without step\.optimizer_step"):
        _misused_run(tmp_path, body)


def test_skipping_micro_batches_is_a_clear_error(tmp_path):
    def body(run, step):
        x, y = next(iter(step.micro_batches()))
        step.backward(torch.nn.functional.cross_entropy(run.model(x), y))
        step.optimizer_step()

    with pytest.raises(RuntimeSetupError, match="1 micro-batches drawn and 1 backward calls, expected 4"):
        _misused_run(tmp_path, body)
