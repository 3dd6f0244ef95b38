"""GPU check for a lent accelerator: mixed precision vs fp32, throughput and energy per step.

One short run (about a minute on a data-centre GPU, well under 10): a small transformer
language model trains through `skygreen.runtime.Run` in fp32, bf16 (where supported) and fp16
with loss scaling, same data and batch; for each, samples per second and GPU energy per
optimizer step from NVML's total-energy counter (read-only). It also records what
`precision: auto` picks on this GPU.

It changes no GPU setting: no power limit, clocks, persistence or compute mode (its runs
say `power: {cap: off}`). Through skygreen's own NVML adapter (`skygreen.power.nvml`) it reads
the current, default, min and max power limits and the total-energy counter before and after,
and reports them with `power_limit_unchanged` and `energy_counter_grew`, so a reader can check
that the adapter's milliwatt/millijoule conversions and error table work on real hardware.

Prints JSON to stdout and writes it to `$OUT/gpu_check.json` when `OUT` is set. Without a
GPU (or without NVML) it still runs, on CPU with a tiny model, and says in `skipped` what it
could not measure and why, so every code path but the GPU's own is exercised.

    python benchmarks/gpu_check.py [--steps 40] [--warmup 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from skygreen.power.policy import CapRequest  # noqa: E402
from skygreen.runtime.precision import choose_precision, cpu_facts, cuda_facts  # noqa: E402
from skygreen.runtime.run import Run  # noqa: E402
from skygreen.task.settings import RuntimeSettings  # noqa: E402

GPU_SHAPE = dict(vocab=8192, d_model=768, layers=8, heads=12, seq_len=512, micro=16, accum=2)
CPU_SHAPE = dict(vocab=256, d_model=64, layers=2, heads=4, seq_len=64, micro=4, accum=2)


class LM(torch.nn.Module):
    def __init__(self, *, vocab: int, d_model: int, layers: int, heads: int, seq_len: int, **_) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Parameter(torch.zeros(seq_len, d_model))
        layer = torch.nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos
        return self.head(self.blocks(h, mask=self.mask, is_causal=True))


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int, *, vocab: int, seq_len: int, **_) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (count, seq_len + 1), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return self.data[i, :-1], self.data[i, 1:]


class Nvml:
    """Read-only, through skygreen's NVML adapter: limits, power, the energy counter. Never sets anything."""

    def __init__(self, device_index: int) -> None:
        from skygreen.power.nvml import Nvml as Adapter

        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        self.gpu = Adapter().device_by_uuid(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")

    def energy_mj(self) -> int:
        return round(self.gpu.energy_j() * 1000)

    def power_limit_w(self) -> float:
        return self.gpu.power_limit_w()

    def limits(self) -> dict:
        """Every power reading the runtime relies on, each with its error when it fails."""
        out: dict = {"name": self.gpu.name, "uuid": self.gpu.uuid}
        for key, read in (
            ("power_limit_w", self.gpu.power_limit_w),
            ("default_limit_w", self.gpu.default_limit_w),
            ("limit_range_w", self.gpu.limit_range_w),
            ("power_w", self.gpu.power_w),
            ("energy_counter_j", self.gpu.energy_j),
        ):
            try:
                out[key] = read()
            except Exception as e:  # the adapter's PowerError classes: report, do not stop
                out[key] = None
                out[f"{key}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        return out


def measure(
    precision: str, shape: dict, device: torch.device, steps: int, warmup: int, nvml: Nvml | None, bucket: str
) -> dict:
    """Train `warmup + steps` optimizer steps in `precision`; time and meter the last `steps`."""
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = LM(**shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    effective = shape["micro"] * shape["accum"]
    settings = RuntimeSettings(
        run_id=f"gpu-check-{precision}", bucket=bucket, precision=precision,
        effective_batch=effective, micro_batch=shape["micro"], checkpoint_every_steps=10**9,
        power_cap=CapRequest(mode="off"),  # a check reads the GPU; it never changes its limit
    )  # fmt: skip
    data = Tokens(effective * (warmup + steps + 1), **shape)
    run = Run(model=model, optimizer=optimizer, dataset=data, settings=settings, device=device, environ={})
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = 0.0
    energy_start: int | None = None
    losses = []
    with run:
        for step in run.steps(warmup + steps):
            if step.index == warmup:
                sync()
                started = time.perf_counter()
                energy_start = nvml.energy_mj() if nvml else None
            with step:
                for x, y in step.micro_batches():
                    with step.autocast():
                        loss = F.cross_entropy(run.model(x).float().flatten(0, 1), y.flatten())
                    step.backward(loss)
                step.clip_grad_norm_(1.0)
                step.optimizer_step()
            losses.append(loss.detach())
            if step.index == warmup + steps - 1:
                sync()
                elapsed_s = time.perf_counter() - started
                energy_j = (nvml.energy_mj() - energy_start) / 1000.0 if nvml and energy_start is not None else None
        scale = run.scaler.get_scale() if run.precision.grad_scaler else None
    final_loss = float(losses[-1])
    return {
        "precision": run.precision.precision,
        "grad_scaler": run.precision.grad_scaler,
        "loss_scale_final": scale,
        "samples_per_s": round(effective * steps / elapsed_s, 2),
        "s_per_step": round(elapsed_s / steps, 5),
        "energy_j_per_step": None if energy_j is None else round(energy_j / steps, 3),
        "avg_power_w": None if energy_j is None else round(energy_j / elapsed_s, 1),
        "final_loss": round(final_loss, 4),
        "loss_finite": bool(torch.isfinite(torch.tensor(final_loss))),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    args = parser.parse_args()
    skipped: list[str] = []
    report: dict = {"python": platform.python_version(), "torch": torch.__version__}
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        capability = torch.cuda.get_device_capability(0)
        facts = cuda_facts(torch.cuda.get_device_name(0), capability)
        shape = GPU_SHAPE
        report.update(device=facts.name, compute_capability=list(capability))
        precisions = ["fp32", "fp16"] + (["bf16"] if facts.bf16 else [])
        if not facts.bf16:
            skipped.append(f"bf16: {facts.name} has no bf16 tensor cores")
        try:
            nvml = Nvml(0)
            report["power_before"] = nvml.limits()
            report["power_limit_w_before"] = nvml.power_limit_w()
        except Exception as e:  # no NVML library, no counter on this GPU
            nvml = None
            skipped.append(f"energy: NVML unavailable ({type(e).__name__}: {e})")
    else:
        device, facts, shape, nvml = torch.device("cpu"), cpu_facts(), CPU_SHAPE, None
        report.update(device="cpu")
        precisions = ["fp32"]
        skipped.append(
            "AMP bf16/fp16 throughput: no CUDA GPU here (ran fp32 on CPU with a tiny model to exercise the code)"
        )
        skipped.append("energy: no CUDA GPU, so no NVML energy counter")
        skipped.append(_no_gpu_power_reason())
    auto = choose_precision("auto", facts)
    report["auto_precision"] = {"precision": auto.precision, "grad_scaler": auto.grad_scaler, "warning": auto.warning}
    report["shape"] = shape
    report["steps_timed"] = args.steps
    results = {}
    with tempfile.TemporaryDirectory(prefix="skygreen-gpu-check-") as bucket:
        for precision in precisions:
            results[precision] = measure(precision, shape, device, args.steps, args.warmup, nvml, bucket)
            print(f"{precision}: {results[precision]}", file=sys.stderr, flush=True)
    report["results"] = results
    base = results["fp32"]
    report["speedup_vs_fp32"] = {p: round(r["samples_per_s"] / base["samples_per_s"], 3) for p, r in results.items()}
    if nvml is not None:
        report["energy_per_step_vs_fp32"] = {
            p: round(r["energy_j_per_step"] / base["energy_j_per_step"], 3) for p, r in results.items()
        }
        report["power_after"] = nvml.limits()
        report["power_limit_w_after"] = nvml.power_limit_w()
        report["power_limit_unchanged"] = report["power_limit_w_after"] == report["power_limit_w_before"]
        before_j, after_j = report["power_before"]["energy_counter_j"], report["power_after"]["energy_counter_j"]
        report["energy_counter_grew"] = None if before_j is None or after_j is None else after_j > before_j
    report["skipped"] = skipped
    text = json.dumps(report, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text + "\n")


def _no_gpu_power_reason() -> str:
    """What skygreen's NVML adapter says on this machine (read-only), for the `skipped` list."""
    from skygreen.errors import PowerError
    from skygreen.power.nvml import Nvml as Adapter

    try:
        count = Adapter(environ={}).device_count()
    except PowerError as e:
        return f"power limits: no CUDA GPU and NVML unavailable ({str(e).splitlines()[0]})"
    return f"power limits: no CUDA GPU for torch, though NVML sees {count} device(s)"


if __name__ == "__main__":
    main()
