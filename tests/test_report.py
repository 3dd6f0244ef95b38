"""Figures and the one-page report: real PNG files, the plotted series read back from the
figure and from the page, and the page opened in real headless Chromium."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_cost_cli import AWS_T4, GCP_L4, TASK, add_run

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LOSSES_A = [(50, 2.0), (100, 1.6)], [(150, 1.3), (300, 1.0)]


def skygreen(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "skygreen.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env or dict(os.environ),
    )


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def runs(private_home, tmp_path) -> list[str]:
    task = tmp_path / "task.yaml"
    task.write_text(TASK)
    bucket = tmp_path / "bucket"
    add_run(task, "demo-a", [
        {"place": GCP_L4, "at_h": 0, "hours": 1, "steps": (0, 100), "samples": (0, 3200), "end": "preempted", "losses": LOSSES_A[0]},
        {"place": AWS_T4, "at_h": 1.5, "hours": 2, "steps": (100, 300), "samples": (3200, 9600), "losses": LOSSES_A[1]},
    ], bucket=bucket)  # fmt: skip
    add_run(
        task,
        "demo-b",
        [
            {
                "place": GCP_L4,
                "at_h": 0,
                "hours": 1,
                "steps": (0, 300),
                "samples": (0, 9600),
                "losses": [(10, 2.0), (300, 1.5)],
            }
        ],
        bucket=bucket,
    )
    return ["demo-a", "demo-b"]


def test_the_figure_holds_the_expected_series(runs):
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import costing
    from skygreen.costs.page import build_figure

    report = costing.cost_of_run("demo-a", open_store=open_store)
    fig = build_figure([report])
    ax_cloud, ax_seg, ax_spend, ax_loss = fig.axes
    assert sorted(round(b.get_height(), 6) for b in ax_cloud.patches) == [0.25, 1.0]  # gcp 1 h x $0.25, aws 2 h x $0.50
    assert [round(b.get_height(), 6) for b in ax_seg.patches] == [0.25, 1.0]
    (spend,) = ax_spend.get_lines()
    assert list(spend.get_xdata()) == pytest.approx([0, 0, 1, 1.5, 3.5]) and list(spend.get_ydata()) == pytest.approx(
        [0, 0, 0.25, 0.25, 1.25]
    )
    loss = next(line for line in ax_loss.get_lines() if "val_loss" in str(line.get_label()))
    assert list(loss.get_xdata()) == [50, 100, 150, 300] and list(loss.get_ydata()) == [2.0, 1.6, 1.3, 1.0]
    marks = [line for line in ax_loss.get_lines() if line.get_linestyle() == "--"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [100, 100]  # resumed at step 100 after the preemption
    for ax in fig.axes:
        assert ax.get_ylabel() and ax.get_title()
    assert "USD" in ax_spend.get_ylabel() and "hours" in ax_spend.get_xlabel()


def test_cost_plot_png_and_compare_plot_html(runs, tmp_path):
    png = tmp_path / "cost.png"
    out = skygreen("cost", "demo-a", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    data = png.read_bytes()
    assert png_size(data) == (1300, 850) and len(data) > 30_000
    page = tmp_path / "compare.html"
    out = skygreen("compare", *runs, "--plot", str(page))
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    found = re.search(r"<script type='application/json' id='series'>(.*?)</script>", text, re.DOTALL)
    assert found is not None
    series = json.loads(found.group(1))
    assert [r["run_id"] for r in series["runs"]] == runs
    assert series["runs"][0]["metrics"]["val_loss"]["value"] == [2.0, 1.6, 1.3, 1.0]
    assert series["runs"][1]["cost_by_cloud_usd"] == {"gcp": pytest.approx(0.25)}
    (img,) = re.findall(r"src='data:image/png;base64,([^']+)'", text)
    assert png_size(base64.b64decode(img)) == (1300, 850)
    assert not re.search(r"(src|href)=['\"]?https?:", text)  # nothing fetched from the network
    bad = skygreen("cost", "demo-a", "--plot", str(tmp_path / "cost.svg"))
    assert bad.returncode == 2 and "end the name in .png or .html" in bad.stderr


def test_without_matplotlib_a_one_line_hint(runs, tmp_path):
    blocker = tmp_path / "block" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "block"))
    out = skygreen("cost", "demo-a", "--plot", str(tmp_path / "x.png"), env=env)
    assert out.returncode == 2 and "pip install 'skygreen[report]'" in out.stderr and "Traceback" not in out.stderr
    assert skygreen("cost", "demo-a", env=env).returncode == 0  # the text view needs no matplotlib


def test_the_cli_starts_without_matplotlib():
    probe = "import sys\nfrom skygreen.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\nprint('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


CHROMIUM: str = shutil.which("chromium") or shutil.which("chromium-browser") or ""


@pytest.mark.skipif(
    not CHROMIUM,
    reason="chromium is not installed (scripts/test-tools.sh installs it with apt-get where it runs as root)",
)
def test_report_page_in_headless_chromium(runs, tmp_path):
    page = tmp_path / "report.html"
    out = skygreen("report", "demo-a", "-o", str(page))
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert "The plan it ran on" not in text or "<table class='plan'>" in text
    assert "<table class='segments'>" in text and "id='task'" in text and "class='energy'" in text
    shot = tmp_path / "shot.png"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
              "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'id="figure"' in dom.stdout and "Run demo-a" in dom.stdout
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    assert "name='viewport'" in text
    for width in (390, 1280):  # a phone and a laptop: nothing wider than the viewport, tables scroll in their box
        assert wider_than_viewport(common, page, width, tmp_path) == [], width
    grab = subprocess.run([*common, "--hide-scrollbars", "--window-size=1400,1800", f"--screenshot={shot}", page.as_uri()],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert grab.returncode == 0 and shot.exists(), grab.stderr[-2000:]
    assert png_size(shot.read_bytes()) == (1400, 1800)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))[:, :, :3]
    colored = ((pixels.max(axis=2) - pixels.min(axis=2)) > 0.2).mean()
    assert colored > 0.01  # the figure's coloured bars and lines were drawn, not a blank page


WIDTH_PROBE = """<script>addEventListener('load', () => {
  const vw = document.documentElement.clientWidth, wide = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('.scroll') && !el.classList.contains('scroll')) continue;  // scrolls inside its box
    const r = el.getBoundingClientRect();
    if (r.width > 0 && (r.right > vw + 1 || r.left < -1)) wide.push(el.tagName + '.' + el.className);
  }
  if (document.documentElement.scrollWidth > vw + 1) wide.push('page:' + document.documentElement.scrollWidth);
  document.body.setAttribute('data-wide', JSON.stringify(wide));
});</script>"""


def wider_than_viewport(common: list[str], page: Path, width: int, tmp_path: Path) -> list[str]:
    """The elements of `page` wider than a `width` px viewport, outside a scrolling table box."""
    probe = tmp_path / f"probe-{width}.html"
    probe.write_text(page.read_text().replace("</body>", WIDTH_PROBE + "</body>"))
    dom = subprocess.run([*common, f"--window-size={width},900", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    found = re.search(r'data-wide="([^"]*)"', dom.stdout)
    assert dom.returncode == 0 and found, dom.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


def test_report_page_carries_the_energy_statement(runs, tmp_path):
    from skygreen.launch.registry import Registry
    from test_cli_up import commit_checkpoint

    record = Registry().load("demo-a")
    _meter_ledger(record, joules_per_segment=3.6e6)  # the runtime writes the joules to both
    meta = {"state": "completed", "energy_j": 7.2e6, "wall_s": 7200.0,
            "power": {"method": "simulated", "cap_w": 45.0, "default_limit_w": 70.0, "gpus": 1}}  # fmt: skip
    commit_checkpoint(record.checkpoint_url, 300, meta=meta)
    page = tmp_path / "report.html"
    out = skygreen("report", "demo-a", "-o", str(page))
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    statement = skygreen("status", "demo-a", "--statement")
    assert statement.returncode == 0, statement.stderr
    paragraph = statement.stdout.strip()
    assert paragraph.startswith("Energy statement: training run demo-a") and "2.00 kWh on the GPUs" in paragraph
    assert f"<p class='statement'>{html.escape(paragraph)}</p>" in text
    assert "a power cap of 45 W" in text


def _meter_ledger(record, *, joules_per_segment: float) -> None:
    """Give each ledger segment of the run the GPU energy a metering runtime would have written:
    `status` and the statement read a run's energy from its ledger, as `cost` does."""
    from skygreen.checkpoint.local_store import LocalStore
    from skygreen.ledger.records import LEDGER_DIR

    store = LocalStore(Path(record.bucket) / record.run_id)
    for key in store.list(f"{LEDGER_DIR}/"):
        segment = json.loads(store.get(key))
        store.put(key, json.dumps({**segment, "energy_j": joules_per_segment}).encode())


