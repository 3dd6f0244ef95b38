"""The shipped tasks: each passes `skygreen smoke` offline on CPU with no extra settings, plans to
a believable cost, and renders a VM setup that installs its own packages.

(`tests/test_render.py` checks every tasks/*.yaml through SkyPilot's own parser.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "tasks"
SHIPPED = ("bert-mlm", "folder-mode", "gpt2", "gpt2-fsdp", "hf-trainer", "lightning", "lora", "resnet50", "tiny")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_the_shipped_tasks_are_all_there():
    assert sorted(p.stem for p in TASKS.glob("*.yaml")) == sorted(SHIPPED)


@pytest.mark.parametrize("name", ["bert-mlm", "gpt2", "gpt2-fsdp", "resnet50"])
def test_task_passes_the_smoke_test_offline_with_no_settings(name, tmp_path):
    """`skygreen smoke tasks/X.yaml` as a user runs it: no SKYGREEN_TASK_SIZE, no hub."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKYGREEN_")}
    env.update(OFFLINE, SKYGREEN_DATA_CACHE=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "smoke", str(TASKS / f"{name}.yaml")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("skygreen smoke: ok: 2 steps on 1 rank, micro-batch 2 x 2 accumulation, fp32"), (
        out.stdout
    )
    # the data went through skygreen.data: prepared into the smoke run's throw-away bucket
    assert list((tmp_path / "cache").iterdir()), "nothing was prepared into the data cache"


def test_task_size_rejects_a_typo(tmp_path):
    env = dict(os.environ, SKYGREEN_TASK_SIZE="tiny", SKYGREEN_BUCKET=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "bert_mlm.py"], cwd=TASKS, capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode != 0
    assert "SKYGREEN_TASK_SIZE='tiny': expected 'full' or 'small'" in out.stderr


@pytest.mark.parametrize(
    "name, low_usd, high_usd",
    [
        ("bert-mlm", 1, 100),
        ("gpt2", 3, 300),
        ("gpt2-fsdp", 9, 900),
        ("hf-trainer", 0, 5),
        ("folder-mode", 0, 5),
        ("lightning", 0, 5),
        ("lora", 0, 1),
        ("resnet50", 1, 100),
        ("tiny", 0, 1),
    ],
)
def test_plan_prices_each_task_believably(name, low_usd, high_usd):
    """Work sized from published throughput: dollars to tens of dollars per run on spot, not cents or thousands."""
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", "plan", str(TASKS / f"{name}.yaml"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    best = json.loads(out.stdout)["candidates"][0]
    assert low_usd <= best["est_cost_usd"] <= high_usd, best


@pytest.mark.parametrize("name", ["bert-mlm", "gpt2", "resnet50"])
def test_rendered_setup_installs_the_tasks_packages_and_is_valid_shell(name, tmp_path):
    from skygreen.api import plan
    from skygreen.launch.render import RuntimeInstall, render_task
    from skygreen.task.settings import RuntimeSettings
    from skygreen.task.spec import load_spec

    spec = load_spec(TASKS / f"{name}.yaml")
    settings = RuntimeSettings.from_spec(spec.green, run_id="demo-20260101-000000-abcd", bucket="s3://bucket/runs")
    task = render_task(
        spec, plan(spec), settings=settings, task_dir=TASKS, install=RuntimeInstall(source_dir=str(REPO))
    )
    own_setup = yaml.safe_load((TASKS / f"{name}.yaml").read_text())["setup"]
    assert "datasets" in own_setup
    script = tmp_path / "setup.sh"
    script.write_text(task["setup"])
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert "datasets" in task["setup"]  # the task's own setup, run after the runtime's install


def test_local_resnet50_is_torchvisions_architecture():
    sys.path.insert(0, str(TASKS))
    try:
        from resnet_local import resnet50
    finally:
        sys.path.remove(str(TASKS))
    model = resnet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's resnet50()
    try:
        import torchvision
    except Exception:
        return
    reference = torchvision.models.resnet50(weights=None)
    ours, theirs = model.state_dict(), reference.state_dict()
    assert list(ours) == list(theirs)
    assert all(ours[k].shape == theirs[k].shape for k in ours)


def test_near_duplicate_removal_runs_when_asked_and_warns(tmp_path):
    from skygreen.launch.smoke import run_smoke

    task = tmp_path / "bert-dedup.yaml"
    task.write_text(
        f"name: bert-dedup\nworkdir: {TASKS}\nskygreen:\n  batch: {{effective: 8, micro: 2}}\n"
        "run: python bert_mlm.py --dedup 0.8\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKYGREEN_")}
    env.update(OFFLINE, SKYGREEN_DATA_CACHE=str(tmp_path / "cache"))
    result = run_smoke(task, environ=env)
    assert result.line.startswith("skygreen smoke: ok")
    assert "curated medical or legal data" in result.output
    assert "near-duplicates removed:" in result.output


