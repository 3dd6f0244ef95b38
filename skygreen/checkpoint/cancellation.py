"""A user's cancel, told apart from a preemption.

Both reach the training process as SIGTERM, and the runtime counts a SIGTERM as a preemption
(`status` shows that count). `skygreen cancel` therefore first leaves a small object in the
run's own checkpoint folder, `<bucket>/<run_id>/cancel-requested`, then stops the job; on
SIGTERM the runtime looks for it, and when it is there it commits a checkpoint marked
"cancelled" and counts no preemption. The bucket is the one channel both sides already share,
on any cloud and on this machine; `skygreen resume` removes the object before relaunching, so
a later real preemption counts again.

The runtime waits at most `CHECK_TIMEOUT_S` for the answer (the SIGTERM grace period is short);
an unreachable bucket reads as "no cancel": the count may then include that one cancel.
"""

from __future__ import annotations

import threading

from skygreen.errors import StoreError

CANCEL_KEY = "cancel-requested"
CHECK_TIMEOUT_S = 5.0


def request_cancel(store) -> None:
    """Leave the marker (before the job is signalled)."""
    store.put(CANCEL_KEY, b"cancelled by skygreen cancel\n")


def clear_cancel(store) -> None:
    """Remove the marker (before a relaunch)."""
    if store.exists(CANCEL_KEY):
        store.delete(CANCEL_KEY)


def cancel_requested(store, *, timeout_s: float = CHECK_TIMEOUT_S) -> bool:
    """Whether the marker is there; False when the store does not answer within `timeout_s`."""
    answer: list[bool] = []

    def check() -> None:
        try:
            answer.append(store.exists(CANCEL_KEY))
        except (StoreError, OSError):
            answer.append(False)

    thread = threading.Thread(target=check, name="skygreen-cancel-check", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(answer and answer[0])
