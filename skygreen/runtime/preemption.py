"""Knowing that the machine is about to go: SIGTERM, and the clouds' spot-interruption notices.

SkyPilot sends no signal before a spot VM dies, so the runtime asks the cloud itself. A
background thread polls the instance metadata endpoint of the cloud the run landed on:

| cloud | request | a notice is |
|---|---|---|
| aws | `PUT /latest/api/token` (IMDSv2), then `GET /latest/meta-data/spot/instance-action` | 200 with `{"action": "terminate" / "stop" / "hibernate", "time": ...}`; 404 means none |
| gcp | `GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google` | the body `TRUE` |
| azure | `GET /metadata/scheduledevents?api-version=2020-07-01` with `Metadata: true` | an event with `EventType: Preempt` |

A notice can be a false alarm (AWS rebalances, Azure cancels events) and the last minutes of
a VM still train, so a notice only asks for a checkpoint at the next step boundary; SIGTERM
asks for a checkpoint and an exit with `PREEMPTED_EXIT_CODE`.

Endpoints are configurable (`SKYGREEN_AWS_METADATA_URL`, `SKYGREEN_GCP_METADATA_URL`,
`SKYGREEN_AZURE_METADATA_URL`, poll interval `SKYGREEN_NOTICE_POLL_S`), which is how tests
point them at a loopback server that answers like each cloud.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from skygreen.errors import RuntimeSetupError
from skygreen.task.settings import decode

log = logging.getLogger("skygreen.runtime")

DEFAULT_METADATA_URLS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
METADATA_URL_ENV = {cloud: f"SKYGREEN_{cloud.upper()}_METADATA_URL" for cloud in DEFAULT_METADATA_URLS}
POLL_ENV = "SKYGREEN_NOTICE_POLL_S"
DEADLINE_ENV = "SKYGREEN_SIGTERM_DEADLINE_S"
DEFAULT_POLL_S = 5.0
DEFAULT_SIGTERM_DEADLINE_S = 25.0
"""Docker and Kubernetes give 30 s between SIGTERM and SIGKILL by default; leave a margin."""
REQUEST_TIMEOUT_S = 2.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Notice:
    """A preemption notice: the cloud that gave it and what it said, for the log."""

    cloud: str
    detail: str


def _request(url: str, *, method: str = "GET", headers: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of one request; an HTTP error status is an answer, not an exception."""
    req = urllib.request.Request(url, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def check_aws(base_url: str) -> Notice | None:
    """AWS spot interruption notice (IMDSv2: a session token first)."""
    status, token = _request(
        f"{base_url}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    )
    headers = {"X-aws-ec2-metadata-token": token} if status == 200 else {}
    status, body = _request(f"{base_url}/latest/meta-data/spot/instance-action", headers=headers)
    if status != 200:
        return None
    try:
        action = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(action, dict) or "action" not in action:
        return None
    return Notice(cloud="aws", detail=f"spot instance-action {action['action']} at {action.get('time', '?')}")


def check_gcp(base_url: str) -> Notice | None:
    """GCP's preemption notice: `instance/preempted` answers TRUE; else None."""
    status, body = _request(f"{base_url}/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"})
    if status == 200 and body.strip().upper() == "TRUE":
        return Notice(cloud="gcp", detail="instance/preempted is TRUE")
    return None


def check_azure(base_url: str) -> Notice | None:
    """Ask for Azure's preemption notice: the first scheduled event of type Preempt.

    None when there is none, or the answer is not a 200 with a JSON object whose `Events` is a list.
    """
    status, body = _request(f"{base_url}/metadata/scheduledevents?api-version=2020-07-01", headers={"Metadata": "true"})
    if status != 200:
        return None
    try:
        events = json.loads(body).get("Events", [])
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(events, list):
        return None
    for event in events:
        if isinstance(event, dict) and event.get("EventType") == "Preempt":
            return Notice(
                cloud="azure",
                detail=f"scheduled event Preempt {event.get('EventId', '?')} not before {event.get('NotBefore', '?')}",
            )
    return None


CHECKS: dict[str, Callable[[str], Notice | None]] = {"aws": check_aws, "gcp": check_gcp, "azure": check_azure}


def metadata_url(cloud: str, environ: Mapping[str, str] | None = None) -> str:
    """The base URL of `cloud`'s metadata server: its SKYGREEN_<CLOUD>_METADATA_URL, else the cloud's own."""
    environ = os.environ if environ is None else environ
    return environ.get(METADATA_URL_ENV[_known_cloud(cloud)]) or DEFAULT_METADATA_URLS[cloud]


def _known_cloud(cloud: str) -> str:
    """`cloud` itself when skygreen can watch it for notices; else `RuntimeSetupError` listing those it can."""
    if cloud not in CHECKS:
        raise RuntimeSetupError(
            f"no preemption notice check for cloud {cloud!r}\n  allowed: {', '.join(sorted(CHECKS))}\n"
            "  fix: set SKYGREEN_CLOUD to one of those, or unset it (SkyPilot tells the job its cloud)"
        )
    return cloud


def _env_seconds(name: str, default: float, environ: Mapping[str, str]) -> float:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = decode(raw, float, name)
    except RuntimeSetupError:
        value = -1.0
    if not value > 0:
        raise RuntimeSetupError(f"{name}: expected a number of seconds greater than 0\n  got: {raw!r}")
    return value


CLUSTER_INFO_ENV = "SKYPILOT_CLUSTER_INFO"


def landed_cloud(settings_cloud: str | None, environ: Mapping[str, str]) -> str | None:
    """The cloud this process runs on, for the notice watcher, or None off the three clouds.

    A managed job may land on any cloud among its candidates, so `skygreen up` cannot name it
    in advance; SkyPilot tells the task in `SKYPILOT_CLUSTER_INFO` (JSON whose `cloud` is
    "AWS", "GCP" or "Azure"). `SKYGREEN_CLOUD` (settings) wins, for tests and other launchers.
    """
    if settings_cloud:
        return settings_cloud.lower()
    try:
        info = json.loads(environ.get(CLUSTER_INFO_ENV, "") or "{}")
    except ValueError:
        return None
    cloud = str(info.get("cloud", "")).lower() if isinstance(info, dict) else ""
    return cloud if cloud in CHECKS else None


class NoticeWatcher:
    """Polls one cloud's metadata endpoint in a daemon thread; `pending()` tells the training loop.

    Each notice that appears (after a poll that saw none) is reported once, so a notice that
    stays up does not make the run checkpoint at every step.
    """

    def __init__(self, cloud: str, *, base_url: str, poll_s: float) -> None:
        """Make a watcher; nothing is polled before `start`.

        Args:
            cloud: `aws`, `gcp` or `azure`.
            base_url: the cloud's metadata server.
            poll_s: seconds between polls.

        Raises:
            RuntimeSetupError: a cloud it cannot watch.
        """
        self.cloud = _known_cloud(cloud)
        self.base_url = base_url.rstrip("/")
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._fresh: Notice | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="skygreen-preemption-notice", daemon=True)
        self._errors_logged = 0

    @classmethod
    def from_env(cls, cloud: str, environ: Mapping[str, str] | None = None) -> NoticeWatcher:
        """Make a watcher of `cloud` with its endpoint and poll interval from `environ`; not started.

        Args:
            cloud: `aws`, `gcp` or `azure`.
            environ: where `SKYGREEN_<CLOUD>_METADATA_URL` and `SKYGREEN_NOTICE_POLL_S` (5 s by
                default) are read (default: `os.environ`).

        Returns:
            The watcher.

        Raises:
            RuntimeSetupError: a cloud it cannot watch, or a poll interval that is not a
                positive number of seconds.
        """
        environ = os.environ if environ is None else environ
        return cls(cloud, base_url=metadata_url(cloud, environ), poll_s=_env_seconds(POLL_ENV, DEFAULT_POLL_S, environ))

    def start(self) -> NoticeWatcher:
        """Start polling in the background thread; returns the watcher. Once only."""
        self._thread.start()
        return self

    def pending(self) -> Notice | None:
        """The notice seen since the last call, if any (then cleared)."""
        with self._lock:
            notice, self._fresh = self._fresh, None
        return notice

    def _loop(self) -> None:
        up = False
        while not self._stop.is_set():
            notice = self._poll_once()
            if notice is not None and not up:
                log.warning(
                    "preemption notice from %s: %s; checkpointing at the next step", notice.cloud, notice.detail
                )
                with self._lock:
                    self._fresh = notice
            up = notice is not None
            self._stop.wait(self.poll_s)

    def _poll_once(self) -> Notice | None:
        try:
            return CHECKS[self.cloud](self.base_url)
        except (OSError, ValueError) as e:  # no metadata server (not on that cloud), timeouts
            if self._errors_logged < 1:
                log.info("cannot reach %s metadata at %s (%s); will keep trying", self.cloud, self.base_url, e)
            self._errors_logged += 1
            return None

    def stop(self) -> None:
        """Stop polling, waiting a few seconds at most for a request in progress to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=REQUEST_TIMEOUT_S * 2 + 1)


class SigtermLatch:
    """Turns SIGTERM into a flag the loop checks at each step boundary, with a hard deadline.

    If no checkpoint has committed `deadline_s` after the signal (a step slower than the
    grace period, a stuck upload), the process exits with `exit_code` anyway: the previous
    committed checkpoint is intact, and SkyPilot still sees a restartable exit.
    """

    def __init__(self, *, deadline_s: float, exit_code: int) -> None:
        """Make a latch; SIGTERM is not caught before `install`.

        Args:
            deadline_s: seconds after SIGTERM at which the process exits anyway.
            exit_code: the exit code then.
        """
        self.deadline_s = deadline_s
        self.exit_code = exit_code
        self.received_at: float | None = None
        self._previous: Any = None
        self._timer: threading.Timer | None = None
        self.installed = False

    @classmethod
    def from_env(cls, *, exit_code: int, environ: Mapping[str, str] | None = None) -> SigtermLatch:
        """Make a latch whose deadline is `SKYGREEN_SIGTERM_DEADLINE_S` (25 s by default); not installed.

        Args:
            exit_code: the exit code at the deadline.
            environ: where the deadline is read (default: `os.environ`).

        Returns:
            The latch.

        Raises:
            RuntimeSetupError: the deadline is set to anything but a positive number.
        """
        environ = os.environ if environ is None else environ
        return cls(deadline_s=_env_seconds(DEADLINE_ENV, DEFAULT_SIGTERM_DEADLINE_S, environ), exit_code=exit_code)

    def install(self) -> SigtermLatch:
        """Catch SIGTERM from now on.

        Python sets signal handlers in the main thread only: from another thread this logs a
        warning and installs nothing.

        Returns:
            The latch itself.
        """
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread; SIGTERM will not trigger a checkpoint")
            return self
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self.installed = True
        return self

    def _handle(self, signum, frame) -> None:
        if self.received_at is not None:
            return
        self.received_at = time.monotonic()
        log.warning("SIGTERM; checkpointing at the next step boundary (deadline %.0f s)", self.deadline_s)
        self._timer = threading.Timer(self.deadline_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        log.error(
            "no checkpoint committed within %.0f s of SIGTERM; exiting with the last committed one",
            self.deadline_s,
        )
        from skygreen.power import restore_all

        restore_all()  # os._exit skips atexit: put the GPUs' power limits back first
        logging.shutdown()
        os._exit(self.exit_code)

    @property
    def fired(self) -> bool:
        """Whether SIGTERM has arrived."""
        return self.received_at is not None

    def uninstall(self) -> None:
        """Cancel the deadline, if running, and put back the SIGTERM handler there was before.

        The default handler when the previous one was not set from Python.
        """
        if self._timer is not None:
            self._timer.cancel()
        if self.installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self.installed = False


class PreemptionWatch:
    """The two ways a VM's end is announced, as one part: SIGTERM and the cloud's notice.

    Args:
        cloud: the cloud whose metadata endpoint to poll (`landed_cloud`); None: SIGTERM only.
        environ: where the poll interval, the endpoint and the SIGTERM deadline are read.
        exit_code: the exit code when no checkpoint committed within the SIGTERM deadline.

    Raises:
        RuntimeSetupError: a cloud it cannot watch, or a bad poll interval or deadline.
    """

    def __init__(self, *, cloud: str | None, environ: Mapping[str, str], exit_code: int) -> None:
        """Read the settings of both watches; nothing is installed or polled before `start`."""
        self.latch = SigtermLatch.from_env(exit_code=exit_code, environ=environ)
        self.watcher = NoticeWatcher.from_env(cloud, environ) if cloud else None
        self._cloud, self._environ = cloud, environ
        self._started = False
        self._used = False

    def start(self) -> PreemptionWatch:
        """Catch SIGTERM and start polling for notices.

        Call from the main thread: Python installs signal handlers only there, and from
        another thread SIGTERM is not caught (a warning says so; notices are still polled).
        After a `stop`, a new start watches afresh (a new SIGTERM latch and poller).

        Returns:
            The watch itself.
        """
        if self._used:
            self.latch = SigtermLatch(deadline_s=self.latch.deadline_s, exit_code=self.latch.exit_code)
            self.watcher = NoticeWatcher.from_env(self._cloud, self._environ) if self._cloud else None
        self.latch.install()
        if self.watcher is not None:
            self.watcher.start()
        self._started = self._used = True
        return self

    def notice(self) -> Notice | None:
        """Ask whether the cloud announced this VM's preemption.

        Returns:
            A notice that appeared since the last call (each notice once: checkpoint now, training
            goes on); None when there is none, before `start`, or off the three clouds.
        """
        return self.watcher.pending() if self.watcher is not None and self._started else None

    @property
    def sigterm(self) -> bool:
        """Whether SIGTERM has arrived since `start`.

        Then checkpoint, wait for it, and exit with the preempted code. A process still
        running at the deadline (`SKYGREEN_SIGTERM_DEADLINE_S` after the signal, 25 s by
        default) is ended by the latch itself with that code, after restoring the power limits:
        the last committed checkpoint is intact, and the VM's grace period is short.
        """
        return self.latch.fired

    def stop(self) -> None:
        """Stop polling and put the previous SIGTERM handler back; a second call does nothing."""
        if self._started and self.watcher is not None:
            self.watcher.stop()
        self.latch.uninstall()
        self._started = False
