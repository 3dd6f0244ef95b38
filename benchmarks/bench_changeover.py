"""Changeover benchmark: a recovered VM from its first setup line to its first new step, against
the lower bound measured in the same run (medians of rounds; moto_server on loopback).

Changeover, as a recovered VM with the packages already in its image lives it:
  1. the rendered setup script (`skygreen.launch.render`), run with bash: it stamps its start,
     starts the checkpoint prefetch in the background (`skygreen.runtime.prefetch`), finds this
     skygreen version and its requirements installed and skips the installs;
  2. a new Python process (what `run` starts): imports torch and skygreen, `Checkpointer.load_latest`
     (takes the prefetched blobs once verified, downloads the rest), loads the state into the
     model and AdamW, and takes one optimizer step.
The same on a fresh image (`--fresh`): a fresh virtualenv with torch preinstalled stands in for a
deep-learning image (made once per run, torch from pip's configured sources, outside the timing;
each round gets a hard-linked copy of it). Setup installs skygreen without dependencies (a wheel
built from this checkout, standing in for `skygreen==VERSION` from PyPI), the bucket's client
(boto3), starts the prefetch, then installs the rest of the runtime requirements with pip from its
configured index (PyPI, pip's cache from the second round on); then the same new process, in that
virtualenv. Setup's phases are timed by the lines it prints as they arrive.
Lower bound, in this process: the fastest raw boto3 download of the same blob (concurrency 1, 4
and 8, the best kept) + `torch.load` of it + one optimizer step, plus the bare start of a Python
process that imports torch (no skygreen, no setup).

The model is a stack of 1024 x 4096 fp32 linear layers sized by --ckpt-mb (the checkpoint holds
its weights and AdamW's two moments: 3x the weights). The issue's size is about 1.4 GB
(`--ckpt-mb 1400`); a GPT-2-medium's fp32 weights alone are 1.4 GB, 4.3 GB with AdamW.

With `--stream-mb-s R` every reply passes a loopback proxy that serves it at R MB/s
(`tests/faultproxy.py`), as a cloud front end serves one stream, so the link, not this host's
cores, bounds the download (the lower bound then picks its best concurrency on the same link).
The S3 server is moto_server on loopback; by default (`--server moto-ranged`) it serves a ranged
GET by reading that range alone, as S3 does, where moto as released copies the whole object for
each one (`benchmarks/moto_ranged.py`; `--server moto` for the server as released).

The default run is the cloud case RESULTS.md quotes: 1.4 GB, each reply paced at 80 MB/s.
`--stream-mb-s 0` measures the unpaced loopback, where moto_server, the prefetch's hash and the
new process's imports share this host's cores: a measure of the host, not of a changeover.

Run: .venv/bin/python benchmarks/bench_changeover.py [--ckpt-mb 1400] [--rounds 3] [--fresh]
       [--installer pip|uv] [--server moto-ranged|moto] [--stream-mb-s 80]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from moto_ranged import s3_server  # noqa: E402
from servers import FAKE_AWS_ENV  # noqa: E402

LAYER_MB = 16  # one 1024 x 4096 fp32 layer

CHILD = r"""
import json, sys, time
t_start = float(sys.argv[1])
import torch
from skygreen.runtime.checkpointer import Checkpointer
layers = int(sys.argv[3])
t_imported = time.time()
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 1024, bias=False) for _ in range(layers)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loaded = Checkpointer(sys.argv[2]).load_latest()
assert loaded is not None
t_restored = time.time()
model.load_state_dict(loaded.state["model"]); opt.load_state_dict(loaded.state["optim"])
x = torch.randn(8, 1024)
h = x
for layer in model: h = layer(h.repeat(1, 4)[:, :4096])
h.pow(2).mean().backward(); opt.step()
t_step = time.time()
print(json.dumps({"import_s": t_imported - t_start, "restore_s": t_restored - t_imported,
                  "step_s": t_step - t_restored, "total_s": t_step - t_start}))
