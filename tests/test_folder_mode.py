"""The folder mode: `python -m skygreen.folder_mode -- CMD` around a script that knows nothing of
skygreen (tests/folder_train.py), on a local bucket and on S3 (moto): commits of each complete
folder, retention, restore on a fresh machine, partial folders removed, another run's folder
refused, SIGTERM waiting for the last save, the smoke test, and the task file's validation."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import user_env, wait_for
from local_runs import status_agrees_with_cost
from skygreen.checkpoint.folders import committed_folder_steps, restore_latest
from skygreen.checkpoint.store import join_url
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import SpecError
from skygreen.folder_mode import RUN_MARKER, Completeness
from skygreen.launch.render import render_task
from skygreen.ledger.io import read_ledger
from skygreen.task.settings import SMOKE_LINE, RuntimeSettings
from skygreen.task.spec import parse_spec, parse_spec_text

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("folder_train.py")
RUN_ID = "folder-20260101-000000-abcd"


@pytest.fixture(params=["local", "s3"])
def bucket(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "bucket")
    return f"s3://{request.getfixturevalue('s3_bucket')}/runs"


def workdir_of(tmp_path: Path, name: str = "work") -> Path:
    work = tmp_path / name
    work.mkdir(exist_ok=True)
    shutil.copy(SCRIPT, work / "folder_train.py")
    return work


def env_for(tmp_path: Path, bucket: str, **extra: str) -> dict[str, str]:
    settings = RuntimeSettings(
        run_id=RUN_ID, bucket=bucket, checkpoint_keep=2, checkpoint_dir="out", checkpoint_marker="state.json",
        trainer="folder",
    )  # fmt: skip
    env = user_env(tmp_path / "home")
    env.update({**settings.to_env(), **extra})
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def folder_mode(work: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = "python folder_train.py --out out " + " ".join(args)
    return subprocess.run(
        [sys.executable, "-m", "skygreen.folder_mode", "--", command],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def store_of(bucket: str):
    return open_store(join_url(bucket, RUN_ID))


def test_each_complete_folder_is_committed_and_retention_keeps_two(tmp_path, bucket):
    work = workdir_of(tmp_path)
    out = folder_mode(work, env_for(tmp_path, bucket), "--steps", "6")
    assert out.returncode == 0, out.stderr
    store = store_of(bucket)
    assert committed_folder_steps(store) == [4, 6]
    restored = restore_latest(store, tmp_path / "restored")
    assert restored is not None and restored.step == 6
    assert (restored.path / "weights.bin").read_bytes() == (work / "out" / "checkpoint-6" / "weights.bin").read_bytes()
    assert (restored.path / "nested" / "rng.txt").read_text() == "6"
    assert (work / "out" / RUN_MARKER).read_text().strip() == RUN_ID


def test_a_fresh_machine_resumes_from_the_bucket_and_ends_as_an_uninterrupted_run(tmp_path, bucket):
    first = workdir_of(tmp_path, "vm1")
    assert folder_mode(first, env_for(tmp_path, bucket), "--steps", "6").returncode == 0
    second = workdir_of(tmp_path, "vm2")  # a new VM: the local disk is gone
    out = folder_mode(second, env_for(tmp_path, bucket), "--steps", "10")
    assert out.returncode == 0, out.stderr
    assert "resumed from step 6" in out.stdout
    alone = workdir_of(tmp_path, "alone")
    subprocess.run([sys.executable, "folder_train.py", "--out", "out", "--steps", "10"], cwd=alone, check=True)
    assert (second / "out" / "final.bin").read_bytes() == (alone / "out" / "final.bin").read_bytes()
    assert committed_folder_steps(store_of(bucket)) == [8, 10]


def test_a_node_other_than_node_0_restores_and_commits_nothing(tmp_path, bucket):
    node0 = workdir_of(tmp_path, "node0")
    assert folder_mode(node0, env_for(tmp_path, bucket), "--steps", "6").returncode == 0
    node1 = workdir_of(tmp_path, "node1")
    out = folder_mode(node1, env_for(tmp_path, bucket, SKYPILOT_NODE_RANK="1"), "--steps", "10")
    assert out.returncode == 0, out.stderr
    assert "resumed from step 6" in out.stdout + out.stderr  # every node restores into its own disk
    assert (node1 / "out" / "checkpoint-10").is_dir()  # the script saved on this node ...
    assert committed_folder_steps(store_of(bucket)) == [4, 6]  # ... and only node 0 commits
    assert len(read_ledger(store_of(bucket))) == 1  # nor does node 1 write a ledger segment


def test_a_partial_local_folder_the_bucket_does_not_hold_is_removed_before_the_command(tmp_path, bucket):
    work = workdir_of(tmp_path)
    assert folder_mode(work, env_for(tmp_path, bucket), "--steps", "6").returncode == 0
    partial = work / "out" / "checkpoint-8"  # the life that died saved half of it
    partial.mkdir()
    (partial / "state.json").write_text('{"step": 8}')
    (partial / "weights.bin").write_bytes(b"torn")
    out = folder_mode(work, env_for(tmp_path, bucket), "--steps", "8")
    assert out.returncode == 0, out.stderr
    assert "resumed from step 6" in out.stdout


def test_a_folder_of_another_run_is_refused_before_the_command_starts(tmp_path, bucket):
    work = workdir_of(tmp_path)
    (work / "out" / "checkpoint-2").mkdir(parents=True)
    (work / "out" / "checkpoint-2" / "state.json").write_text('{"step": 2}')
    (work / "out" / RUN_MARKER).write_text("someone-else-20250101\n")
    out = folder_mode(work, env_for(tmp_path, bucket), "--steps", "4")
    assert out.returncode == 2
    assert "checkpoint.dir" in out.stderr and "someone-else-20250101" in out.stderr and "fix:" in out.stderr
    assert "Traceback" not in out.stderr
    assert "saved step" not in out.stdout and not (work / "out" / "final.bin").exists()


def test_a_missing_folder_setting_is_a_clear_error(tmp_path, bucket):
    work = workdir_of(tmp_path)
    env = env_for(tmp_path, bucket)
    del env["SKYGREEN_CHECKPOINT_DIR"]
    out = folder_mode(work, env, "--steps", "4")
    assert out.returncode == 2
    assert "SKYGREEN_CHECKPOINT_DIR" in out.stderr and "checkpoint: {dir: FOLDER}" in out.stderr
    assert not (work / "out").exists()


def test_sigterm_forwards_the_signal_and_commits_the_save_it_triggers(tmp_path, bucket):
    work = workdir_of(tmp_path)
    env = env_for(tmp_path, bucket, FOLDER_TRAIN_HOLD_AT="5", FOLDER_TRAIN_RELEASE=str(tmp_path / "never"))
    command = "python folder_train.py --out out --steps 20 --save-every 4"
    proc = subprocess.Popen(
        [sys.executable, "-m", "skygreen.folder_mode", "--", command],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        store = store_of(bucket)
        # gates: step 4 is committed, and the script holds at step 5 (it saves nothing more on its own)
        wait_for(lambda: committed_folder_steps(store) == [4] or proc.poll() is not None, "the commit of step 4")
        assert proc.poll() is None, "the run ended before the test could signal it"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr  # the script's own code: the run script turns it into "preempted"
    assert committed_folder_steps(store) == [4, 5]
    (segment,) = read_ledger(store)  # the wrapper's segment: ended by SIGTERM at the last committed step
    assert (segment.end, segment.start_step, segment.step) == ("preempted", 0, 5)
    assert segment.energy_j is None, "the wrapper meters nothing"


def test_quiet_period_completes_a_folder_without_a_marker(tmp_path):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"1")
    now = [0.0]
    rule = Completeness(marker=None, quiet_s=30.0, clock=lambda: now[0])
    assert not rule.complete(folder)  # first look
    now[0] = 29.0
    assert not rule.complete(folder)
    (folder / "more.bin").write_bytes(b"2")  # it changed: the quiet period starts again
    now[0] = 40.0
    assert not rule.complete(folder)
    now[0] = 69.0
    assert not rule.complete(folder)
    now[0] = 70.0
    assert rule.complete(folder)


def write_task(work: Path, checkpoint: str, run: str) -> Path:
    task = work / "task.yaml"
    task.write_text(
        textwrap.dedent(
            f"""\
            name: folder-smoke
            skygreen:
              checkpoint: {checkpoint}
            run: {run}
            """
        )
    )
    return task


def test_smoke_stops_after_the_first_checkpoint_and_leaves_no_folder(tmp_path):
    work = workdir_of(tmp_path)
    task = write_task(
        work, "{dir: out, marker: state.json}", "python folder_train.py --out out --steps 100000 --save-every 3"
    )
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "smoke", str(task)],
        cwd=work, env=user_env(tmp_path / "home"), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert SMOKE_LINE in out.stdout + out.stderr
    assert not [p for p in (work / "out").iterdir() if p.name.startswith("checkpoint-")]


def test_smoke_of_a_script_without_skygreen_is_told_at_once_with_the_fix(tmp_path):
    work = workdir_of(tmp_path)
    task = write_task(work, "{keep: 2}", "python folder_train.py --out out --steps 100000")
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "smoke", str(task)],
        cwd=work, env=user_env(tmp_path / "home"), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 1
    assert "does not use skygreen" in out.stderr and "checkpoint: {dir: FOLDER}" in out.stderr
    assert "SkygreenCallback" in out.stderr
    assert not (work / "out").exists()  # it never ran


@pytest.mark.parametrize(
    ("section", "field", "words"),
    [
        ({"trainer": "runtime", "checkpoint": {"dir": "out"}}, "skygreen.checkpoint.dir", "trainer: runtime"),
        ({"trainer": "transformers", "checkpoint": {"dir": "out"}}, "skygreen.checkpoint.dir", "trainer: transformers"),
        ({"trainer": "folder"}, "skygreen.checkpoint.dir", "is required"),
        ({"checkpoint": {"marker": "state.json"}}, "skygreen.checkpoint.marker", "checkpoint.dir"),
        ({"checkpoint": {"dir": "out", "marker": "a/b"}}, "skygreen.checkpoint.marker", "file name"),
        ({"checkpoint": {"dir": "../elsewhere"}}, "skygreen.checkpoint.dir", ".."),
        ({"checkpoint": {"dir": "out", "marker": "m", "quiet_s": 5}}, "skygreen.checkpoint.quiet_s", "give one"),
        ({"trainer": "keras"}, "skygreen.trainer", ""),
    ],
)
def test_bad_folder_mode_settings_name_the_field(section, field, words):
    with pytest.raises(SpecError) as caught:
        parse_spec({"run": "python train.py", "skygreen": section})
    assert caught.value.field == field
    assert words in str(caught.value)


def test_the_cli_refuses_dir_with_the_own_loop_runtime_exit_2(tmp_path):
    work = workdir_of(tmp_path)
    task = write_task(work, "{dir: out}", "python folder_train.py")
    task.write_text(task.read_text().replace("skygreen:\n", "skygreen:\n  trainer: runtime\n"))
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "smoke", str(task)],
        cwd=work, env=user_env(tmp_path / "home"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert "skygreen.checkpoint.dir" in out.stderr and "fix" in out.stderr.lower()
    assert "Traceback" not in out.stderr


def test_a_folder_task_renders_the_wrapper_around_the_command():
    spec = parse_spec_text(
        "skygreen:\n  checkpoint: {dir: out, marker: trainer_state.json}\nrun: python train.py --x 'a b'\n"
    )
    assert spec.green.trainer == "folder"
    settings = RuntimeSettings.from_spec(spec.green, run_id=RUN_ID, bucket="s3://b/runs")
    task = render_task(spec, None, settings=settings, task_dir=REPO)
    wrapped = "python -m skygreen.folder_mode -- " + shlex.quote("python train.py --x 'a b'")
    assert "skygreen_command=" + shlex.quote(wrapped) + "\n" in task["run"]
    assert task["envs"]["SKYGREEN_CHECKPOINT_DIR"] == "out"
    assert task["envs"]["SKYGREEN_CHECKPOINT_MARKER"] == "trainer_state.json"
    assert task["envs"]["SKYGREEN_TRAINER"] == "folder"
    plain = parse_spec_text("run: python train.py\n")
    rendered = render_task(plain, None, settings=RuntimeSettings.from_spec(plain.green, run_id=RUN_ID, bucket="b"),
                           task_dir=REPO)  # fmt: skip
    assert "folder_mode" not in rendered["run"] and "SKYGREEN_TRAINER" not in rendered["envs"]


def test_the_folder_mode_imports_nothing_the_vm_does_not_install():
    code = "import sys, skygreen.folder_mode\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert not loaded & {"sky", "click", "rich", "torch", "transformers", "lightning"}


@pytest.mark.slow
def test_the_folder_mode_task_passes_its_smoke_test_and_runs_with_up_local(tmp_path, private_home):
    work = tmp_path / "task"
    work.mkdir()
    for name in ("folder_mode.py", "folder-mode.yaml"):
        shutil.copy(REPO / "tasks" / name, work / name)
    env = user_env(private_home, FOLDER_STEPS="300", FOLDER_SAVE_EVERY="100")
    smoke = subprocess.run([sys.executable, "-m", "skygreen.cli", "smoke", str(work / "folder-mode.yaml")], env=env,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "folder mode: checkpoint folder of step 100 committed and restored" in smoke.stdout
    assert not list((work / "out" / "folder-mode").glob("step_*"))
    up = subprocess.run([sys.executable, "-m", "skygreen.cli", "up", str(work / "folder-mode.yaml"), "--local"],
                        env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    assert (work / "out" / "folder-mode" / "final.pt").is_file()
    (run,) = json.loads(subprocess.run([sys.executable, "-m", "skygreen.cli", "status", "--json"], env=env,
                                       capture_output=True, text=True, timeout=120).stdout)  # fmt: skip
    assert run["state"] == "SUCCEEDED" and run["step"] == 300
    status_agrees_with_cost(env, run["run_id"], preemptions=0, interval=False)  # completion, energy, CO2e
    # the wrapper wrote the run's ledger segment: cost, report and compare read the run
    for args in (["cost", run["run_id"]], ["report", run["run_id"]], ["compare", run["run_id"]]):
        out = subprocess.run([sys.executable, "-m", "skygreen.cli", *args], env=env, capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
    cost = subprocess.run([sys.executable, "-m", "skygreen.cli", "cost", run["run_id"]], env=env, capture_output=True,
                          text=True, timeout=120).stdout  # fmt: skip
    assert "completed at step 300" in cost and "energy not metered" in cost


def cli(env: dict[str, str], *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skygreen.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip


def task_copy(tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    work.mkdir()
    for file in ("folder_mode.py", "folder-mode.yaml"):
        shutil.copy(REPO / "tasks" / file, work / file)
    return work / "folder-mode.yaml"


@pytest.mark.slow
def test_the_folder_mode_task_killed_with_sigkill_then_resumed_ends_bit_identical(tmp_path, private_home):
    env = user_env(private_home, FOLDER_STEPS="300", FOLDER_SAVE_EVERY="100", SKYGREEN_TASK_SIZE="small")
    reference = task_copy(tmp_path, "reference")
    alone = cli(env, "up", str(reference), "--local", "--no-smoke")
    assert alone.returncode == 0, alone.stdout[-2000:] + alone.stderr[-2000:]
    (first,) = json.loads(cli(env, "status", "--json").stdout)

    # The script holds after saving step 200 (it cannot finish first); the test waits for that
    # folder's commit in the bucket and for the hold, then kills the whole process group.
    release = tmp_path / "release"
    release.mkdir()
    held = {**env, "SKYGREEN_TEST_HOLD_AT_STEPS": "200", "SKYGREEN_TEST_HOLD_RELEASE": str(release)}
    task = task_copy(tmp_path, "run")
    launched = cli(held, "up", str(task), "--local", "--no-smoke", "--detach")
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-2000:]
    (run_id,) = [r["run_id"] for r in json.loads(cli(env, "status", "--json").stdout) if r["run_id"] != first["run_id"]]
    record_path = Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json"
    record = json.loads(record_path.read_text())
    store = open_store(join_url(record["bucket"], run_id))

    def launch_log() -> str:
        job = json.loads(record_path.read_text())["launches"][-1]["job_id"]
        path = Path(env["XDG_DATA_HOME"]) / "skygreen" / "local-jobs" / job / "output.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def committed_and_held() -> bool:
        state = json.loads(cli(env, "status", run_id, "--json").stdout)["state"]
        assert state in ("RUNNING", "PENDING", "STARTING"), f"the run ended ({state}) before step 200\n{launch_log()}"
        return 200 in committed_folder_steps(store) and "held at step 200 (" in launch_log()

    wait_for(committed_and_held, "the commit of step 200 and the hold there", 600)
    os.killpg(json.loads(record_path.read_text())["launches"][-1]["pid"], signal.SIGKILL)  # the machine is gone
    wait_for(lambda: json.loads(cli(env, "status", run_id, "--json").stdout)["state"] == "STOPPED", "a stopped run")
    final = task.parent / "out" / "folder-mode" / "final.pt"
    assert not final.exists()
    shutil.rmtree(final.parent)  # the machine's disk went with it: only the bucket holds step 200

    (release / "200").touch()  # the resumed life passes step 200 without holding
    resumed = cli(held, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    log = launch_log()  # restored from the bucket's commit, and the script resumed from it, not from step 0
    assert "resumed from step 200" in log and "resumed from out/folder-mode/step_200" in log, log[-2000:]
    done = json.loads(cli(env, "status", run_id, "--json").stdout)
    assert done["state"] == "SUCCEEDED" and done["step"] == 300
    # The script restores its weights, optimizer and RNG (its data stream) from the folder: fp32 on
    # CPU, the resumed run ends bit-identical to the uninterrupted one.
    import torch

    after = torch.load(final, weights_only=True)
    before = torch.load(reference.parent / "out" / "folder-mode" / "final.pt", weights_only=True)
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name
