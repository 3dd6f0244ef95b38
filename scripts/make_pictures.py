"""Make the documentation's pictures from a real `skygreen demo` run.

    .venv/bin/python scripts/make_pictures.py            # writes docs/images/cost.png and report.png

Runs `skygreen demo --dir TMP` in a private folder (nothing of the user's runs is read or
written), then, with `SKYGREEN_DATA_DIR=TMP` as the demo's summary says:

- `skygreen cost RUN --plot docs/images/cost.png`: the cost plot;
- `skygreen report RUN -o TMP/report.html`, photographed with headless chromium (as
  tests/test_report.py does) into docs/images/report.png, its colours reduced so the file
  stays small. Without chromium this picture is skipped with a message saying so.

Every step is the real `skygreen` command; the script stops with the command's own exit code
and output when one fails. `--keep` leaves the demo folder in place for a look.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
WINDOW = (1280, 1600)
"""The report's screenshot: wide enough for its tables, tall enough for the figure and the segments."""
MAX_BYTES = 300_000


def skygreen_command() -> list[str]:
    """The installed `skygreen` beside this Python, else the module."""
    script = Path(sys.executable).with_name("skygreen")
    return [str(script)] if script.exists() else [sys.executable, "-m", "skygreen.cli"]


def run(argv: list[str], *, env: dict[str, str], what: str) -> subprocess.CompletedProcess[str]:
    print(f"$ {' '.join(argv)}", flush=True)
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise SystemExit(f"make_pictures: {what} failed with exit code {result.returncode}")
    return result


def the_run_id(env: dict[str, str]) -> str:
    """The demo's run: the one run in its folder."""
    listed = json.loads(run([*skygreen_command(), "status", "--json"], env=env, what="skygreen status").stdout)
    runs = listed if isinstance(listed, list) else listed.get("runs", [])
    ids = sorted({str(entry["run_id"]) for entry in runs})
    if len(ids) != 1:
        raise SystemExit(f"make_pictures: expected the demo's one run in its folder, found {ids}")
    return ids[0]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def screenshot(page: Path, target: Path, work: Path) -> None:
    """`page` in headless chromium, saved to `target` with its colours reduced to a palette."""
    browser = chromium()
    assert browser is not None
    shot = work / "shot.png"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
              f"--user-data-dir={work / 'profile'}"]  # fmt: skip
    argv = [*common, "--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}",
            page.as_uri()]  # fmt: skip
    print(f"$ chromium --headless --screenshot {page.name}", flush=True)
    grab = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    if grab.returncode != 0 or not shot.exists():
        sys.stderr.write(grab.stderr[-4000:])
        raise SystemExit(f"make_pictures: chromium could not photograph {page} (exit code {grab.returncode})")
    from PIL import Image

    with Image.open(shot) as image:
        image.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(target, optimize=True)


def check_size(path: Path) -> None:
    size = path.stat().st_size
    print(f"wrote {path.relative_to(ROOT)} ({size / 1000:.0f} kB)")
    if size > MAX_BYTES:
        raise SystemExit(f"make_pictures: {path} is {size} bytes, above the {MAX_BYTES} the repository takes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=IMAGES, help="where the pictures go (default docs/images)")
    parser.add_argument("--keep", action="store_true", help="keep the demo's folder and print where it is")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="skygreen-pictures-"))
    env = {**os.environ, "SKYGREEN_DATA_DIR": str(work / "demo"), "NO_COLOR": "1"}
    try:
        run([*skygreen_command(), "demo", "--dir", str(work / "demo")], env=env, what="skygreen demo")
        run_id = the_run_id(env)
        cost = args.out / "cost.png"
        run([*skygreen_command(), "cost", run_id, "--plot", str(cost)], env=env, what="skygreen cost --plot")
        check_size(cost)
        page = work / "report.html"
        run([*skygreen_command(), "report", run_id, "-o", str(page)], env=env, what="skygreen report")
        if chromium() is None:
            print(
                "skipped report.png: no chromium on this machine (install it, e.g. `apt-get install chromium`, "
                f"and run this script again); the report page itself is {page}"
            )
            args.keep = True
        else:
            screenshot(page, args.out / "report.png", work)
            check_size(args.out / "report.png")
    finally:
        if args.keep:
            print(f"the demo's folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
