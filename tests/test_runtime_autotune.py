"""`micro: auto`: halve on out-of-memory, keep the effective batch, agree, record, re-probe.

There is no OOM to provoke on CPU, so a forward pre-hook raises the error CUDA raises
(`torch.cuda.OutOfMemoryError`, with CUDA's message) whenever a micro-batch is larger than
what the "device" holds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import ddp_train as job
from skygreen.errors import RuntimeSetupError
from skygreen.runtime import run as run_module
from skygreen.runtime.autotune import is_out_of_memory, smaller_micro_batch
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.precision import DeviceFacts
from skygreen.runtime.tensors import first_difference

IGNORE = frozenset(
    {
        "state['training']['counters']['wall_s']",
        "state['training']['counters']['restarts']",
        "state['training']['batch']['micro_auto']",
    }
)


def memory_limit(max_rows: int, ooms: list[int]):
    """A model hook that fails like a GPU whose memory holds `max_rows` samples."""

    def install(net):
        def hook(module, inputs):
            rows = inputs[0].shape[0]
            if rows > max_rows:
                ooms.append(rows)
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {rows * 2} MiB. GPU 0 has a total capacity of 15.77 GiB"
                )

        net[0].register_forward_pre_hook(hook)

    return install


def test_oom_halves_the_micro_batch_and_the_result_equals_a_run_at_that_size(tmp_path):
    ooms: list[int] = []
    trace: list = []
    auto = job.train(job.settings(tmp_path / "auto", micro_batch=None), 8, hooks=memory_limit(4, ooms), trace=trace)
    assert ooms == [12, 6]  # 12 -> 6 -> 3 (divisors of the per-rank batch 12)
    assert auto.micro_batch == 3 and auto.accum_steps == 4 and auto.effective_batch == 12
    assert {micro for _, micro, _ in trace} == {3}
    job.train(job.settings(tmp_path / "fixed", micro_batch=3), 8)
    a = Checkpointer(f"{tmp_path}/auto/run").load_latest()
    b = Checkpointer(f"{tmp_path}/fixed/run").load_latest()
    assert a.state["training"]["batch"]["micro"] == 3 and a.manifest.meta["micro_batch"] == 3
    assert first_difference(a.state, b.state, ignore=IGNORE) is None, first_difference(a.state, b.state, ignore=IGNORE)
    assert first_difference(a.rank_state, b.rank_state) is None


def test_resume_on_the_same_device_reuses_the_recorded_micro_batch(tmp_path):
    ooms: list[int] = []
    with pytest.raises(job.Crash):
        job.train(job.settings(tmp_path, micro_batch=None), 8, hooks=memory_limit(4, ooms), crash_at=(5, 0))
    assert ooms == [12, 6]
    ooms.clear()
    run = job.train(job.settings(tmp_path, micro_batch=None), 8, hooks=memory_limit(4, ooms))
    assert ooms == [] and run.micro_batch == 3


def test_resume_on_a_different_gpu_type_probes_again(tmp_path, monkeypatch):
    with pytest.raises(job.Crash):
        job.train(job.settings(tmp_path, micro_batch=None), 8, hooks=memory_limit(4, []), crash_at=(5, 0))
    # The resumed run lands on a device with more memory (and another name).
    monkeypatch.setattr(run_module, "device_facts", lambda device: DeviceFacts(kind="cpu", name="bigger-device"))
    ooms: list[int] = []
    run = job.train(job.settings(tmp_path, micro_batch=None), 8, hooks=memory_limit(6, ooms))
    assert ooms == [12] and run.micro_batch == 6 and run.accum_steps == 2
    final = Checkpointer(f"{tmp_path}/run").load_latest()
    assert (
        final.state["training"]["batch"]["device_name"] == "bigger-device"
        and final.state["training"]["batch"]["micro"] == 6
    )


def test_oom_at_micro_batch_1_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeSetupError, match="out of memory with micro-batch 1"):
        job.train(job.settings(tmp_path, micro_batch=None), 4, hooks=memory_limit(0, []))


def test_oom_with_a_fixed_micro_batch_is_not_swallowed(tmp_path):
    with pytest.raises(torch.cuda.OutOfMemoryError):
        job.train(job.settings(tmp_path, micro_batch=6), 4, hooks=memory_limit(4, []))


def test_smaller_micro_batch_keeps_divisors():
    assert smaller_micro_batch(12, 12) == 6
    assert smaller_micro_batch(6, 12) == 3
    assert smaller_micro_batch(3, 12) == 1
    assert smaller_micro_batch(48, 48) == 24
    assert smaller_micro_batch(10, 10) == 5
    assert smaller_micro_batch(5, 10) == 2
    assert smaller_micro_batch(1, 10) is None


def test_out_of_memory_detection():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory."))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert is_out_of_memory(
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
    )
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))
