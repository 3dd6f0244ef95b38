"""skygreen.power: the NVML adapter, cap policy, set/restore and metering, against the simulated
GPU at the pynvml boundary (the only fake), plus a real kill -9 of a capping process."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from skygreen.errors import GpuLostError, NvmlMissingError, PowerError, PowerNotSupportedError, PowerPermissionError
from skygreen.power import caps as caps_mod
from skygreen.power.caps import PowerCaps, limits_of, restore_all
from skygreen.power.entry import cap
from skygreen.power.meter import GpuEnergyMeter
from skygreen.power.model import model_energy_ratio, model_time_ratio
from skygreen.power.nvml import Nvml, load_library, translate
from skygreen.power.originals import OriginalLimits
from skygreen.power.policy import (
    CapRequest,
    LadderProfiler,
    Limits,
    PowerProfile,
    ProfilePoint,
    choose,
    clamp_w,
    ladder_w,
    needs_set,
    resolve,
)
from skygreen.power.simulated import SimulatedNvml

SET = "nvmlDeviceSetPowerManagementLimit"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock():
    return FakeClock()


def sim(tmp_path, gpu="V100", clock=None, **kw) -> SimulatedNvml:
    extra = {"clock": clock, "sleep": clock.sleep} if clock else {}
    return SimulatedNvml(gpu, state_dir=tmp_path / "sim", **extra, **kw)


def sets(lib: SimulatedNvml) -> list[tuple[int, int]]:
    return [args for name, args in lib.calls if name == SET]


# -- adapter -------------------------------------------------------------------------------


def test_adapter_speaks_watts_and_joules_and_sets_whole_milliwatts(tmp_path, clock):
    lib = sim(tmp_path, clock=clock)
    gpu = Nvml(lib).device(0)
    assert gpu.simulated and gpu.name == "V100 (simulated)"
    assert gpu.power_limit_w() == 300.0 and gpu.default_limit_w() == 300.0
    assert gpu.limit_range_w() == (120.0, 300.0)
    gpu.set_power_limit_w(180.4)
    assert sets(lib) == [(0, 180400)]
    assert gpu.power_limit_w() == 180.4


@pytest.mark.parametrize(
    ("fault", "action", "error"),
    [
        ("no-permission", lambda g: g.set_power_limit_w(200), PowerPermissionError),
        ("no-energy-counter", lambda g: g.energy_j(), PowerNotSupportedError),
        ("gpu-lost", lambda g: g.power_limit_w(), GpuLostError),
    ],
)
def test_error_table_maps_nvml_errors(tmp_path, fault, action, error):
    gpu = Nvml(sim(tmp_path, faults=(fault,))).device(0)
    with pytest.raises(error) as caught:
        action(gpu)
    assert caught.value.__cause__ is not None  # the NVML error stays attached
    if error is PowerPermissionError:
        assert "CAP_SYS_ADMIN" in str(caught.value)


def test_missing_library_is_nvml_missing(tmp_path, monkeypatch):
    with pytest.raises(NvmlMissingError):
        Nvml(sim(tmp_path, faults=("no-library",)))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    with pytest.raises(NvmlMissingError, match="nvidia-ml-py"):
        load_library({})


def _code_and_class(call, *args) -> tuple[int | None, str] | None:
    try:
        call(*args)
    except Exception as e:  # pynvml's NVMLError or the simulator's
        return getattr(e, "value", None), type(e).__name__
    return None


def test_the_simulator_is_uninitialised_before_nvml_init_and_after_the_last_shutdown_as_nvml_is(tmp_path):
    pynvml = pytest.importorskip("pynvml")
    lib = sim(tmp_path)
    for name, args in [("nvmlDeviceGetCount", ()), ("nvmlDeviceGetHandleByIndex", (0,)), ("nvmlShutdown", ())]:
        real = _code_and_class(getattr(pynvml, name), *args)  # nvmlInit never ran: the library is not loaded
        assert real == (1, "NVMLError_Uninitialized") == _code_and_class(getattr(lib, name), *args), name
    lib.nvmlInit()
    lib.nvmlInit()  # NVML counts initialisations
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    lib.nvmlShutdown()
    assert lib.nvmlDeviceGetPowerManagementLimit(handle) == 300_000  # one init still open
    lib.nvmlShutdown()
    assert _code_and_class(lib.nvmlDeviceGetPowerManagementLimit, handle) == (1, "NVMLError_Uninitialized")
    assert _code_and_class(lib.nvmlDeviceGetCount) == (1, "NVMLError_Uninitialized")


def test_real_pynvml_errors_translate_by_code():
    pynvml = pytest.importorskip("pynvml")
    assert isinstance(translate(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION), "x"), PowerPermissionError)
    assert isinstance(translate(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), "x"), PowerNotSupportedError)
    assert isinstance(translate(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), "x"), GpuLostError)
    assert isinstance(translate(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), "x"), NvmlMissingError)
    assert type(translate(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN), "x")) is PowerError


def test_simulated_gpu_from_the_environment(tmp_path):
    env = {"SKYGREEN_SIMULATED_GPU": "a100:2", "SKYGREEN_DATA_DIR": str(tmp_path)}
    nvml = Nvml(environ=env)
    assert [g.name for g in nvml.devices()] == ["A100 (simulated)", "A100 (simulated)"]
    assert nvml.device(1).default_limit_w() == 400.0
    from skygreen.errors import RuntimeSetupError

    with pytest.raises(RuntimeSetupError, match="unknown GPU 'B200X'"):
        Nvml(environ={"SKYGREEN_SIMULATED_GPU": "B200X"})


# -- the simulated device's model ------------------------------------------------------------


def test_model_reproduces_the_study_at_150_of_250_w():
    assert model_energy_ratio(0.6) == pytest.approx(1 - 0.137, abs=1e-9)
    assert model_time_ratio(0.6) == pytest.approx(1.068, abs=1e-9)
    # lower caps draw less and take longer; above the uncapped draw a cap changes nothing
    assert model_time_ratio(0.5) > model_time_ratio(0.6) > model_time_ratio(0.7) > 1.0
    assert model_time_ratio(0.9) == model_time_ratio(1.0) == 1.0


def test_simulated_counter_only_grows_and_a_cap_lengthens_steps(tmp_path, clock):
    lib = sim(tmp_path, clock=clock)
    gpu = Nvml(lib).device(0)

    def step(host_s: float) -> tuple[float, float]:
        e0, t0 = gpu.energy_j(), clock()
        clock.now += host_s  # the host's share of the step
        gpu.synchronize()
        return gpu.energy_j() - e0, clock() - t0

    e_full, t_full = step(1.0)
    gpu.set_power_limit_w(180.0)  # 0.6 of 300 W
    e_cap, t_cap = step(1.0)
    assert t_cap / t_full == pytest.approx(1.068, rel=1e-6)
    assert e_cap / e_full == pytest.approx(0.863, rel=1e-4)  # the counter counts whole millijoules
    readings = [gpu.energy_j() for _ in range(3)]
    assert readings == sorted(readings) and readings[0] > 0


def test_simulated_limits_persist_across_processes(tmp_path):
    env = {**os.environ, "SKYGREEN_SIMULATED_GPU": "T4", "SKYGREEN_DATA_DIR": str(tmp_path)}
    code = "from skygreen.power.nvml import Nvml; g = Nvml().device(0); g.set_power_limit_w(60); print(g.energy_j())"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    later = Nvml(environ={"SKYGREEN_SIMULATED_GPU": "T4", "SKYGREEN_DATA_DIR": str(tmp_path)}).device(0)
    assert later.power_limit_w() == 60.0


# -- policy ---------------------------------------------------------------------------------

V100 = Limits(default_w=300.0, min_w=120.0, max_w=300.0)


def test_cap_requests_parse_and_resolve_with_one_clamp_line():
    assert CapRequest.parse("0.6") == CapRequest(mode="fraction", value=0.6)
    assert CapRequest.parse(150) == CapRequest(mode="watts", value=150.0)
    assert CapRequest.parse("auto").mode == "auto" and CapRequest.parse("OFF").mode == "off"
    assert resolve(CapRequest.parse("0.6"), V100).target_w == 180.0
    low = resolve(CapRequest.parse("60"), V100)
    assert low.target_w == 120.0 and low.clamp_note is not None
    assert low.clamp_note.count("\n") == 0 and "minimum, 120 W" in low.clamp_note
    assert resolve(CapRequest.parse("400"), V100).target_w == 300.0
    assert resolve(CapRequest.parse("auto"), V100).target_w is None
    assert clamp_w(200.0, V100) == (200.0, None)
    assert not needs_set(180.0, 180.2) and needs_set(180.0, 181.0)


def test_ladder_runs_from_max_to_min():
    assert ladder_w(Limits(default_w=70, min_w=28, max_w=70)) == (70.0, 45.0, 28.0)
    rungs = ladder_w(V100)
    assert rungs[0] == 300.0 and rungs[-1] == 120.0 and len(rungs) <= 8
    assert list(rungs) == sorted(rungs, reverse=True)


def test_zeus_chooser_follows_eta():
    fast = ProfilePoint(limit_w=300, energy_j=300.0, time_s=1.0)
    mid = ProfilePoint(limit_w=200, energy_j=220.0, time_s=1.1)
    slow = ProfilePoint(limit_w=120, energy_j=200.0, time_s=1.67)
    points = [fast, mid, slow]
    assert choose(points, eta=1.0) is slow  # energy only
    assert choose(points, eta=0.0) is fast  # time only
    assert choose(points, eta=0.5) is mid  # 0.5*220 + 0.5*300*1.1 = 275 < 300, 325.5
    profile = PowerProfile.from_points("V100", points, eta=0.5)
    assert profile.chosen_w == 200 and profile.saving_vs_uncapped == pytest.approx(1 - 220 / 300)
    assert PowerProfile.from_dict(profile.to_dict()) == profile


def test_a_chosen_limit_that_was_not_profiled_claims_no_saving():
    """A profile read back from a checkpoint edited by hand: its chosen limit is none of the rungs."""
    points = [
        ProfilePoint(limit_w=300, energy_j=300.0, time_s=1.0),
        ProfilePoint(limit_w=200, energy_j=220.0, time_s=1.1),
    ]
    edited = {**PowerProfile.from_points("V100", points, eta=0.5).to_dict(), "chosen_w": 250}
    profile = PowerProfile.from_dict(edited)
    assert profile.point(250.0) is None and profile.point(200.0) == points[1]
    assert profile.saving_vs_uncapped is None and profile.slowdown_vs_uncapped is None


def test_ladder_profiler_measures_after_warmup_and_skips_measured_rungs():
    prof = LadderProfiler("V100", (300.0, 200.0), warmup_steps=1, measure_steps=2, settle_steps=2)
    assert prof.limit_w == 300.0
    prof.step_done(1, 0.1)  # two settling steps: not measured
    prof.step_done(2, 0.2)
    assert prof.limit_w == 300.0
    for e, t in [(250.0, 1.0), (500.0, 2.0), (750.0, 3.0)]:  # warm-up, then two measured steps of 250 J / 1 s
        prof.step_done(e, t)
    assert prof.points == [ProfilePoint(limit_w=300.0, energy_j=250.0, time_s=1.0)] and prof.limit_w == 200.0
    for e, t in [(950, 4.05), (1150, 5.1), (1350, 6.15)]:  # 200 J / 1.05 s: 257.5 < 275
        prof.step_done(e, t)
    assert prof.profile is not None and prof.profile.chosen_w == 200.0
    resumed = LadderProfiler(
        "V100", (300.0, 200.0), warmup_steps=1, measure_steps=2, settle_steps=0, points=prof.points[:1]
    )
    assert resumed.limit_w == 200.0


# -- set and restore ------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SKYGREEN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return tmp_path / "data"


def test_cap_context_sets_once_and_restores(tmp_path, data_dir):
    lib = sim(tmp_path)
    with cap(0.6, nvml=Nvml(lib)) as caps:
        assert caps is not None and caps.active_w == {"GPU-simulated-v100-0": 180.0}
        original = OriginalLimits.default().get("GPU-simulated-v100-0")
        assert original is not None and original.original_limit_w == 300.0
    assert sets(lib) == [(0, 180000), (0, 300000)]
    assert OriginalLimits.default().get("GPU-simulated-v100-0") is None
    with cap(300, nvml=Nvml(lib)):  # already there: no call
        pass
    assert sets(lib) == [(0, 180000), (0, 300000)]


def test_cap_restores_after_an_exception_and_clamps(tmp_path, data_dir, caplog):
    lib = sim(tmp_path)
    with caplog.at_level(logging.WARNING, logger="skygreen.power"), pytest.raises(ZeroDivisionError):  # noqa: SIM117
        with cap(50, nvml=Nvml(lib)):
            raise ZeroDivisionError
    assert sets(lib) == [(0, 120000), (0, 300000)]
    assert [r.message for r in caplog.records if "outside this GPU's range" in r.message] == [
        "GPU 0: power cap 50 W is outside this GPU's range 120-300 W; using its minimum, 120 W"
    ]


def test_no_permission_is_one_line_then_uncapped_unless_required(tmp_path, data_dir, caplog):
    lib = sim(tmp_path, faults=("no-permission",))
    with caplog.at_level(logging.WARNING, logger="skygreen.power"), cap(0.6, nvml=Nvml(lib)) as caps:
        assert caps is None
    assert [r.message for r in caplog.records] == [
        "power cap 0.6 of the default limit not applied (no permission to set power limits); running uncapped"
    ]
    assert OriginalLimits.default().get("GPU-simulated-v100-0") is None
    with pytest.raises(PowerPermissionError), cap(0.6, nvml=Nvml(lib), required=True):
        pytest.fail("the block must not run")


def test_restore_all_restores_every_live_cap(tmp_path, data_dir):
    lib = sim(tmp_path, count=2)
    nvml = Nvml(lib)
    caps = PowerCaps(originals=OriginalLimits.default(), run_id="r1")
    for gpu in nvml.devices():
        caps.set(gpu, 200.0)
    assert restore_all() == 2
    assert restore_all() == 0  # idempotent
    assert sets(lib) == [(0, 200000), (1, 200000), (0, 300000), (1, 300000)]
    caps.close()


def test_kill_9_leaves_the_cap_and_the_next_start_restores_the_original(tmp_path, data_dir):
    """A real process caps the simulated GPU and is SIGKILLed inside the block."""
    env = {**os.environ, "SKYGREEN_SIMULATED_GPU": "V100"}
    code = textwrap.dedent(
        """
        import os, signal, skygreen.power
        with skygreen.power.cap(200):
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], env=env)
    assert done.returncode == -signal.SIGKILL
    env_now = {"SKYGREEN_SIMULATED_GPU": "V100", "SKYGREEN_DATA_DIR": str(data_dir)}
    lib = SimulatedNvml("V100", state_dir=data_dir / "simulated-gpu")
    gpu = Nvml(lib).device(0)
    assert gpu.power_limit_w() == 200.0  # the board keeps the cap, as a real one would
    left = OriginalLimits.default(env_now).get(gpu.uuid)
    assert left is not None and left.original_limit_w == 300.0 and not left.owner_alive
    # the next start caps again: it must first put back 300 W (not keep 200 W as "original")
    with cap(0.5, nvml=Nvml(lib)):
        assert gpu.power_limit_w() == 150.0
    assert gpu.power_limit_w() == 300.0
    assert lib.set_calls_w() == [200.0, 300.0, 150.0, 300.0]


