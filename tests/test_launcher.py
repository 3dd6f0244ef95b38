"""The SkyPilot adapter against SkyPilot's real objects, offline, with a private HOME.

Task construction and schema: a rendered task becomes a real `sky.Task`. Error types: real
SkyPilot exceptions map to `LaunchError`s with the fix. Job records: real `ManagedJobRecord`s
and every `ManagedJobStatus` map to skygreen's states. One test talks to a real SkyPilot API
server, started by SkyPilot's own client on a free loopback port in a private runtime folder,
and stopped at the end; with no cloud credentials, launching fails as it does for a user who
never ran `sky check`.
"""

from __future__ import annotations

import builtins
import json
import subprocess
import sys
import textwrap

import pytest

from servers import free_port
from sky_server import SMALL_CATALOG, sky_env, stop_server
from skygreen.errors import LaunchError
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.launch.launcher import JobState, Launcher
from skygreen.launch.render import render_task
from skygreen.launch.skypilot_launcher import (
    ERROR_TABLE,
    STATE_TABLE,
    SkyPilotLauncher,
    describe_failure,
    launch_error,
    status_from_record,
)
from skygreen.plan.rank import Candidate, Plan
from skygreen.task.settings import RuntimeSettings
from skygreen.task.spec import parse_spec


def rendered(tmp_path, **green) -> dict:
    spec = parse_spec({"name": "demo", "skygreen": {"gpus": ["A100", "L4"], **green}, "run": "python train.py",
                       "secrets": {"WANDB_API_KEY": None}, "envs": {"DATA": "/data"}})  # fmt: skip
    offers = tuple(
        Candidate(
            cloud=c,
            region=r,
            zone=None,
            instance_type="vm",
            accelerator=g,
            accelerator_count=1,
            spot=True,
            price_usd_per_hour=p,
            on_demand_price_usd_per_hour=None,
            spot_price_usd_per_hour=p,
            est_hours=1.0,
            est_cost_usd=p,
            energy_kwh=0.1,
            co2e_kg=0.01,
        )
        for c, r, g, p in [("gcp", "us-central1", "L4", 0.3), ("aws", "us-east-1", "A100", 1.2)]
    )
    settings = RuntimeSettings.from_spec(spec.green, run_id="demo-20260101-000000-abcd", bucket="s3://b/runs")
    return render_task(spec, Plan(candidates=offers, objective="cost"), settings=settings, task_dir=tmp_path)


def test_the_adapter_is_a_launcher():
    assert isinstance(SkyPilotLauncher(), Launcher)


def test_a_rendered_task_becomes_a_real_sky_task_with_secret_values_in_memory(sky, tmp_path):
    task_dict = rendered(tmp_path, recovery={"strategy": "FAILOVER", "max_restarts_on_errors": 2})
    before = json.dumps(task_dict, sort_keys=True)
    task = SkyPilotLauncher().build_task(task_dict, {"WANDB_API_KEY": "sk-fake-123"})
    assert json.dumps(task_dict, sort_keys=True) == before  # SkyPilot pops keys: a deep copy went in
    resources = list(task.resources)  # `ordered` keeps the plan's order
    assert [(str(r.cloud), r.region, r.accelerators) for r in resources] == [
        ("GCP", "us-central1", {"L4": 1}),
        ("AWS", "us-east-1", {"A100": 1}),
    ]
    assert all(r.use_spot for r in resources)
    assert resources[0].job_recovery == {
        "strategy": "FAILOVER",
        "max_restarts_on_errors": 2,
        "recover_on_exit_codes": [PREEMPTED_EXIT_CODE],
    }
    assert task.envs["SKYGREEN_RUN_ID"] == "demo-20260101-000000-abcd" and task.envs["DATA"] == "/data"
    assert task.secrets["WANDB_API_KEY"].get_secret_value() == "sk-fake-123"
    assert "sk-fake-123" not in repr(task.secrets)


def test_a_task_skypilot_rejects_is_a_launch_error(sky, tmp_path):
    task_dict = rendered(tmp_path)
    task_dict["resources"]["ordered"][0]["use_spot"] = "yes"
    with pytest.raises(LaunchError) as caught:
        SkyPilotLauncher().build_task(task_dict)
    assert "SkyPilot rejected the task" in str(caught.value) and "use_spot" in str(caught.value)
    assert isinstance(caught.value.__cause__, ValueError)


