"""`python -m skygreen.runtime.prefetch`: the rendered setup script's background download of the
run's newest checkpoint (`skygreen.checkpoint.prefetch` says what it writes and how the runtime
verifies it). No torch here."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from skygreen.checkpoint.prefetch import prefetch, prefetch_dir, run_url


def setup_nodes(environ: Mapping[str, str]) -> int:
    """How many nodes the job has, as SkyPilot tells setup: one IP per line in
    `SKYPILOT_SETUP_NODE_IPS` (else `SKYPILOT_NUM_NODES`, else 1)."""
    ips = [line for line in environ.get("SKYPILOT_SETUP_NODE_IPS", "").splitlines() if line.strip()]
    if ips:
        return len(ips)
    count = environ.get("SKYPILOT_NUM_NODES", "").strip()
    return int(count) if count.isdecimal() and int(count) > 0 else 1


def main(environ: Mapping[str, str] | None = None) -> int:
    """Prefetch the newest checkpoint of the run named by the environment; exit 0 even when
    there is none (a first launch), 1 when the bucket could not be read (the runtime downloads)."""
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.errors import SkygreenError

    env = os.environ if environ is None else environ
    bucket, run_id = env.get("SKYGREEN_BUCKET"), env.get("SKYGREEN_RUN_ID")
    if not bucket or not run_id:
        sys.stderr.write("prefetch: SKYGREEN_BUCKET and SKYGREEN_RUN_ID must be set\n")
        return 2
    url = run_url(bucket, run_id)
    try:
        done = prefetch(open_store(url), prefetch_dir(url), nodes=setup_nodes(env))
    except (SkygreenError, OSError) as e:
        sys.stderr.write(f"prefetch: {url}: {str(e).splitlines()[0]}; the runtime downloads the checkpoint itself\n")
        return 1
    sys.stdout.write(f"prefetch: {url}: {done}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