def test_adopt_leaves_a_live_owners_cap_alone(tmp_path, data_dir):
    lib = sim(tmp_path)
    gpu = Nvml(lib).device(0)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # killed below
    try:
        from skygreen.power.originals import Original

        OriginalLimits.default().record(
            Original(uuid=gpu.uuid, gpu=gpu.name, original_limit_w=300.0, run_id="other", pid=holder.pid)
        )
        with pytest.raises(PowerError, match="another live skygreen process"):
            PowerCaps(originals=OriginalLimits.default()).adopt(gpu)
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    "content",
    [
        "[1, 2]",
        "42",
        '{"uuid": "x"}',
        '{"uuid": "x", "gpu": "V100", "original_limit_w": 300.0, "run_id": null, "pid": 1, "extra": 1}',
        '{"uuid": "x", "gpu": "V100", "original_limit_w": "300", "run_id": null, "pid": 1}',
        '{"uuid": "x", "gpu": "V100", "original_limit_w": 300.0, "run_id": null, "pid": 0}',
        "{not json",
    ],
)
def test_an_originals_file_that_is_not_a_record_reads_as_none_and_stops_nothing(tmp_path, data_dir, content):
    """A foreign or hand-edited originals file is treated as unreadable: `adopt` finds nothing to
    restore, a cap still sets and restores, and the real `skygreen power` command lists the GPU."""
    lib = sim(tmp_path)
    gpu = Nvml(lib).device(0)
    originals = OriginalLimits.default()
    originals.root.mkdir(parents=True)
    (originals.root / f"{gpu.uuid}.json").write_text(content)
    assert originals.get(gpu.uuid) is None and originals.all() == []
    assert PowerCaps(originals=originals).adopt(gpu) is None
    with cap(200, nvml=Nvml(lib)):
        assert gpu.power_limit_w() == 200.0
    assert gpu.power_limit_w() == 300.0

    (originals.root / f"{gpu.uuid}.json").write_text(content)
    env = {**os.environ, "SKYGREEN_DATA_DIR": str(data_dir), "SKYGREEN_SIMULATED_GPU": "V100"}
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "power", "--json"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr


# -- metering -------------------------------------------------------------------------------


def test_meter_uses_the_counter_and_says_simulated(tmp_path, clock):
    gpu = Nvml(sim(tmp_path, clock=clock)).device(0)
    meter = GpuEnergyMeter(gpu, clock=clock)
    clock.now += 10.0
    assert meter.measured_by == "nvml-counter" and meter.method == "simulated"
    assert meter.read_j() == pytest.approx(10.0 * 0.7425260718 * 300.0, rel=1e-6)


def test_meter_integrates_power_without_a_counter(tmp_path, clock):
    gpu = Nvml(sim(tmp_path, clock=clock, faults=("no-energy-counter",))).device(0)
    meter = GpuEnergyMeter(gpu, clock=clock, sample_interval_s=3600)
    try:
        assert meter.measured_by == "power-sampling"
        clock.now += 4.0
        gpu.set_power_limit_w(150.0)
        assert meter.read_j() == pytest.approx(4.0 * (222.757 + 150.0) / 2, rel=1e-3)  # trapezoid between samples
    finally:
        meter.close()


def test_limits_of_reads_the_board(tmp_path):
    assert limits_of(Nvml(sim(tmp_path, gpu="L4")).device(0)) == Limits(default_w=72.0, min_w=29.0, max_w=72.0)