def test_every_error_in_the_table_is_a_real_exception_class(sky):
    import requests.exceptions
    import sky.exceptions

    for name in ERROR_TABLE:
        real = (
            getattr(sky.exceptions, name, None)
            or getattr(builtins, name, None)
            or getattr(requests.exceptions, name, None)
        )
        assert isinstance(real, type) and issubclass(real, BaseException), name


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda ex: ex.NoCloudAccessError("No cloud access available."), ["no cloud enabled", "sky check", "--local"]),
        (
            lambda ex: ex.ClusterNotUpError("No in-progress managed jobs."),
            ["jobs controller is not up", "sky jobs queue --refresh"],
        ),
        (lambda ex: ex.ResourcesUnavailableError("no capacity"), ["could be provisioned", "skygreen plan"]),
        (
            lambda ex: ex.ApiServerConnectionError("http://127.0.0.1:1"),
            ["cannot reach the SkyPilot API server", "sky api start"],
        ),
        (lambda ex: ex.ApiServerAuthenticationError("http://127.0.0.1:1"), ["sky api login"]),
        (
            lambda ex: ex.CloudError("Max retries exceeded", "requests", "ConnectionError"),
            ["fetching its price catalog", "--local"],
        ),
        (lambda ex: ex.NoWorkspaceAccessError("denied"), ["denied"]),
        (
            lambda ex: ex.KubeAPIUnreachableError("unreachable"),
            ["could be provisioned"],
        ),  # a subclass maps through its parent
    ],
)
def test_skypilot_errors_map_to_launch_errors_with_the_fix(sky, make, words):
    import sky.exceptions

    error = launch_error(make(sky.exceptions), "launching the managed job")
    assert isinstance(error, LaunchError) and error.exit_code == 1
    for word in words:
        assert word in str(error)
    assert "fix:" in str(error)


def test_an_unmapped_error_still_says_what_to_do():
    error = launch_error(KeyError("boom"), "launching the managed job")
    assert "KeyError" in str(error) and "SKYGREEN_DEBUG=1" in str(error)


def test_fakes_fail_exactly_as_the_adapter_does(sky):
    import sky.exceptions

    real = launch_error(sky.exceptions.NoCloudAccessError("x"), "launching the managed job")
    fake = describe_failure("NoCloudAccessError", "x", "launching the managed job")
    assert str(real) == str(fake)


def test_every_managed_job_status_has_a_skygreen_state(sky):
    from sky.jobs.state import ManagedJobStatus

    assert {s.value for s in ManagedJobStatus} <= set(STATE_TABLE)


def test_job_records_become_skygreen_statuses(sky):
    from sky.jobs.state import ManagedJobStatus
    from sky.schemas.api.responses import ManagedJobRecord

    record = ManagedJobRecord(  # type: ignore[call-arg]  # pydantic fills _job_id from job_id
        job_id=7, task_id=0, status=ManagedJobStatus.RECOVERING, recovery_count=2, job_duration=3600.0,
                              cloud="AWS", region="us-east-1", accelerators={"A100": 1})  # fmt: skip
    status = status_from_record("7", [record])
    assert (status.state, status.recovery_count, status.duration_s, status.cloud, status.region) == (
        JobState.RECOVERING,
        2,
        3600.0,
        "aws",
        "us-east-1",
    )
    assert status.detail == "RECOVERING"
    failed = status_from_record(
        "8",
        [
            ManagedJobRecord(  # type: ignore[call-arg]  # pydantic fills _job_id from job_id
                job_id=8, status=ManagedJobStatus.FAILED_NO_RESOURCE, failure_reason="no capacity"
            )
        ],
    )
    assert (
        failed.state is JobState.FAILED
        and failed.detail == "FAILED_NO_RESOURCE"
        and failed.failure_reason == "no capacity"
    )
    assert failed.state.resumable