def test_the_hub_path_runs_here_on_a_local_dataset_and_tokenizer(tmp_path, monkeypatch):
    """The full-size code (`datasets.load_dataset`, `AutoTokenizer.from_pretrained`) is real code:
    pointed at a local dataset folder and a local tokenizer folder, it runs offline."""
    import dataclasses

    from transformers import PreTrainedTokenizerFast

    from skygreen.data.shards import prepare

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.syspath_prepend(str(TASKS))
    import bert_mlm
    import textdata

    docs = textdata._sample_documents()[:400]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("\n".join(" ".join(d.split()) for d in docs))
    trained = textdata._train_tokenizer(bert_mlm.WIKITEXT_103, docs)
    PreTrainedTokenizerFast(tokenizer_object=trained, unk_token="[UNK]", mask_token="[MASK]").save_pretrained(
        tmp_path / "tokenizer"
    )
    data = dataclasses.replace(
        bert_mlm.WIKITEXT_103,
        dataset=str(corpus),
        dataset_config=None,
        tokenizer=str(tmp_path / "tokenizer"),
        block_size=32,
    )
    spec, build = textdata.text_shards(data, size="full", dedup=None)
    assert spec.source["dataset"] == str(corpus) and spec.config["tokenizer"] == str(tmp_path / "tokenizer")
    dataset = prepare(spec, build, url=str(tmp_path / "bucket"), cache_dir=tmp_path / "cache")
    assert len(dataset) > 100
    cls_id = trained.token_to_id("[CLS]")
    rows = np.stack([dataset[i] for i in range(len(dataset))])
    assert rows.shape[1] == 32 and (rows[:, 0] == cls_id).all()
    assert (rows[:, 1:] != cls_id).all()  # [CLS] only where the packer put it


def test_resnet_preprocessing_resizes_a_local_image_dataset_on_several_cores_in_order(tmp_path, monkeypatch):
    """The full-size image path (decode, resize, centre crop, in parallel) on a small local dataset."""
    import datasets
    from PIL import Image

    from skygreen.data.shards import ShardSpec, prepare

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.syspath_prepend(str(TASKS))
    import resnet50

    rng = np.random.default_rng(0)
    sizes = [(64, 48), (40, 90), (33, 33)] * 30  # landscape, portrait, square
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
    corpus = datasets.Dataset.from_dict({"image": images, "label": list(range(len(images)))}).cast_column(
        "image", datasets.Image()
    )
    monkeypatch.setattr(resnet50, "CHUNK_ROWS", 16)
    spec = ShardSpec(name="local-images", source={"test": 1}, config={"side": 32}, rows_per_shard=40)
    data = prepare(
        spec,
        lambda w: resnet50.resize_into(w, corpus, 32, workers=2),
        url=str(tmp_path / "b"),
        cache_dir=tmp_path / "c",
    )
    assert len(data) == 90
    for i in (0, 1, 2, 57, 89):
        image, label = data[i]
        assert image.shape == (32, 32, 3) and image.dtype == np.uint8
        assert int(label) == i  # rows stay in the dataset's order across workers
        assert np.array_equal(image, resnet50._resize(corpus[i]["image"], 32))
