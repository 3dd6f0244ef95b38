"""Power caps in the training runtime, on the simulated GPU (the fake at the pynvml boundary).

Training runs on the CPU; the simulated V100 only answers NVML. Checked: the exact limits set,
restore on every exit path (end, exception, early stop, SIGTERM) and after kill -9 + resume,
the `auto` profile saved and reused, energy summed across a real preemption, and the weights
bit-identical to a run without the simulated GPU.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import ddp_train as job
from helpers import user_env
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import RuntimeSetupError
from skygreen.ledger.io import read_ledger
from skygreen.power.originals import OriginalLimits
from skygreen.power.policy import CapRequest
from skygreen.power.simulated import SimulatedNvml
from skygreen.runtime import PREEMPTED_EXIT_CODE
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.tensors import first_difference
from skygreen.task.spec import EarlyStopConfig
from test_runtime_preemption import start_tiny, tiny_env, wait_for_commit

TOTAL_STEPS = 20
LADDER_STEPS = 18  # 2 settling steps, then the V100 ladder: 8 limits x (1 warm-up + 1 measured)
IGNORE = frozenset(
    {
        "state['training']['counters']['wall_s']",
        "state['training']['counters']['restarts']",
        "state['training']['counters']['energy_j']",
        "state['power']",
    }
)


def sim_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "SKYGREEN_SIMULATED_GPU": "V100",
        "SKYGREEN_DATA_DIR": str(tmp_path / "data"),
        "SKYGREEN_POWER_PROFILE_STEPS": "1,1,2",
        **extra,
    }


def board(tmp_path: Path) -> SimulatedNvml:
    """The same simulated board, read from its state file (what a later process sees)."""
    lib = SimulatedNvml("V100", state_dir=tmp_path / "data" / "simulated-gpu")
    lib.nvmlInit()
    return lib


def limit_w(lib: SimulatedNvml) -> float:
    return lib.nvmlDeviceGetPowerManagementLimit(lib.nvmlDeviceGetHandleByIndex(0)) / 1000


def counter_j(tmp_path: Path) -> float:
    """The board's total-energy counter, read through a handle opened just now (a simulated
    board counts the time each open handle is held as busy time)."""
    lib = board(tmp_path)
    return lib.nvmlDeviceGetTotalEnergyConsumption(lib.nvmlDeviceGetHandleByIndex(0)) / 1000


def final(bucket: Path, run_id: str = "run"):
    loaded = Checkpointer(f"{bucket}/{run_id}").load_latest()
    assert loaded is not None and loaded.manifest.meta["state"] == "completed"
    return loaded


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    bucket = tmp_path_factory.mktemp("reference")
    job.train(job.settings(bucket), TOTAL_STEPS, environ={})
    return final(bucket)


def test_auto_profiles_real_steps_resumes_without_profiling_and_stays_bit_identical(tmp_path, reference):
    env = sim_env(tmp_path)
    with pytest.raises(job.Crash):  # dies after the profile finished (exception path)
        job.train(
            job.settings(tmp_path / "b", power_cap=CapRequest.parse("auto")), TOTAL_STEPS, crash_at=(18, 1), environ=env
        )
    sim = board(tmp_path)
    first = sim.set_calls_w()
    assert limit_w(sim) == 300.0 and first[-1] == 300.0  # restored on the exception
    ladder = first[:7]  # 274 ... 120 (300 is already the limit: not set)
    assert ladder == sorted(ladder, reverse=True) and ladder[-1] == 120.0
    saved = Checkpointer(f"{tmp_path / 'b'}/run").load_latest()
    assert saved is not None
    chosen = saved.state["power"]["profile"]["chosen_w"]
    assert chosen in ladder or chosen == 300.0
    # after the ladder: the chosen limit (unless it is the last rung, already set, or the
    # default, which the restore sets), then the restore to 300 W
    assert first[7:] == ([300.0] if chosen in (ladder[-1], 300.0) else [chosen, 300.0])
    assert saved.step >= LADDER_STEPS
    assert saved.manifest.meta["power"]["method"] == "simulated" and saved.manifest.meta["power"]["cap_w"] == chosen

    run = job.train(job.settings(tmp_path / "b", power_cap=CapRequest.parse("auto")), TOTAL_STEPS, environ=env)
    # the saved profile: no ladder again (on this noisy CPU the choice may be the max, already set)
    assert sim.set_calls_w()[len(first) :] == ([] if chosen == 300.0 else [chosen, 300.0])
    assert limit_w(sim) == 300.0 and run.counters["energy_j"] > 0
    done = final(tmp_path / "b")
    assert first_difference(reference.state, done.state, ignore=IGNORE) is None, first_difference(
        reference.state, done.state, ignore=IGNORE
    )
    assert first_difference(reference.rank_state, done.rank_state) is None


def test_fixed_cap_is_set_once_and_restored_at_the_end_and_on_early_stop(tmp_path):
    env = sim_env(tmp_path)
    job.train(job.settings(tmp_path / "b", power_cap=CapRequest.parse("0.6")), 6, environ=env)
    assert board(tmp_path).set_calls_w() == [180.0, 300.0]
    stopped = job.train(
        job.settings(tmp_path / "c", power_cap=CapRequest.parse("200"), early_stop=EarlyStopConfig(metric="val_loss", patience=1)),
        TOTAL_STEPS, metrics={1: 1.0, 2: 2.0, 3: 3.0}, environ=env,
    )  # fmt: skip
    assert stopped.step_index < TOTAL_STEPS  # early stop
    assert board(tmp_path).set_calls_w() == [180.0, 300.0, 200.0, 300.0]


def test_no_permission_meters_only_and_required_stops_before_training(tmp_path):
    env = sim_env(tmp_path, SKYGREEN_SIMULATED_GPU_FAULTS="no-permission")
    run = job.train(job.settings(tmp_path / "b", power_cap=CapRequest.parse("0.6")), 4, environ=env)
    assert run.counters["energy_j"] > 0 and run.power.cap_w is None
    assert final(tmp_path / "b").manifest.meta["power"]["cap_w"] is None
    with pytest.raises(RuntimeSetupError, match=r"power\.required is true"):
        job.train(job.settings(tmp_path / "c", power_cap=CapRequest.parse("0.6"), power_required=True), 4, environ=env)
    assert Checkpointer(f"{tmp_path / 'c'}/run").load_latest() is None  # no step trained


def test_cpu_run_says_none_and_why(tmp_path):
    job.train(job.settings(tmp_path / "b", power_cap=CapRequest.parse("0.6")), 2, environ={})
    power = final(tmp_path / "b").manifest.meta["power"]
    assert power["method"] == "none" and power["reason"] == "no GPU: this run trained on CPU"


HOLD = {"SKYGREEN_TEST_HOLD_AT_STEPS": "10"}  # the run commits step 10 and waits there: no race


def test_sigterm_restores_the_limit(tmp_path):
    env = tiny_env(tmp_path, "victim", SKYGREEN_POWER_CAP="0.6", **sim_env(tmp_path), **HOLD)
    proc = start_tiny(env)
    assert wait_for_commit(tmp_path, "victim", proc, after=9) == 10
    assert limit_w(board(tmp_path)) == 180.0
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err
    assert board(tmp_path).set_calls_w() == [180.0, 300.0]
    assert OriginalLimits(tmp_path / "data" / "power" / "originals").all() == []


def test_kill_9_then_resume_restores_the_original_and_sums_energy(tmp_path):
    env = tiny_env(tmp_path, "victim", SKYGREEN_POWER_CAP="0.6", **sim_env(tmp_path), **HOLD)
    proc = start_tiny(env)
    step = wait_for_commit(tmp_path, "victim", proc, after=9)
    assert step == 10 and proc.poll() is None  # held at step 10
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    sim = board(tmp_path)
    assert limit_w(sim) == 180.0  # the cap outlives the process, as on a real GPU
    committed = Checkpointer(f"{tmp_path}/victim").load_latest()
    assert committed is not None and committed.step == step
    energy_before_j = committed.state["training"]["counters"]["energy_j"]
    assert energy_before_j > 0
    board_before_j = counter_j(tmp_path)

    again = start_tiny(env)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert "restored the original power limit 300 W" in err
    # restore to the ORIGINAL 300 W (not the 180 W found), cap again, restore at the end
    assert sim.set_calls_w() == [180.0, 300.0, 180.0, 300.0]
    board_used_j = counter_j(tmp_path) - board_before_j
    done = final(tmp_path, "victim")
    resumed_j = done.state["training"]["counters"]["energy_j"] - energy_before_j
    # The second launch adds its own energy: some, and never more than the board counted while it
    # ran (the board's absolute counter would include the first launch's). How much of the
    # board's count falls outside the metered steps (start-up, the final upload, the restore)
    # depends on how the machine schedules the process, so no share of it is asserted.
    assert 0 < resumed_j <= board_used_j + 1e-3
    # and it adds to the first launch's count, not starts again: the ledger's second segment (the
    # counter at its end minus the restored one at its start) holds the same energy
    segments = read_ledger(open_store(f"{tmp_path}/victim"))
    assert len(segments) == 2 and segments[0].end == "killed", segments
    assert segments[1].energy_j == pytest.approx(resumed_j, rel=1e-6), (segments[1].energy_j, resumed_j)
    assert done.manifest.meta["power"]["method"] == "simulated"


def test_status_of_a_real_local_run_shows_energy_co2e_cap_and_the_statement(private_home, tmp_path):
    """`skygreen up tasks/tiny.yaml --local` on a simulated V100, then `status`; then a CPU run."""
    import json
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    env = user_env(private_home, TINY_STEPS="40", SKYGREEN_SIMULATED_GPU="V100", SKYGREEN_POWER_PROFILE_STEPS="1,2,2")

    def skygreen(*args: str, environ=env) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "skygreen.cli", *args],
            env=environ,
            capture_output=True,
            text=True,
            cwd=repo,
            timeout=300,
        )

    up = skygreen("up", "tasks/tiny.yaml", "--local", "--no-smoke")
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    (run,) = json.loads(skygreen("status", "--json").stdout)
    energy = run["energy"]
    assert energy["method"] == "simulated" and energy["gpu_kwh"] > 0 and energy["pue"] == 1.0
    assert energy["facility_kwh"] == energy["gpu_kwh"] and energy["co2e_kg"] > 0
    assert energy["default_limit_w"] == 300.0 and 120.0 <= energy["cap_w"] <= 300.0
    assert energy["saving_vs_uncapped"] is not None
    detail = skygreen("status", run["run_id"])
    assert detail.returncode == 0 and "simulated GPU" in detail.stdout and "CO2e so far" in detail.stdout
    statement = skygreen("status", run["run_id"], "--statement")
    assert statement.returncode == 0 and statement.stdout.startswith("Energy statement: training run " + run["run_id"])
    assert "simulated GPU" in statement.stdout and "kg CO2e" in statement.stdout and "power cap of" in statement.stdout
    assert skygreen("status", "--statement").returncode == 2  # needs a RUN

    cpu_env = {k: v for k, v in env.items() if k != "SKYGREEN_SIMULATED_GPU"}
    assert skygreen("up", "tasks/tiny.yaml", "--local", "--no-smoke", environ=cpu_env).returncode == 0
    listed = json.loads(skygreen("status", "--json", environ=cpu_env).stdout)
    cpu = next(r for r in listed if r["run_id"] != run["run_id"])
    assert cpu["energy"]["method"] == "none" and cpu["energy"]["reason"] == "no GPU: this run trained on CPU"
    assert "none: no GPU: this run trained on CPU" in skygreen("status", cpu["run_id"], environ=cpu_env).stdout


def test_two_ddp_ranks_each_cap_their_own_board_and_agree_on_the_limit(tmp_path):
    """torchrun, 2 ranks (gloo, CPU), each with its own simulated L4: one profile, one choice."""
    from test_runtime_ddp import TORCHRUN, torchrun

    if not TORCHRUN.exists():
        pytest.skip("torchrun not installed")
    env = {
        "SKYGREEN_SIMULATED_GPU": "L4:2",
        "SKYGREEN_DATA_DIR": str(tmp_path / "data"),
        "SKYGREEN_POWER_PROFILE_STEPS": "1,1,1",
    }
    done = torchrun(tmp_path, "ddp", "3", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lib = SimulatedNvml("L4", count=2, state_dir=tmp_path / "data" / "simulated-gpu")
    calls = [lib.set_calls_w(0), lib.set_calls_w(1)]
    assert calls[0] == calls[1]  # energy summed and time maxed across ranks: the same choice on both
    final = Checkpointer(f"{tmp_path}/ddp", rank=0, world_size=2).load_latest()
    assert final is not None
    chosen = final.state["power"]["profile"]["chosen_w"]
    # ladder 72 (already set), 47, 29; then the choice (unless already there); then the original back
    expected = [47.0, 29.0] + ([chosen] if chosen != 29.0 else []) + ([72.0] if chosen != 72.0 else [])
    assert calls[0] == expected
    assert final.manifest.meta["power"]["method"] == "simulated" and final.manifest.meta["energy_j"] > 0


def test_kill_9_of_a_local_run_then_skygreen_resume_restores_the_original_limit(private_home, tmp_path):
    """`skygreen up tasks/tiny.yaml --local` on a simulated V100 (auto cap), held at step 10 in
    the middle of its profile, SIGKILLed, then `skygreen resume`: the board goes back to 300 W
    before anything else, the profile goes on, and the run ends with the original limit."""
    import json
    import subprocess
    import time

    from test_local_e2e import held, kill_training, status, wait_for_step

    repo = Path(__file__).resolve().parents[1]
    env = user_env(private_home, TINY_STEPS="40", SKYGREEN_SIMULATED_GPU="V100", SKYGREEN_POWER_PROFILE_STEPS="1,1,2")
    gated = held(env, tmp_path / "release", "10")
    cli = [sys.executable, "-m", "skygreen.cli"]
    started = subprocess.run([*cli, "up", "tasks/tiny.yaml", "--local", "--no-smoke", "--detach"], env=gated, cwd=repo, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_id = json.loads(subprocess.run([*cli, "status", "--json"], env=env, capture_output=True, text=True).stdout)[0][
        "run_id"
    ]
    wait_for_step(gated, run_id, 10)  # held mid-profile: 300-223 W measured, 197 W just set
    sim = SimulatedNvml("V100", state_dir=private_home / ".local" / "share" / "skygreen" / "simulated-gpu")
    sim.nvmlInit()
    before = sim.set_calls_w()
    assert before == [274.0, 249.0, 223.0, 197.0] and limit_w(sim) == 197.0
    kill_training(gated, run_id)
    time.sleep(0.5)
    assert limit_w(sim) == 197.0  # SIGKILL restores nothing: the cap stays on the board
    resumed = subprocess.run([*cli, "resume", run_id], env=env, cwd=repo, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    after = sim.set_calls_w()[len(before) :]
    assert after[0] == 300.0  # the original, not the 197 W it found
    assert after[1] == 197.0  # then the profile goes on: 197 W had been set at step 10 but not measured
    assert limit_w(sim) == 300.0  # and the run ends on the original limit
    final = status(env, run_id)
    assert final["completed"] and final["energy"]["method"] == "simulated" and final["energy"]["gpu_kwh"] > 0