def test_live_registry_is_emptied_by_close(tmp_path, data_dir):
    before = len(caps_mod._LIVE)
    with cap(0.7, nvml=Nvml(sim(tmp_path))):
        assert len(caps_mod._LIVE) == before + 1
    assert len(caps_mod._LIVE) == before


def test_importing_the_power_package_loads_no_outside_library():
    probe = "import sys, skygreen.power, skygreen.power.policy, skygreen.power.simulated; print(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert not {"pynvml", "torch", "numpy"} & set(eval(out))


def test_power_command_lists_gpus_and_caps(tmp_path):
    """The real `skygreen power` command, on a simulated GPU and on a machine without NVML."""
    import json

    env = {**os.environ, "SKYGREEN_DATA_DIR": str(tmp_path), "SKYGREEN_SIMULATED_GPU": "L4"}
    kill = "import os, signal, skygreen.power\nwith skygreen.power.cap(50):\n    os.kill(os.getpid(), signal.SIGKILL)"
    assert subprocess.run([sys.executable, "-c", kill], env=env).returncode == -signal.SIGKILL
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "power", "--json"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    (gpu,) = json.loads(out.stdout)["gpus"]
    assert (gpu["power_limit_w"], gpu["default_limit_w"], gpu["min_limit_w"], gpu["max_limit_w"]) == (
        50.0,
        72.0,
        29.0,
        72.0,
    )
    assert gpu["simulated"] and gpu["skygreen_cap"]["state"] == "left by a killed process"
    text = subprocess.run([sys.executable, "-m", "skygreen.cli", "power"], env=env, capture_output=True, text=True)
    assert text.returncode == 0 and "L4 (simulated)" in text.stdout and "simulated GPU" in text.stdout
    env.pop("SKYGREEN_SIMULATED_GPU")
    real = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "power", "--json"], env=env, capture_output=True, text=True
    )
    report = json.loads(real.stdout)
    assert real.returncode == 0 and not any(g["simulated"] for g in report["gpus"])
    assert report["gpus"] or report["reason"]  # no GPU here: it says why (and exits 0)


