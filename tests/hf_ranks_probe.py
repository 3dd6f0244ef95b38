"""Run tasks/hf_trainer.py (copied next to this file's working folder) up to `trainer.train()` and
print, per rank, the checkpoint folder the callback restored; skygreen's log shown at INFO.

It stops where training would start because HF Trainer (5.17) cannot resume a multi-process CPU
run: it loads the optimizer with `map_location=args.device` (`cpu:<rank>`), which torch refuses.
"""

from __future__ import annotations

import logging
import os
import sys

sys.path.insert(0, os.getcwd())
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stdout)

import transformers  # noqa: E402

import hf_trainer  # noqa: E402 - after the path and the logging set-up


def report(_trainer: transformers.Trainer, resume_from_checkpoint: str | None = None, **_: object) -> None:
    print(f"rank {os.environ['RANK']} resume_from_checkpoint={resume_from_checkpoint}", flush=True)


transformers.Trainer.train = report  # type: ignore[method-assign,assignment]
hf_trainer.Trainer.save_model = lambda *_a, **_k: None
hf_trainer.main()