def test_report_page_of_a_run_without_a_checkpoint_says_so(runs, tmp_path):
    page = tmp_path / "report.html"
    out = skygreen("report", "demo-b", "-o", str(page))
    assert out.returncode == 0, out.stderr
    assert "<p class='statement'>run demo-b has no committed checkpoint yet: no energy to state</p>" in page.read_text()


def _shown(text) -> tuple[str, bool]:
    """What matplotlib draws for a Text artist: the string after its `$` handling, and whether it
    reads the string as a mathtext formula (which eats the spaces between two dollar amounts)."""
    return text._preprocess_math(text.get_text())


def test_dollar_amounts_in_labels_are_drawn_as_text_not_mathtext(runs):
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import costing
    from skygreen.costs.page import build_figure

    report = costing.cost_of_run("demo-a", open_store=open_store)
    from matplotlib.text import Text

    fig = build_figure([report])
    _, _, ax_spend, _ = fig.axes
    texts = [t for ax in fig.axes for t in ax.findobj(lambda a: isinstance(a, Text) and "$" in a.get_text())]
    assert texts, "no dollar amount in the figure"
    assert all(not _shown(t)[1] for t in texts)
    (legend,) = ax_spend.get_legend().get_texts()
    total = f"{report.cost.total_usd:,.2f}"
    assert total != "1.25"  # the controller and storage are on top of the $1.25 of compute
    assert _shown(legend)[0] == f"demo-a: compute $1.25 (run total with controller and storage ${total})"
    fig.canvas.draw()  # draws without a mathtext error