def test_energy_report_applies_the_clouds_pue_and_the_regions_carbon():
    from skygreen.plan import carbon
    from skygreen.plan.cost import PUE
    from skygreen.power.statement import energy_report, meta_energy, statement

    meta = {
        "energy_j": 7.2e6,
        "wall_s": 3600,
        "power": {"method": "nvml-counter", "cap_w": 250.0, "default_limit_w": 400.0, "gpus": 2},
    }
    r = energy_report(meta, meta_energy(meta, cloud="GCP", region="us-central1"))
    assert r.gpu_kwh == 2.0 and r.pue == PUE["gcp"] and r.facility_kwh == pytest.approx(2.0 * PUE["gcp"])
    assert r.co2e_kg == pytest.approx(r.facility_kwh * carbon.intensity("gcp", "us-central1").g_co2e_per_kwh / 1000)
    assert r.gpu_hours == 2.0
    text = statement(r, run_id="r1", compute_usd=3.5)
    assert "2.00 kWh on the GPUs, measured with NVML's total-energy counter" in text
    assert "power cap of 250 W of 400 W default" in text and "$3.50" in text and "on gcp us-central1." in text
    cpu_meta = {"wall_s": 10, "power": {"method": "none", "reason": "no GPU: this run trained on CPU"}}
    cpu = energy_report(cpu_meta, meta_energy(cpu_meta, cloud=None, region=None))
    assert (
        cpu.gpu_hours == 0
        and cpu.co2e_kg == 0
        and "No GPU energy was metered (no GPU" in statement(cpu, run_id="c", compute_usd=None)
    )


