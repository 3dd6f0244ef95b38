"""PowerGovernor, the runtime's power side, against the simulated GPU at the pynvml boundary."""

from __future__ import annotations

import logging

import pytest

from skygreen.errors import RuntimeSetupError
from skygreen.power.entry import open_gpu
from skygreen.power.governor import PowerGovernor
from skygreen.power.model import model_draw_fraction, model_time_ratio
from skygreen.power.nvml import Nvml
from skygreen.power.originals import OriginalLimits
from skygreen.power.policy import CapRequest, Limits, ProfilePoint, choose, ladder_w
from skygreen.power.simulated import SimulatedNvml

SET = "nvmlDeviceSetPowerManagementLimit"


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock():
    return FakeClock()


def make(tmp_path, clock, cap="auto", *, faults=(), gpu="V100", **kw):
    lib = SimulatedNvml(gpu, state_dir=tmp_path / "sim", faults=faults, clock=clock, sleep=clock.sleep)
    device = Nvml(lib).device(0)
    gov = PowerGovernor(device, request=CapRequest.parse(cap), originals=OriginalLimits(tmp_path / "ledger"), run_id="r",
                        warmup_steps=1, measure_steps=2, settle_steps=0, clock=clock, **kw)  # fmt: skip
    return lib, gov


def sets_w(lib):
    return [args[1] / 1000 for name, args in lib.calls if name == SET]


def train(gov, clock, steps, host_s=1.0):
    for _ in range(steps):
        clock.now += host_s
        gov.step_done()


def test_fixed_cap_is_set_once_and_restored(tmp_path, clock):
    lib, gov = make(tmp_path, clock, "0.6")
    gov.start()
    train(gov, clock, 5)
    assert gov.cap_w == 180.0 and gov.state_dict()["cap_w"] == 180.0
    gov.close()
    gov.close()
    assert sets_w(lib) == [180.0, 300.0]


def test_auto_profiles_the_ladder_then_keeps_the_models_best(tmp_path, clock):
    lib, gov = make(tmp_path, clock)
    gov.start()
    ladder = ladder_w(Limits(default_w=300.0, min_w=120.0, max_w=300.0))
    train(gov, clock, len(ladder) * 3)
    assert gov.profile is not None
    expected = choose(
        [
            ProfilePoint(
                limit_w=w,
                energy_j=model_draw_fraction(w / 300) * 300 * model_time_ratio(w / 300),
                time_s=model_time_ratio(w / 300),
            )
            for w in ladder
        ],
        eta=0.5,
    )
    assert gov.profile.chosen_w == expected.limit_w
    # the first rung is the max, which the board already has: no call for it
    assert sets_w(lib) == [*ladder[1:], expected.limit_w]
    state = gov.state_dict()
    assert state["profile"]["chosen_w"] == expected.limit_w and state["saving_vs_uncapped"] > 0.1
    train(gov, clock, 3)
    gov.close()
    assert sets_w(lib)[-1] == 300.0 and len(sets_w(lib)) == len(ladder) + 1


def test_resume_on_the_same_gpu_type_does_not_profile_again(tmp_path, clock):
    _, gov = make(tmp_path, clock)
    gov.start()
    train(gov, clock, 30)
    saved = gov.state_dict()
    gov.close()
    lib2, again = make(tmp_path, clock)
    again.start(saved)
    assert again.profiler is None and again.cap_w == saved["profile"]["chosen_w"]
    again.close()
    assert sets_w(lib2) == [saved["profile"]["chosen_w"], 300.0]
    _, other = make(tmp_path, clock, gpu="A100")
    other.start(saved)  # profiled on a V100: an A100 profiles again
    assert other.profiler is not None and other.profiler.limit_w == 400.0
    other.close()


def test_resume_from_a_hand_edited_profile_keeps_its_cap_and_claims_no_saving(tmp_path, clock):
    """A checkpoint whose profile names a chosen limit it never profiled: the cap applies, each
    checkpoint's state still saves, and no energy saving is claimed."""
    _, gov = make(tmp_path, clock)
    gov.start()
    train(gov, clock, 30)
    saved = gov.state_dict()
    gov.close()
    edited = {**saved, "profile": {**saved["profile"], "chosen_w": 251.0}}
    lib2, again = make(tmp_path, clock)
    again.start(edited)
    train(again, clock, 3)
    state, summary = again.state_dict(), again.summary()
    assert again.cap_w == 251.0 and state["profile"]["chosen_w"] == 251.0
    assert state["saving_vs_uncapped"] is None and summary["saving_vs_uncapped"] is None
    again.close()
    assert sets_w(lib2) == [251.0, 300.0]