def test_a_local_run_shows_the_estimate_on_the_plans_pick_instead_of_empty_panels(private_home, tmp_path):
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import costing
    from skygreen.costs.page import build_figure
    from skygreen.ledger.place import LOCAL, Place

    task = tmp_path / "task.yaml"
    task.write_text(TASK)
    here = Place(cloud=LOCAL, gpu=None, gpu_count=0, nodes=1, price_usd_per_hour=0.0, price_source="local")
    add_run(task, "local-a", [
        {"place": here, "at_h": 0, "hours": 0.1, "steps": (0, 50), "samples": (0, 1600), "losses": [(50, 1.0)]},
    ], mode="local", bucket=tmp_path / "bucket")  # fmt: skip
    report = costing.cost_of_run("local-a", open_store=open_store)
    pick = report.cloud_estimate.pick
    fig = build_figure([report])
    ax_cloud, ax_seg, ax_spend, ax_loss = fig.axes
    for ax in (ax_cloud, ax_seg, ax_spend):
        assert ax.get_title().startswith("Estimate: ") and ax.axison
    assert ax_cloud.patches and ax_seg.patches  # each cloud's best spot and on-demand offer, estimated
    (line,) = ax_spend.get_lines()
    assert list(line.get_ydata()) == [0.0, pick.est_cost_usd] and "estimate on the plan's pick" in line.get_label()
    assert any("val_loss" in str(line.get_label()) for line in ax_loss.get_lines())  # the metric is still drawn
    page = tmp_path / "local.html"
    assert skygreen("report", "local-a", "-o", str(page)).returncode == 0
    assert "<p class='estimate'>This run was local: nothing was spent on the clouds. Estimate:" in page.read_text()
    png = tmp_path / "local.png"
    out = skygreen("cost", "local-a", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert png_size(png.read_bytes()) == (1300, 850)


def test_a_cloud_run_keeps_its_cost_panels(runs):
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import costing
    from skygreen.costs.page import build_figure

    fig = build_figure([costing.cost_of_run("demo-a", open_store=open_store)])
    assert all(ax.axison and not any("no cloud spend" in t.get_text() for t in ax.texts) for ax in fig.axes)


def test_small_sums_keep_their_significant_digits_and_labels_their_whole_run_id(runs):
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import costing
    from skygreen.costs.page import _plan_section, build_figure
    from skygreen.figures import money

    assert (money(0.0026), money(0.25), money(12.5), money(1234.0)) == ("$0.0026", "$0.25", "$12.50", "$1,234")
    offer = {"cloud": "gcp", "region": "us-central1", "instance_type": "g2-standard-4", "accelerator": "L4",
             "accelerator_count": 1, "spot": True, "price_usd_per_hour": 0.2236, "est_hours": 0.0116, "est_cost_usd": 0.0026}  # fmt: skip
    assert "<td>$0.0026</td>" in "".join(_plan_section({"offers": [offer]}))
    reports = [costing.cost_of_run(run, open_store=open_store) for run in runs]
    _, ax_seg, _, _ = build_figure(reports).axes
    labels = [t.get_text() for t in ax_seg.get_xticklabels()]
    assert [label.splitlines()[0] for label in labels] == ["demo-a", "demo-a", "demo-b"]