"""

BARE = "import sys, time; t = float(sys.argv[1]); import torch; print(time.time() - t)"


def make_state(ckpt_mb: int) -> tuple[dict, int]:
    """Weights and AdamW state (after one step) whose checkpoint is about `ckpt_mb`; the layer count."""
    layers = max(1, ckpt_mb // (3 * LAYER_MB))
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 1024, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.stack([p.sum() for p in model.parameters()]).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict()}, layers


def one_step(state: dict, layers: int) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 1024, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    h = torch.randn(8, 1024)
    for layer in model:
        h = layer(h.repeat(1, 4)[:, :4096])
    h.pow(2).mean().backward()
    opt.step()


def rendered_setup(run_id: str, bucket: str, requirement: str | None = None) -> str:
    """The setup script `skygreen up` renders; `requirement` is what it installs skygreen from
    (default `skygreen==VERSION`)."""
    from skygreen.launch.render import RuntimeInstall, render_task
    from skygreen.plan.rank import Candidate, Plan
    from skygreen.task.settings import RuntimeSettings
    from skygreen.task.spec import parse_spec

    spec = parse_spec({"name": "bench", "skygreen": {}, "run": "python train.py"})
    offer = Candidate(cloud="aws", region="us-east-1", zone=None, instance_type="g6.xlarge", accelerator="L4",
                      accelerator_count=1, spot=True, price_usd_per_hour=0.3, on_demand_price_usd_per_hour=0.8,
                      spot_price_usd_per_hour=0.3, est_hours=1.0, est_cost_usd=0.3, energy_kwh=0.1, co2e_kg=0.03)  # fmt: skip
    settings = RuntimeSettings.from_spec(spec.green, run_id=run_id, bucket=bucket)
    install = RuntimeInstall(requirement=requirement) if requirement else None
    plan = Plan(candidates=(offer,), objective="cost")
    return render_task(spec, plan, settings=settings, task_dir=REPO, install=install)["setup"]


def deep_learning_image(tmp: Path, *, with_uv: bool) -> Path:
    """A fresh virtualenv holding torch (this torch's version, from pip's configured sources),
    and `uv` where `with_uv` (SkyPilot's images have it; setup then installs with `uv pip`), and
    nothing of skygreen: the image a recovered VM boots. Made once, outside the timing."""
    image = tmp / "image"
    subprocess.run([sys.executable, "-m", "venv", str(image)], check=True, timeout=600)
    version = torch.__version__.split("+")[0]
    pip = [str(image / "bin" / "python"), "-m", "pip", "install", "--quiet", f"torch=={version}"]
    pip += ["uv"] if with_uv else []
    subprocess.run(pip, check=True, timeout=3600, stdout=subprocess.DEVNULL)
    return image


def skygreen_wheel(tmp: Path) -> Path:
    """This checkout built as a wheel: what `pip install skygreen==VERSION` would fetch."""
    out = tmp / "wheel"
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)]
    subprocess.run(build, check=True, timeout=600, stdout=subprocess.DEVNULL)
    return next(out.glob("skygreen-*.whl"))


def run_setup(setup: str, env: dict[str, str], cwd: Path) -> tuple[float, dict[str, float], str]:
    """Run setup with bash: its seconds, the seconds at which each `skygreen setup:` line came
    out (from its start), and its output."""
    t0 = time.time()
    proc = subprocess.Popen(["bash", "-c", setup], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert proc.stdout is not None
    marks: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("skygreen setup: "):
            marks.setdefault(line.removeprefix("skygreen setup: ").strip(), time.time() - t0)
    proc.wait(timeout=3600)
    took = time.time() - t0
    assert proc.returncode == 0, "".join(lines)[-3000:]
    return took, marks, "".join(lines)


def first_step(python: str, url: str, layers: int, env: dict[str, str], cwd: Path) -> dict[str, float]:
    """The new process `run` starts: import, restore, one step (seconds of each)."""
    child = subprocess.run([python, "-c", CHILD, str(time.time()), url, str(layers)], env=env, cwd=cwd,
                           capture_output=True, text=True, timeout=3600)  # fmt: skip
    assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-2000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def prefetched_after_s(home: Path, run_id: str, started_at: float) -> float:
    """When the prefetch wrote its last line, seconds after setup began; it must have prefetched."""
    log = home / ".skygreen" / "changeover" / f"{run_id}.prefetch.log"
    assert "prefetched" in log.read_text(), log.read_text()
    return log.stat().st_mtime - started_at


FRESH_MARKS = {
    "boto3": "installing boto3 for the bucket before the rest, so the prefetch can start",
    "prefetch": "checkpoint prefetch started in the background",
    "rest": "installing the runtime requirements",
    "installed": "runtime requirements installed",
}


def fresh_round(image: Path, setup: str, env: dict[str, str], tmp: Path, i: int, url: str, layers: int,
                run_id: str) -> dict[str, float]:  # fmt: skip
    """One changeover on a fresh copy of the image: setup installs everything, then the first step."""
    venv, home = tmp / f"fresh-{i}", tmp / f"fresh-home-{i}"
    subprocess.run(["cp", "-al", str(image), str(venv)], check=True)  # a copy of the image, in seconds
    home.mkdir()
    renv = {**env, "HOME": str(home), "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    t0 = time.time()
    setup_s, marks, out = run_setup(setup, renv, tmp)
    assert set(FRESH_MARKS.values()) <= set(marks), out[-3000:]
    order = [marks[FRESH_MARKS[k]] for k in ("boto3", "prefetch", "rest", "installed")]
    assert order == sorted(order), marks  # the prefetch started before the rest was installed
    figures = first_step(str(venv / "bin" / "python"), url, layers, renv, tmp)
    row = {
        "setup": setup_s,
        "skygreen": marks[FRESH_MARKS["boto3"]],
        "boto3": marks[FRESH_MARKS["prefetch"]] - marks[FRESH_MARKS["boto3"]],
        "rest": marks[FRESH_MARKS["installed"]] - marks[FRESH_MARKS["rest"]],
        "prefetch_start": marks[FRESH_MARKS["prefetch"]],
        "prefetched": prefetched_after_s(home, run_id, t0),
        "import": figures["import_s"],
        "restore": figures["restore_s"],
        "step": figures["step_s"],
        "changeover": setup_s + figures["total_s"],
    }
    whole = [str(venv / "bin" / "python"), "-c", "import boto3, google.cloud.storage, skygreen.runtime"]
    assert subprocess.run(whole, env=renv, capture_output=True).returncode == 0, "setup left the runtime incomplete"
    shutil.rmtree(venv)
    shutil.rmtree(home)
    return row


def lower_bound(client, key: str, tmp: Path, env: dict[str, str], layers: int) -> dict[str, float]:
    """Bare start + the best raw download + torch.load + one step, each in seconds."""
    from boto3.s3.transfer import TransferConfig

    start = float(subprocess.run([sys.executable, "-c", BARE, str(time.time())], env=env,
                                 capture_output=True, text=True, check=True).stdout)  # fmt: skip
    downloads = {}
    for streams in (1, 4, 8):
        path = tmp / f"raw-{streams}.pt"
        config = TransferConfig(max_concurrency=streams, multipart_chunksize=16 * 2**20)
        t = time.perf_counter()
        client.download_file("bench", key, str(path), Config=config)
        downloads[streams] = time.perf_counter() - t
        if streams > 1:
            path.unlink()  # keep one copy on disk at a time beside the first
    best = min(downloads, key=lambda k: downloads[k])
    t = time.perf_counter()
    digest = hashlib.sha256()
    with open(tmp / "raw-1.pt", "rb") as f:
        while chunk := f.read(2**20):
            digest.update(chunk)
    hash_s = time.perf_counter() - t  # what verifying the bytes costs, beside the bound
    t = time.perf_counter()
    raw = torch.load(tmp / "raw-1.pt", map_location="cpu", weights_only=True)
    load_s = time.perf_counter() - t
    (tmp / "raw-1.pt").unlink()
    t = time.perf_counter()
    one_step(raw, layers)
    step_s = time.perf_counter() - t
    del raw
    return {"start": start, "download": downloads[best], "load": load_s, "step": step_s, "hash": hash_s,
            "bound": start + downloads[best] + load_s + step_s, "streams": float(best)}  # fmt: skip


def median_of(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {}


def print_table(present: list[dict], fresh: list[dict], low: list[dict]) -> None:
    med, fr, lo = median_of(present), median_of(fresh), median_of(low)

    def cell(d: dict[str, float], key: str) -> str:
        return f"{d[key]:.2f}" if key in d else "-"

    head = "| phase (median, s) | packages in the image | fresh image | lower bound |"
    print(head if fresh else head.replace(" fresh image |", ""))
    print("|---|---:|---:|---:|" if fresh else "|---|---:|---:|")
    rows = [
        ("setup, first line to last", "setup", "setup", None),
        ("&nbsp; skygreen, no dependencies", None, "skygreen", None),
        ("&nbsp; boto3 (the bucket's client)", None, "boto3", None),
        ("&nbsp; the rest of the runtime requirements", None, "rest", None),
        ("&nbsp; prefetch started (from setup's first line)", "prefetch_start", "prefetch_start", None),
        ("&nbsp; prefetch finished (from setup's first line)", "prefetched", "prefetched", None),
        ("process start, import torch (+ skygreen)", "import", "import", "start"),
        ("restore: find, download, verify, torch.load", "restore", "restore", "restore"),
        ("first optimizer step", "step", "step", "step"),
        ("total: first setup line -> first new step", "changeover", "changeover", "bound"),
    ]
    lo = {**lo, "restore": lo["download"] + lo["load"]}
    for label, a, b, c in rows:
        cells = [
            cell(med, a) if a else "-",
            *([cell(fr, b) if b else "-"] if fresh else []),
            cell(lo, c) if c else ("0" if a == "setup" else "-"),
        ]
        print(f"| {label} | " + " | ".join(cells) + " |")
    for name, rows_ in (("packages in the image", present), ("fresh image", fresh)):
        if rows_:
            ratios = [r["changeover"] / b["bound"] for r, b in zip(rows_, low, strict=True)]
            print(f"ratio changeover / lower bound, {name}: {statistics.median(ratios):.2f} "
                  f"(per round {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
            verified = [r["changeover"] / (b["bound"] + b["hash"]) for r, b in zip(rows_, low, strict=True)]
            print(f"  against the bound plus one sha256 of the bytes ({lo['hash']:.2f} s): "
                  f"{statistics.median(verified):.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt-mb", type=int, default=1400,
                        help="checkpoint size (default 1400: a GPT-2-medium's fp32 weights, the issue's size)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fresh", action="store_true", help="also time the fresh image (installs everything)")
    parser.add_argument("--installer", choices=["pip", "uv"], default="pip",
                        help="the fresh image's installer: pip, or uv in the image as on SkyPilot's images")  # fmt: skip
    parser.add_argument("--stream-mb-s", type=float, default=80,
                        help="serve each reply at this many MB/s through a loopback proxy, as a cloud front end "
                             "serves one stream (default 80, an S3 stream to a VM in its region; 0: unpaced "
                             "loopback, where this host's cores, not a link, bound the download)")  # fmt: skip
    parser.add_argument("--server", choices=["moto", "moto-ranged"], default="moto-ranged",
                        help="moto-ranged (default): moto_server serving a ranged GET from its range, as S3 does; "
                             "moto: as released, copying the whole object for every ranged GET")  # fmt: skip
    args = parser.parse_args()
    import boto3

    from skygreen import __version__
    from skygreen.checkpoint.manifest import SHARED_BLOB, blob_key
    from skygreen.runtime.checkpointer import Checkpointer

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        image = wheel = None
        if args.fresh:
            t = time.time()
            image, wheel = deep_learning_image(tmp, with_uv=args.installer == "uv"), skygreen_wheel(tmp)
            extra = " + uv" if args.installer == "uv" else ""
            print(f"fresh image (venv + torch=={torch.__version__}{extra}) and skygreen wheel made in "
                  f"{time.time() - t:.0f} s")  # fmt: skip
        torch.manual_seed(0)
        state, layers = make_state(args.ckpt_mb)
        os.environ.update(FAKE_AWS_ENV)
        moto = s3_server(args.server).start(log_dir=tmp)
        proxy = None
        try:
            os.environ["AWS_ENDPOINT_URL_S3"] = moto.url
            if args.stream_mb_s:
                from faultproxy import FaultProxy

                proxy = FaultProxy(moto.url).start()
                proxy.reply_mb_s = args.stream_mb_s
                os.environ["AWS_ENDPOINT_URL_S3"] = proxy.url
            client = boto3.client("s3")
            client.create_bucket(Bucket="bench")
            run_id = "bench-run"
            url = f"s3://bench/{run_id}"
            with Checkpointer(url) as ck:
                ck.save(100, state)
            del state
            key = f"{run_id}/" + blob_key(100, SHARED_BLOB)
            size = client.head_object(Bucket="bench", Key=key)["ContentLength"]
            paced = f", each reply at {args.stream_mb_s:g} MB/s" if args.stream_mb_s else ", unpaced"
            print(f"checkpoint: {size / 1e6:.0f} MB ({layers} layers of weights + AdamW moments); {args.rounds} rounds; "
                  f"server: {args.server}{paced}")  # fmt: skip
            setup = rendered_setup(run_id, "s3://bench")
            home = tmp / "home"
            (home / ".skygreen").mkdir(parents=True)
            env = {**os.environ, "HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                   "SKYGREEN_BUCKET": "s3://bench", "SKYGREEN_RUN_ID": run_id}  # fmt: skip
            # The image holds this skygreen and its requirements: setup's marker says so.
            line = next(row for row in setup.splitlines() if row.startswith("skygreen_wanted="))
            wanted = subprocess.run(
                ["bash", "-c", line + '\nprintf "%s" "$skygreen_wanted"'],
                env=env, capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            (home / ".skygreen" / "installed").write_text(wanted + "\n")
            fresh_setup = rendered_setup(run_id, "s3://bench", requirement=str(wheel)) if wheel else ""
            present: list[dict[str, float]] = []
            fresh: list[dict[str, float]] = []
            low: list[dict[str, float]] = []
            for i in range(args.rounds):
                t0 = time.time()
                setup_s, _, out = run_setup(setup, env, tmp)
                assert "skipping the installs" in out, out
                figures = first_step(sys.executable, url, layers, env, tmp)
                present.append({"setup": setup_s, "prefetch_start": 0.0,
                                "prefetched": prefetched_after_s(home, run_id, t0), "import": figures["import_s"],
                                "restore": figures["restore_s"], "step": figures["step_s"],
                                "changeover": setup_s + figures["total_s"]})  # fmt: skip
                if image is not None:
                    fresh.append(fresh_round(image, fresh_setup, env, tmp, i, url, layers, run_id))
                low.append(lower_bound(client, key, tmp, env, layers))
                done = f"round {i + 1}: changeover {present[-1]['changeover']:.1f} s"
                done += f", fresh image {fresh[-1]['changeover']:.1f} s" if fresh else ""
                print(f"{done}, lower bound {low[-1]['bound']:.1f} s", flush=True)
            print(f"skygreen {__version__}; medians of {args.rounds} rounds in seconds; "
                  f"best raw concurrency per round: {[int(b['streams']) for b in low]}")  # fmt: skip
            print_table(present, fresh, low)
            if fresh:
                print("fresh rounds: " + "; ".join(f"setup {r['setup']:.1f} s (skygreen {r['skygreen']:.1f}, boto3 "
                      f"{r['boto3']:.1f}, rest {r['rest']:.1f}), total {r['changeover']:.1f} s" for r in fresh))  # fmt: skip
            print(f"load average (1, 5, 15 min) at start {load_start}, at end {os.getloadavg()}")
        finally:
            if proxy is not None:
                proxy.stop()
            moto.stop()


if __name__ == "__main__":
    main()
