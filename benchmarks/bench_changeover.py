"""Changeover benchmark: a recovered VM from its first setup line to its first new step, against
the lower bound measured in the same run (medians of rounds; moto_server on loopback).

Changeover, as a recovered VM with the packages already in its image lives it:
  1. the rendered setup script (`skygreen.launch.render`), run with bash: it stamps its start,
     starts the checkpoint prefetch in the background (`skygreen.runtime.prefetch`), finds this
     skygreen version and its requirements installed and skips the installs;
  2. a new Python process (what `run` starts): imports torch and skygreen, `Checkpointer.load_latest`
     (takes the prefetched blobs once verified, downloads the rest), loads the state into the
     model and AdamW, and takes one optimizer step.
Lower bound, in this process: the fastest raw boto3 download of the same blob (concurrency 1, 4
and 8, the best kept) + `torch.load` of it + one optimizer step, plus the bare start of a Python
process that imports torch (no skygreen, no setup).

The model is a stack of 1024 x 4096 fp32 linear layers sized by --ckpt-mb (the checkpoint holds
its weights and AdamW's two moments: 3x the weights); the default 384 MB checkpoint is smaller
than a GPT-2-medium one (about 4.3 GB with AdamW) so that a round fits this shared machine. The
fresh-image case (the installs themselves) is not measured here: it needs a package index.

Run: .venv/bin/python benchmarks/bench_changeover.py [--ckpt-mb 384] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
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

from servers import FAKE_AWS_ENV, moto_process  # noqa: E402

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


def rendered_setup(run_id: str, bucket: str) -> str:
    from skygreen.launch.render import render_task
    from skygreen.plan.rank import Candidate, Plan
    from skygreen.settings import RuntimeSettings
    from skygreen.spec import parse_spec

    spec = parse_spec({"name": "bench", "skygreen": {}, "run": "python train.py"})
    offer = Candidate(cloud="aws", region="us-east-1", zone=None, instance_type="g6.xlarge", accelerator="L4",
                      accelerator_count=1, spot=True, price_usd_per_hour=0.3, on_demand_price_usd_per_hour=0.8,
                      spot_price_usd_per_hour=0.3, est_hours=1.0, est_cost_usd=0.3, energy_kwh=0.1, co2e_kg=0.03)  # fmt: skip
    settings = RuntimeSettings.from_spec(spec.green, run_id=run_id, bucket=bucket)
    return render_task(spec, Plan(candidates=(offer,), objective="cost"), settings=settings, task_dir=REPO)["setup"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt-mb", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import boto3
    from boto3.s3.transfer import TransferConfig

    from skygreen import __version__
    from skygreen.checkpoint.manifest import SHARED_BLOB, blob_key
    from skygreen.runtime.checkpointer import Checkpointer

    torch.manual_seed(0)
    state, layers = make_state(args.ckpt_mb)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ.update(FAKE_AWS_ENV)
        moto = moto_process().start(log_dir=tmp)
        try:
            os.environ["AWS_ENDPOINT_URL_S3"] = moto.url
            client = boto3.client("s3")
            client.create_bucket(Bucket="bench")
            run_id = "bench-run"
            url = f"s3://bench/{run_id}"
            with Checkpointer(url) as ck:
                ck.save(100, state)
            key = f"{run_id}/" + blob_key(100, SHARED_BLOB)
            size = client.head_object(Bucket="bench", Key=key)["ContentLength"]
            print(f"checkpoint: {size / 1e6:.0f} MB ({layers} layers of weights + AdamW moments); {args.rounds} rounds")
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
            rows: dict[str, list[float]] = {k: [] for k in ("setup", "import", "restore", "step", "changeover")}
            low: dict[str, list[float]] = {k: [] for k in ("start", "download", "load", "step", "bound")}
            best_streams = []
            for _ in range(args.rounds):
                t0 = time.time()
                done = subprocess.run(["bash", "-c", setup], env=env, capture_output=True, text=True, timeout=600)
                assert done.returncode == 0 and "skipping the installs" in done.stdout, done.stdout + done.stderr
                rows["setup"].append(time.time() - t0)
                child = subprocess.run([sys.executable, "-c", CHILD, str(time.time()), url, str(layers)],
                                       env=env, capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
                figures = json.loads(child.stdout.strip().splitlines()[-1])
                rows["import"].append(figures["import_s"])
                rows["restore"].append(figures["restore_s"])
                rows["step"].append(figures["step_s"])
                rows["changeover"].append(rows["setup"][-1] + figures["total_s"])

                start = float(subprocess.run([sys.executable, "-c", BARE, str(time.time())], env=env,
                                             capture_output=True, text=True, check=True).stdout)  # fmt: skip
                downloads = {}
                for streams in (1, 4, 8):
                    path = tmp / f"raw-{streams}.pt"
                    config = TransferConfig(max_concurrency=streams, multipart_chunksize=16 * 2**20)
                    t = time.perf_counter()
                    client.download_file("bench", key, str(path), Config=config)
                    downloads[streams] = time.perf_counter() - t
                best = min(downloads, key=lambda k: downloads[k])
                best_streams.append(best)
                t = time.perf_counter()
                raw = torch.load(tmp / f"raw-{best}.pt", map_location="cpu", weights_only=True)
                load_s = time.perf_counter() - t
                t = time.perf_counter()
                one_step(raw, layers)
                step_s = time.perf_counter() - t
                for streams in downloads:
                    (tmp / f"raw-{streams}.pt").unlink()
                low["start"].append(start)
                low["download"].append(downloads[best])
                low["load"].append(load_s)
                low["step"].append(step_s)
                low["bound"].append(start + downloads[best] + load_s + step_s)
            med = {k: statistics.median(v) for k, v in rows.items()}
            lo = {k: statistics.median(v) for k, v in low.items()}
            print(f"skygreen {__version__}; medians in seconds; best raw concurrency per round: {best_streams}")
            print("| phase | changeover (s) | lower bound (s) |")
            print("|---|---:|---:|")
            print(f"| setup (packages in the image: skipped; prefetch started) | {med['setup']:.2f} | 0 |")
            print(f"| process start, import torch (+ skygreen) | {med['import']:.2f} | {lo['start']:.2f} |")
            print(
                f"| restore: find, download, verify, torch.load | {med['restore']:.2f} | {lo['download'] + lo['load']:.2f} |"
            )
            print(f"| first optimizer step | {med['step']:.2f} | {lo['step']:.2f} |")
            print(f"| total: first setup line -> first new step | {med['changeover']:.2f} | {lo['bound']:.2f} |")
            ratios = [c / b for c, b in zip(rows["changeover"], low["bound"], strict=True)]
            print(
                f"ratio changeover / lower bound: {statistics.median(ratios):.2f} (per round {', '.join(f'{r:.2f}' for r in ratios)}; goal <= 1.2)"
            )
        finally:
            moto.stop()


if __name__ == "__main__":
    main()