SERVER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from skygreen.launch.skypilot_launcher import SkyPilotLauncher
    from skygreen.errors import LaunchError
    task = json.loads(Path(sys.argv[1]).read_text())
    launcher, out = SkyPilotLauncher(), {}
    for action, call in [("launch", lambda: launcher.launch(task, name="skygreen-test")),
                         ("status", lambda: launcher.status("1").to_json())]:
        try:
            out[action] = {"ok": call()}
        except LaunchError as e:
            out[action] = {"error": str(e), "cause": type(e.__cause__).__name__}
    print("RESULT " + json.dumps(out))
    """
)


def test_a_real_skypilot_api_server_without_credentials(tmp_path):
    """SkyPilot's client starts its API server on a private port; launching without cloud
    credentials and reading a job without a controller fail with skygreen's messages."""
    from skygreen.api import plan

    spec = parse_spec({"name": "demo", "skygreen": {"gpus": ["L4", "T4", "A100"]}, "run": "python train.py"})
    settings = RuntimeSettings.from_spec(spec.green, run_id="demo-20260101-000000-abcd", bucket="s3://b/runs")
    task = render_task(spec, plan(spec, catalog_dir=SMALL_CATALOG), settings=settings, task_dir=tmp_path)
    task_path = tmp_path / "task.json"
    task_path.write_text(json.dumps(task))
    for attempt in range(3):
        home, port = tmp_path / f"home-{attempt}", free_port()
        home.mkdir()
        env = sky_env(home, port)
        try:
            out = subprocess.run(
                [sys.executable, "-c", SERVER_SCRIPT, str(task_path)],
                env=env,
                capture_output=True,
                text=True,
                timeout=420,
            )
        finally:
            stop_server(env, port)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, out.stdout[-2000:] + out.stderr[-3000:]
        result = json.loads(lines[-1][len("RESULT ") :])
        launch = result["launch"]
        # The server's ports (its own and its request queue's, derived from it) were only free
        # when picked; on a loaded machine another process can bind one first, or the server can
        # die while starting. Start it again in a new HOME on a new port, and show its log if
        # it dies every time.
        if "API server process exited unexpectedly" not in launch.get("error", ""):
            break
    server_logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in home.rglob("*.log"))
    assert "error" in launch, launch
    assert launch["cause"] == "NoCloudAccessError", launch["error"] + "\n" + server_logs
    assert "no cloud enabled" in launch["error"] and "sky check" in launch["error"] and "--local" in launch["error"]
    status = result["status"]  # no jobs controller exists: SkyPilot says so, skygreen says what to do
    assert status.get("cause") == "ClusterNotUpError", status
    assert "sky jobs queue --refresh" in status["error"]


class FakeQueue:
    """SkyPilot's `sky.jobs.queue_v2` and `sky.get` for it, the adapter's outermost edge: the
    request's arguments are kept, and `get` answers with the real shape, (records, total,
    status counts, total without filter), or raises what SkyPilot raises."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.asked: list[dict] = []

    def queue_v2(self, **kwargs):
        self.asked.append(kwargs)
        return "request-1"

    def get(self, request):
        assert request == "request-1"
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer, len(self.answer), {}, len(self.answer)


def test_jobs_lists_the_unfinished_managed_jobs_by_name_each_once(sky, monkeypatch):
    from sky.jobs.state import ManagedJobStatus
    from sky.schemas.api.responses import ManagedJobRecord

    def record(job_id: int, name: str, status, task_id: int = 0):
        return ManagedJobRecord(job_id=job_id, task_id=task_id, job_name=name, status=status)  # type: ignore[call-arg]

    queue = FakeQueue([
        record(3, "tiny-20261201-000000-ab12-2", ManagedJobStatus.RUNNING),
        record(4, "tiny-20261201-000000-ab12-3", ManagedJobStatus.RECOVERING),
        record(5, "pipeline", ManagedJobStatus.PENDING), record(5, "pipeline", ManagedJobStatus.PENDING, task_id=1),
        record(6, "someone-elses", ManagedJobStatus.STARTING),
    ])  # fmt: skip
    monkeypatch.setattr(sky.jobs, "queue_v2", queue.queue_v2)
    monkeypatch.setattr(sky, "get", queue.get)
    jobs = SkyPilotLauncher().jobs()
    assert [(j.job_id, j.name, j.state) for j in jobs] == [
        ("3", "tiny-20261201-000000-ab12-2", JobState.RUNNING),
        ("4", "tiny-20261201-000000-ab12-3", JobState.RECOVERING),
        ("5", "pipeline", JobState.PENDING),
        ("6", "someone-elses", JobState.STARTING),
    ]
    (asked,) = queue.asked
    assert asked["refresh"] is False and asked["skip_finished"] is True  # never starts a stopped controller
    assert {"job_id", "job_name", "status"} <= set(asked["fields"])


def test_jobs_with_no_controller_up_is_no_job_and_a_refusal_is_a_launch_error(sky, monkeypatch):
    from sky import exceptions

    idle = FakeQueue(exceptions.ClusterNotUpError("No in-progress managed jobs."))  # SkyPilot's own words
    monkeypatch.setattr(sky.jobs, "queue_v2", idle.queue_v2)
    monkeypatch.setattr(sky, "get", idle.get)
    assert SkyPilotLauncher().jobs() == []
    down = FakeQueue(exceptions.ApiServerConnectionError("http://127.0.0.1:46580"))
    monkeypatch.setattr(sky.jobs, "queue_v2", down.queue_v2)
    monkeypatch.setattr(sky, "get", down.get)
    with pytest.raises(LaunchError) as refused:
        SkyPilotLauncher().jobs()
    assert "reading the managed jobs queue" in str(refused.value) and "sky api start" in str(refused.value)
    assert isinstance(refused.value.__cause__, exceptions.ApiServerConnectionError)
