"""The runtime's parts, each built from explicit arguments and used without a `Run`."""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import skygreen.runtime as sg
from skygreen.errors import RuntimeSetupError
from skygreen.ledger.io import read_ledger
from skygreen.power.policy import CapRequest
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.power import open_governor
from skygreen.runtime.preemption import PreemptionWatch
from skygreen.runtime.ranks import World
from skygreen.runtime.run_book import RunBook
from skygreen.runtime.services import open_services
from skygreen.runtime.state import BatchShape, StateGroup, TrainingState, upgrade_layout
from skygreen.runtime.step import Step, StepParts
from skygreen.runtime.tensors import first_difference
from skygreen.task.settings import RuntimeSettings
from skygreen.task.spec import EarlyStopConfig

PUBLIC = [
    "PREEMPTED_EXIT_CODE", "BatchShape", "Checkpointer", "EarlyStopper", "Loaded", "PowerGovernor",
    "PreemptionWatch", "Run", "RunBook", "RunServices", "RuntimeSettings", "StateGroup", "Stateful", "Step",
    "StepParts", "TrainingState", "World", "open_checkpointer", "open_governor", "open_schedule", "open_services",
    "open_stopper",
    "ShardedCheckpointer", "open_sharded_checkpointer", "shard", "sharded_states", "task_precision",
]  # fmt: skip


def settings(tmp_path, **kw) -> RuntimeSettings:
    return RuntimeSettings(run_id="r1", bucket=str(tmp_path / "bucket"), **kw)