def test_a_profile_cut_by_preemption_goes_on_from_the_next_rung(tmp_path, clock):
    _, gov = make(tmp_path, clock)
    gov.start()
    train(gov, clock, 7)  # two rungs measured, the third begun
    saved = gov.state_dict()
    assert len(saved["points"]) == 2 and saved["profile"] is None
    gov.close()
    _, again = make(tmp_path, clock)
    again.start(saved)
    assert again.profiler.limit_w == again.profiler.ladder[2]
    again.close()


def test_no_permission_is_one_line_then_metering(tmp_path, clock, caplog):
    _, gov = make(tmp_path, clock, "0.6", faults=("no-permission",))
    with caplog.at_level(logging.WARNING, logger="skygreen.power"):
        gov.start()
    train(gov, clock, 2)
    assert [r.message for r in caplog.records] == [
        (
            "power cap 0.6 of the default limit not applied: no permission to set GPU power limits "
            "(needs CAP_SYS_ADMIN or root); metering energy only"
        )
    ]
    assert gov.cap_w is None and gov.take_j() > 0 and gov.method == "simulated"
    gov.close()


def test_required_fails_before_training(tmp_path, clock):
    lib, gov = make(tmp_path, clock, "auto", faults=("no-permission",), required=True)
    with pytest.raises(RuntimeSetupError, match=r"power\.required is true"):
        gov.start()
    assert sets_w(lib) == [300.0]  # the permission probe: the current limit, set again
    cpu = PowerGovernor(None, request=CapRequest.parse("0.6"), required=True, reason="no GPU: this run trained on CPU")
    with pytest.raises(RuntimeSetupError, match="no GPU"):
        cpu.start()


def test_cpu_run_meters_nothing_and_says_why():
    gpu, reason = open_gpu(cuda_uuid=None, local_rank=0, environ={})
    gov = PowerGovernor(gpu, request=CapRequest.parse("auto"), reason=reason)
    gov.start()
    gov.step_done()
    assert gov.method == "none" and gov.take_j() == 0.0
    assert gov.state_dict()["reason"] == "no GPU: this run trained on CPU"


def test_open_gpu_gives_each_rank_its_simulated_board(tmp_path):
    env = {"SKYGREEN_SIMULATED_GPU": "H100:2", "SKYGREEN_DATA_DIR": str(tmp_path)}
    second, _ = open_gpu(cuda_uuid=None, local_rank=1, environ=env)
    assert second is not None and second.uuid == "GPU-simulated-h100-1"
    gpu, reason = open_gpu(cuda_uuid=None, local_rank=2, environ=env)
    assert gpu is None and reason is not None and "none for local rank 2" in reason


def test_energy_is_taken_in_increments(tmp_path, clock):
    lib, gov = make(tmp_path, clock, "off")
    gov.start()
    clock.now += 2.0
    first = gov.take_j()
    clock.now += 2.0
    second = gov.take_j()
    assert first == pytest.approx(second, rel=1e-3) and first == pytest.approx(2.0 * 0.74253 * 300, rel=1e-3)
    assert sets_w(lib) == []
    gov.close()


def test_without_the_ledger_the_checkpoint_still_restores_the_original(tmp_path, clock):
    """A killed run whose machine lost skygreen's data folder: the checkpoint's record is used."""
    lib, gov = make(tmp_path, clock, "0.6")
    gov.start()
    saved = gov.state_dict()  # what the last checkpoint before the kill held
    assert saved["original_limit_w"] == 300.0 and saved["cap_w"] == 180.0
    import shutil

    shutil.rmtree(tmp_path / "ledger")  # the process dies without restoring; its ledger is gone too
    from skygreen.power import caps as caps_mod

    caps_mod._LIVE.remove(gov.caps)  # ...and its in-memory registry with it
    again = PowerGovernor(
        Nvml(lib).device(0),
        request=CapRequest.parse("0.5"),
        originals=OriginalLimits(tmp_path / "ledger2"),
        clock=clock,
    )
    again.start(saved)
    assert sets_w(lib) == [180.0, 300.0, 150.0]  # the original first, then the new cap
    again.close()
    assert sets_w(lib)[-1] == 300.0
