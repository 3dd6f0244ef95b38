"""Preemption: the clouds' notices (against a loopback metadata server), and SIGTERM/SIGKILL
sent to a real training subprocess, which must resume to a bit-identical end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import ddp_train as job
from metadata_server import MetadataServer
from skygreen.checkpoint.manifest import committed_steps, read_manifest
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import RuntimeSetupError
from skygreen.runtime import PREEMPTED_EXIT_CODE
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV
from skygreen.runtime.preemption import CHECKS, NoticeWatcher, landed_cloud
from skygreen.runtime.tensors import first_difference

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.py"
IGNORE = frozenset(
    {
        "state['training']['counters']['wall_s']",
        "state['training']['counters']['restarts']",
        "state['training']['counters']['preemptions']",
    }
)


# -- the notice endpoints ------------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_each_cloud_notice_is_read_with_its_protocol(cloud):
    with MetadataServer(cloud) as server:
        assert CHECKS[cloud](server.url) is None
        server.notice = True
        notice = CHECKS[cloud](server.url)
        assert notice is not None and notice.cloud == cloud
        assert server.rejected == 0  # token / headers as the real endpoints demand


def test_azure_events_other_than_preempt_are_not_notices():
    with MetadataServer("azure") as server:
        server.notice = True
        server.azure_event_type = "Freeze"
        assert CHECKS["azure"](server.url) is None


@pytest.mark.parametrize("events", [5, "Preempt", {"EventType": "Preempt"}, [1, "Preempt"], True])
def test_a_malformed_azure_answer_is_no_notice_and_the_watcher_keeps_watching(events):
    with MetadataServer("azure") as server:
        server.notice = True
        server.azure_events = events
        assert CHECKS["azure"](server.url) is None
        watcher = NoticeWatcher("azure", base_url=server.url, poll_s=0.02).start()
        try:
            deadline = time.monotonic() + 120  # generous: a loaded machine may pause this thread for seconds
            while server.polls < 4 and time.monotonic() < deadline:  # several malformed answers in a row
                time.sleep(0.02)
            assert server.polls >= 4 and watcher.pending() is None
            server.azure_events = None  # now a well-formed Preempt event
            deadline = time.monotonic() + 120
            while (notice := watcher.pending()) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert notice is not None and "Preempt" in notice.detail
        finally:
            watcher.stop()


def test_a_watcher_for_an_unknown_cloud_is_a_clear_setup_error():
    with pytest.raises(
        RuntimeSetupError, match=r"no preemption notice check for cloud 'oci'\n  allowed: aws, azure, gcp"
    ):
        NoticeWatcher.from_env("oci", {})


def test_watcher_reports_each_notice_once_and_survives_no_server():
    with MetadataServer("gcp") as server:
        watcher = NoticeWatcher("gcp", base_url=server.url, poll_s=0.02).start()
        try:
            time.sleep(0.1)
            assert watcher.pending() is None
            server.notice = True
            deadline = time.monotonic() + 120
            while (notice := watcher.pending()) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert notice is not None and "TRUE" in notice.detail
            time.sleep(0.1)
            assert watcher.pending() is None  # still up, already reported
        finally:
            watcher.stop()
    dead = NoticeWatcher("aws", base_url="http://127.0.0.1:9", poll_s=0.02).start()
    time.sleep(0.1)
    assert dead.pending() is None
    dead.stop()


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ('{"cluster_name": "c", "cloud": "AWS", "region": "us-east-1", "zone": null}', "aws"),
        ('{"cloud": "GCP"}', "gcp"),
        ('{"cloud": "Azure"}', "azure"),
        ('{"cloud": "Kubernetes"}', None),
        ("not json", None),
        ("[1, 2]", None),
        ("", None),
    ],
)
def test_the_landed_cloud_comes_from_skypilots_cluster_info(info, expected):
    assert landed_cloud(None, {"SKYPILOT_CLUSTER_INFO": info}) == expected
    assert landed_cloud("gcp", {"SKYPILOT_CLUSTER_INFO": info}) == "gcp"  # SKYGREEN_CLOUD wins


@pytest.mark.parametrize("cloud_known_by", ["settings", "skypilot"])
def test_a_notice_commits_a_checkpoint_at_the_next_boundary_and_training_goes_on(tmp_path, cloud_known_by):
    with MetadataServer("aws") as server:
        environ = {"SKYGREEN_AWS_METADATA_URL": server.url, "SKYGREEN_NOTICE_POLL_S": "0.02"}
        if cloud_known_by == "skypilot":  # as on a managed job's VM, where `up` cannot know the cloud
            environ["SKYPILOT_CLUSTER_INFO"] = (
                '{"cluster_name": "c", "cloud": "AWS", "region": "us-east-1", "zone": null}'
            )
        seen: dict = {}

        def raise_notice_during_step_5(net):
            def hook(module, inputs):
                if seen.get("step") == 5 and not server.notice:
                    server.notice = True
                    polls = server.polls
                    deadline = time.monotonic() + 120
                    while server.polls < polls + 2:  # the watcher has seen it
                        assert time.monotonic() < deadline, "the watcher never polled the notice"
                        time.sleep(0.01)

            net[0].register_forward_pre_hook(hook)

        cloud = "aws" if cloud_known_by == "settings" else None
        run_settings = job.settings(tmp_path, cloud=cloud, checkpoint_every_steps=1000)

        class Tracing(list):  # tells the hook which step is running
            def append(self, item):
                seen["step"] = item[0]
                super().append(item)

        trace = Tracing()
        run = job.train(run_settings, 12, hooks=raise_notice_during_step_5, environ=environ, trace=trace)
    assert run.step_index == 12
    store = open_store(f"{tmp_path}/run")
    steps = committed_steps(store)
    assert 6 in steps and 12 in steps  # step 5 ends at boundary 6; the final one at 12
    assert read_manifest(store, 6).meta["reason"] == "preemption-notice"
    assert read_manifest(store, 12).meta["state"] == "completed"
    assert len(steps) == 2  # the notice stayed up: one checkpoint for it, not one per step


# -- real signals to a real training process -----------------------------------------------


def tiny_env(bucket: Path, run_id: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKYGREEN_")}
    env.update(
        SKYGREEN_RUN_ID=run_id,
        SKYGREEN_BUCKET=str(bucket),
        SKYGREEN_EFFECTIVE_BATCH="16",
        SKYGREEN_MICRO_BATCH="4",
        SKYGREEN_PRECISION="fp32",
        SKYGREEN_CHECKPOINT_EVERY_STEPS="5",
        TINY_STEPS="40",
        TINY_EVAL_EVERY="10",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
    )
    env.update(extra)
    return env


def start_tiny(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(TINY)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_commit(bucket: Path, run_id: str, proc: subprocess.Popen, *, after: int = -1) -> int:
    store = open_store(f"{bucket}/{run_id}")
    deadline = time.monotonic() + 300  # generous: starting torch on a loaded machine can take a while
    while time.monotonic() < deadline:
        steps = [s for s in committed_steps(store) if s > after]
        if steps:
            return max(steps)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("no checkpoint committed")


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory):
    bucket = tmp_path_factory.mktemp("tiny-reference")
    proc = start_tiny(tiny_env(bucket, "ref"))
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return Checkpointer(f"{bucket}/ref").load_latest()


def finish_and_compare(bucket: Path, reference) -> None:
    proc = start_tiny(tiny_env(bucket, "victim"))
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    final = Checkpointer(f"{bucket}/victim").load_latest()
    assert final.manifest.meta["state"] == "completed"
    assert final.step == reference.step == 40
    assert first_difference(reference.state, final.state, ignore=IGNORE) is None, first_difference(
        reference.state, final.state, ignore=IGNORE
    )
    assert first_difference(reference.rank_state, final.rank_state) is None


def test_sigterm_commits_exits_75_and_the_restart_ends_identical(tmp_path, tiny_reference):
    proc = start_tiny(tiny_env(tmp_path, "victim", **{HOLD_ENV: "5"}))  # commits step 5 and waits there
    first = wait_for_commit(tmp_path, "victim", proc)
    assert first == 5 and proc.poll() is None  # held: the SIGTERM cannot come after the end
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err
    assert "skygreen: checkpoint interval: every 5 steps" in err  # the chosen interval is logged
    assert "skygreen: SIGTERM; checkpointing at the next step boundary" in err
    store = open_store(f"{tmp_path}/victim")
    last = max(committed_steps(store))
    assert last > first
    meta = read_manifest(store, last).meta
    assert meta["state"] == "preempted" and meta["preemptions"] == 1
    finish_and_compare(tmp_path, tiny_reference)


@pytest.mark.parametrize("delay_s", [0.0, 0.15, 0.4])
def test_sigkill_anywhere_resumes_from_the_last_commit_and_ends_identical(tmp_path, tiny_reference, delay_s):
    # Held at step 5 until released, and again at step 30: the kill lands somewhere between the
    # two, never after the run finished, however the machine schedules the two processes.
    release = tmp_path / "release"
    release.mkdir()
    proc = start_tiny(tiny_env(tmp_path, "victim", **{HOLD_ENV: "5,30", RELEASE_ENV: str(release)}))
    assert wait_for_commit(tmp_path, "victim", proc) == 5
    (release / "5").touch()
    time.sleep(delay_s)  # lands mid-step, mid-upload or between, depending on the machine
    assert proc.poll() is None
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    finish_and_compare(tmp_path, tiny_reference)


SLOW_STEP = """
import time, torch, torch.nn.functional as F
import skygreen.runtime as sg
model = torch.nn.Linear(4, 2)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
run = sg.Run(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataset=data)
for step in run.steps(100):
    with step:
        for x, y in step.micro_batches():
            print("step", step.index, flush=True)
            if step.index == 1:
                time.sleep(3600)  # a step that never ends within the test: only the deadline ends the run
            step.backward(F.cross_entropy(run.model(x), y))
        step.optimizer_step()
"""


def test_sigterm_deadline_exits_75_even_when_the_step_never_ends(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text(SLOW_STEP)
    env = tiny_env(tmp_path, "slow", SKYGREEN_SIGTERM_DEADLINE_S="1", SKYGREEN_CHECKPOINT_EVERY_STEPS="1")
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for_commit(tmp_path, "slow", proc)
    for line in proc.stdout:
        if line.startswith("step 1"):
            break
    proc.send_signal(signal.SIGTERM)
    try:
        _out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the SIGTERM deadline did not end a run stuck in a step") from None
    assert proc.returncode == PREEMPTED_EXIT_CODE, err
    assert "no checkpoint committed within 1 s of SIGTERM" in err
    assert committed_steps(open_store(f"{tmp_path}/slow")) == [1]  # the previous commit stands