def test_the_public_surface_is_pinned_documented_and_imports_no_torch():
    assert sorted(sg.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        obj = getattr(sg, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{name} has no docstring"
    for fn in (sg.open_services, sg.open_checkpointer, sg.open_governor, sg.open_sharded_checkpointer):
        doc = inspect.getdoc(fn) or ""
        assert "Args:" in doc and "Returns:" in doc and "Raises:" in doc, fn.__name__
    probe = "import sys, skygreen.runtime as sg; sg.__all__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_runtime_modules_take_no_run():
    """No part reads a whole `Run` (typed as such or as Any): each takes explicit arguments."""
    root = Path(sg.__file__).parent
    for name in (
        "power.py",
        "run_book.py",
        "step.py",
        "state.py",
        "services.py",
        "checkpointer.py",
        "fsdp.py",
        "sharded.py",
    ):
        source = (root / name).read_text(encoding="utf-8")
        tree = ast.parse(source)
        args = [a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs]
        assert "run" not in args, name
        assert "_environ" not in source, name


def test_training_state_round_trips_and_reads_the_old_layout():
    state = TrainingState(batch=BatchShape(effective=12, micro=3, micro_auto=True, device_name="cpu"))
    state.advance()
    state.advance()
    state.counters["energy_j"] = 5.0
    again = TrainingState(batch=BatchShape(effective=12, micro=3))
    again.load_state_dict(state.state_dict())
    assert (again.step, again.samples_seen, again.counters["energy_j"], again.completed) == (2, 24, 5.0, False)
    old = {
        "model": {},
        "progress": {"step": 7, "samples_seen": 84},
        "batch": {"effective": 12, "micro": 6, "micro_auto": True, "device_name": "L4"},
        "counters": {"energy_j": 1.0, "wall_s": 2.0, "preemptions": 1, "restarts": 2},
    }
    new = upgrade_layout(old)
    assert "progress" not in new and new["training"]["step"] == 7
    assert TrainingState.saved_batch(new["training"]) == BatchShape(
        effective=12, micro=6, micro_auto=True, device_name="L4"
    )
    with pytest.raises(ValueError, match="must be >= 1"):
        BatchShape(effective=0, micro=1)


def test_the_checkpointer_saves_and_restores_a_mapping_of_stateful_objects(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    training = TrainingState(batch=BatchShape(effective=8, micro=4), step=3, samples_seen=24)
    extra = StateGroup({"ema": torch.nn.Linear(2, 2)})
    with Checkpointer(str(tmp_path / "ck")) as ck:
        ck.save_state(3, {"model": model, "optimizer": opt, "training": training, "extra": extra, "none": None})
        ck.wait()
    fresh_model, fresh_extra = torch.nn.Linear(4, 2), StateGroup({"ema": torch.nn.Linear(2, 2)})
    fresh_opt = torch.optim.AdamW(fresh_model.parameters(), lr=0.1)
    fresh_training = TrainingState(batch=BatchShape(effective=8, micro=4))
    missing_obj = torch.nn.Linear(1, 1)
    before = missing_obj.weight.clone()
    with Checkpointer(str(tmp_path / "ck")) as ck:
        loaded = ck.restore_state(
            {"model": fresh_model, "optimizer": fresh_opt, "training": fresh_training, "extra": fresh_extra,
             "not_saved": missing_obj}
        )  # fmt: skip
    assert loaded is not None and loaded.step == 3
    assert torch.equal(fresh_model.weight, model.weight)
    assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert (fresh_training.step, fresh_training.samples_seen) == (3, 24)
    ema, fresh_ema = extra.objects["ema"], fresh_extra.objects["ema"]
    assert isinstance(ema, torch.nn.Linear) and isinstance(fresh_ema, torch.nn.Linear)
    assert torch.equal(fresh_ema.weight, ema.weight)
    assert torch.equal(missing_obj.weight, before), "an object the checkpoint lacks keeps its state"
    with Checkpointer(str(tmp_path / "empty")) as ck:
        assert ck.restore_state({"model": fresh_model}) is None
    with Checkpointer(str(tmp_path / "ck2")) as ck, pytest.raises(TypeError, match="'bad'"):
        ck.save_state(1, {"bad": object()})  # type: ignore[dict-item]


def test_world_reads_torchrun_and_refuses_nonsense():
    assert World.from_env({}) == World(rank=0, size=1, local_rank=0)
    world = World.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert not world.leader and world.size == 2
    with pytest.raises(RuntimeSetupError, match="RANK"):
        World.from_env({"RANK": "x"})
    with pytest.raises(RuntimeSetupError, match="WORLD_SIZE"):
        World.from_env({"RANK": "2", "WORLD_SIZE": "2"})
    assert World().agree(True, False) == [True, False]


def test_the_governor_is_built_from_settings_device_and_world(tmp_path):
    env = {"SKYGREEN_DATA_DIR": str(tmp_path / "data")}
    gov = open_governor(settings(tmp_path), device=torch.device("cpu"), world=World(), environ=env)
    gov.start()
    assert gov.gpu is None and gov.method == "none" and gov.take_j() == 0.0
    gov.close()
    smoke = open_governor(settings(tmp_path), device=torch.device("cpu"), world=World(), environ=env, smoke=True)
    assert smoke.reason == "smoke test on CPU"
    with pytest.raises(RuntimeSetupError, match="SKYGREEN_POWER_PROFILE_STEPS"):
        open_governor(
            settings(tmp_path),
            device=torch.device("cpu"),
            world=World(),
            environ={**env, "SKYGREEN_POWER_PROFILE_STEPS": "0,1"},
        )
    required = open_governor(settings(tmp_path, power_cap=CapRequest.parse("200"), power_required=True), device=torch.device("cpu"),
                             world=World(), environ=env)  # fmt: skip
    with pytest.raises(RuntimeSetupError, match=r"power\.required"):
        required.start()


def test_the_run_book_writes_a_segment_on_rank_0_only(tmp_path):
    ck = Checkpointer(str(tmp_path / "bucket" / "r1"))
    kw: dict[str, Any] = {"store": ck.store, "device_name": None, "environ": {}, "metering": False}
    assert RunBook.open(settings(tmp_path), world=World(rank=1, size=2), **kw) is None
    assert RunBook.open(settings(tmp_path), world=World(), smoke=True, **kw) is None
    book = RunBook.open(settings(tmp_path, budget_usd=5.0), world=World(), **kw)
    assert book is not None
    training = TrainingState(batch=BatchShape(effective=4, micro=4), step=2, samples_seen=8)
    book.started_from(training, samples_per_epoch=100, total_steps=10)
    book.step_started()
    training.advance()
    book.progress_of(training, "completed")
    (segment,) = read_ledger(ck.store)
    assert (segment.step, segment.samples, segment.end, segment.energy_j) == (3, 12, "completed", None)
    assert not book.over_budget()  # a local run costs nothing
    ck.close()


def test_the_preemption_watch_turns_sigterm_into_a_flag_and_puts_the_handler_back(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    watch = PreemptionWatch(cloud=None, environ={}, exit_code=75).start()
    assert not watch.sigterm and watch.notice() is None
    os.kill(os.getpid(), signal.SIGTERM)
    assert watch.sigterm
    watch.stop()
    assert signal.getsignal(signal.SIGTERM) == before
    with pytest.raises(RuntimeSetupError):
        PreemptionWatch(cloud="nimbus", environ={}, exit_code=75)


def test_services_report_drives_early_stopping(tmp_path):
    stop = EarlyStopConfig(metric="val_loss", mode="min", patience=1, min_delta=0.0, grace=0)
    env = {"SKYGREEN_DATA_DIR": str(tmp_path / "data")}
    services = open_services(
        settings(tmp_path, early_stop=stop), device=torch.device("cpu"), world=World(), environ=env
    )
    assert services.store is services.checkpointer.store
    assert not services.report({"val_loss": 1.0}, step=1)
    assert not services.report({"train_loss": 9.0}, step=2)
    assert services.report({"val_loss": 2.0}, step=3)
    assert services.metric({"val_loss": float("nan")}) is None and services.metric({"val_loss": 2.0}) == 2.0
    assert not services.over_budget()
    services.close()


class ListFeed:
    """A `BatchFeed` over a fixed list of micro-batches (what a trainer's own loader would be)."""

    def __init__(self, batches):
        self.batches = iter(batches)
        self.accum_steps = 2
        self.probing = False
        self.epoch = 0

    def next_micro_batch(self):
        return next(self.batches)

    def shrink_micro_batch(self, error, step):
        raise AssertionError("not probing")

    def count_probe_step(self):
        pass


def test_a_step_accumulates_exactly_like_the_plain_loop_and_advances_the_training_state():
    torch.manual_seed(0)
    data = [torch.randn(4, 3) for _ in range(2)]
    a, b = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    for x in data:
        (a(x).pow(2).mean() / 2).backward()
    opt_a.step()
    training = TrainingState(batch=BatchShape(effective=8, micro=4))
    from skygreen.runtime.precision import PrecisionChoice

    parts = StepParts(
        model=b, module=b, optimizer=opt_b, scheduler=None, scaler=torch.amp.GradScaler("cpu", enabled=False),
        precision=PrecisionChoice(precision="fp32", grad_scaler=False, requested="fp32"), autocast=contextlib.nullcontext,
        training=training, world=World(),
    )  # fmt: skip
    with Step(0, parts=parts, feed=ListFeed(data)) as step:
        for x in step.micro_batches():
            step.backward(b(x).pow(2).mean())
        step.optimizer_step()
    assert step.done and (training.step, training.samples_seen) == (1, 8)
    assert torch.equal(a.weight, b.weight)


def test_a_checkpoint_written_before_the_training_record_resumes_bit_identical(tmp_path):
    """A checkpoint in the earlier layout (`progress`, `batch`, `counters` at the top level) still
    resumes, and the run ends exactly where an uninterrupted one does."""
    sys.path.insert(0, str(Path(__file__).parent))
    import ddp_train as job

    reference = job.train(job.settings(tmp_path / "ref"), 6)
    with pytest.raises(job.Crash):
        job.train(job.settings(tmp_path / "new"), 6, crash_at=(5, 1))
    with Checkpointer(f"{tmp_path}/new/run") as ck:
        saved = ck.load_latest()
    assert saved is not None and saved.step == 4 and saved.rank_state is not None
    old = {k: v for k, v in saved.state.items() if k != "training"}
    training = saved.state["training"]
    old["progress"] = {"step": training["step"], "samples_seen": training["samples_seen"]}
    old["batch"] = training["batch"]
    old["counters"] = training["counters"]
    with Checkpointer(f"{tmp_path}/old/run") as ck:
        ck.save(4, old, rank_state=saved.rank_state, meta=dict(saved.manifest.meta))
    resumed = job.train(job.settings(tmp_path / "old"), 6)
    assert resumed.step_index == 6 and resumed.counters["restarts"] == 1
    with Checkpointer(f"{tmp_path}/ref/run") as a, Checkpointer(f"{tmp_path}/old/run") as b:
        want, got = a.load_latest(), b.load_latest()
    assert want is not None and got is not None and reference.completed
    ignore = frozenset({"state['training']['counters']['wall_s']", "state['training']['counters']['restarts']"})
    assert first_difference(want.state, got.state, ignore=ignore) is None