def test_power_section_of_the_task_file_reaches_the_runtime_settings():
    from skygreen.errors import SpecError
    from skygreen.task.settings import RuntimeSettings
    from skygreen.task.spec import parse_spec_text

    spec = parse_spec_text("skygreen: {power: {cap: 0.6, required: true, eta: 0.3}}\nrun: python train.py\n")
    power = spec.green.power
    assert (power.mode, power.cap_fraction, power.required, power.eta) == ("fraction", 0.6, True, 0.3)
    env = RuntimeSettings.from_spec(spec.green, run_id="r", bucket="/b").to_env()
    assert (env["SKYGREEN_POWER_CAP"], env["SKYGREEN_POWER_REQUIRED"], env["SKYGREEN_POWER_ETA"]) == (
        "0.6",
        "true",
        "0.3",
    )
    back = RuntimeSettings.from_env(env)
    assert (back.power_cap, back.power_required, back.power_eta) == (CapRequest(mode="fraction", value=0.6), True, 0.3)
    with pytest.raises(SpecError, match=r"skygreen\.power\.eta"):
        parse_spec_text("skygreen: {power: {eta: 2}}\nrun: python train.py\n")
    with pytest.raises(SpecError, match=r"skygreen\.power\.required"):
        parse_spec_text("skygreen: {power: {required: maybe}}\nrun: python train.py\n")
