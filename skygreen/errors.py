"""skygreen's exception tree.

Every error a user can cause or meet is a `SkygreenError`. The CLI prints its message and
exits with its `exit_code`, without a traceback unless `SKYGREEN_DEBUG=1`. Adapters translate
the errors of outside libraries (boto3, google-cloud-storage, SkyPilot, NVML) into these
classes with `raise ... from e`, so the cause stays attached for debugging.

Exit codes: 2 for bad input (the user can fix it by changing what they typed or wrote),
1 for failures of the world (a bucket that refuses, a cloud that says no); the whole table,
run outcomes included, is `skygreen.exit_codes`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from skygreen.exit_codes import BAD_INPUT as EXIT_BAD_INPUT
from skygreen.exit_codes import FAILED as EXIT_FAILURE


class SkygreenError(Exception):
    """Base class: a message meant for the user, and the exit code the CLI returns.

    Catch this one class around any skygreen call: every error a user can cause or meet is
    one, with the outside library's error kept as its `__cause__`.

    Attributes:
        exit_code: what the `skygreen` command exits with: 2 for bad input
            (`InputError` and below), 1 for failures of the world; a few carry their own
            (a superseded checkpoint writer exits 3; the table is `skygreen.exit_codes`).
    """

    exit_code = EXIT_FAILURE


class InputError(SkygreenError):
    """Bad input the user can fix: a flag, a path, a run id."""

    exit_code = EXIT_BAD_INPUT


ERROR_WIDTH = 80
"""Columns an error's `allowed:` list wraps at (at word boundaries, its later lines indented)."""


def _wrapped(line: str) -> list[str]:
    """`line` in lines of at most `ERROR_WIDTH` columns, broken after a comma or blank, never in a word."""
    import textwrap

    return textwrap.wrap(line, width=ERROR_WIDTH, subsequent_indent="    ", break_long_words=False,
                         break_on_hyphens=False) or [line]  # fmt: skip


class SpecError(InputError):
    """A task file field is wrong.

    The message always names the field path, the bad value, what is allowed, and, where a
    near miss exists, what the user probably meant.
    """

    def __init__(
        self,
        field: str,
        problem: str,
        *,
        value: Any = None,
        allowed: str | None = None,
        hint: str | None = None,
        source: str | None = None,
        line: int | None = None,
    ) -> None:
        """Keep the error's parts and build its message from them (`_format`)."""
        self.field = field
        self.problem = problem
        self.value = value
        self.allowed = allowed
        self.hint = hint
        self.source = source
        self.line = line
        """1-based line in `source`, where known.

        Shown after the problem, so that every error still starts with `file.yaml: field.path:`.
        """
        super().__init__(self._format())

    def _format(self) -> str:
        where = f"{self.source}: " if self.source else ""
        at_line = f" (line {self.line})" if self.line else ""
        lines = [f"{where}{self.field}: {self.problem}{at_line}"]
        if self.value is not None:
            lines.append(f"  got: {self.value!r}")
        if self.allowed:
            lines.extend(_wrapped(f"  allowed: {self.allowed}"))
        if self.hint:
            lines.append(f"  fix: {self.hint}")
        return "\n".join(lines)

    def with_source(self, source: str, *, line: int | None = None) -> SpecError:
        """The same error, naming the file it came from (and the line, where known)."""
        return SpecError(
            self.field,
            self.problem,
            value=self.value,
            allowed=self.allowed,
            hint=self.hint,
            source=source,
            line=line,
        )


class NoOfferError(InputError):
    """The constraints admit no offer in the catalog; the message says which one to relax."""


class NoLedgerYetError(InputError):
    """The run has no ledger yet: it was launched but is not training yet.

    `skygreen cost` answers from its launcher instead (`skygreen.api.cost_before_ledger`).
    """


class CatalogError(SkygreenError):
    """The price catalog is missing, unreadable or cannot be refreshed."""


class StoreError(SkygreenError):
    """A checkpoint store (bucket) failed permanently: no bucket, no access, bad URL."""


class TransientStoreError(StoreError):
    """A store failure worth retrying: 5xx, throttling, connection reset, timeout."""


class KeyNotFoundError(StoreError):
    """The key does not exist in the store (a normal answer, never retried)."""


class ArchivedObjectError(StoreError):
    """The object sits in a cold storage class and must be restored before it can be read."""


class NoCredentialsError(StoreError):
    """This machine has no credentials for the bucket's cloud (the VM may well have them)."""


class BucketUnreachableError(StoreError):
    """The bucket did not answer (network down, wrong endpoint, server stopped); one line."""


class CheckpointError(SkygreenError):
    """No usable checkpoint, or one that fails verification."""


class RankTimeoutError(CheckpointError):
    """Some ranks did not deliver their part of a checkpoint in time (not committed)."""


class SmokeTestError(SkygreenError):
    """The training script failed its CPU smoke test; the message names the step and the error."""


class LaunchError(SkygreenError):
    """SkyPilot refused or failed to launch or query a job."""


class RuntimeSetupError(InputError):
    """The in-container runtime was configured wrongly (settings, environment)."""


class PowerError(SkygreenError):
    """NVML refused or failed a read or a power-limit change (see `skygreen.power.nvml`)."""


class PowerPermissionError(PowerError):
    """Setting power limits needs root or CAP_SYS_ADMIN; reading never does."""


class PowerNotSupportedError(PowerError):
    """This GPU (or its driver, or a vGPU) lacks the feature: power limits or the energy counter."""


class GpuLostError(PowerError):
    """The GPU fell off the bus or stopped answering."""


class NvmlMissingError(PowerError):
    """No NVML here: `nvidia-ml-py` not installed, or no NVIDIA driver."""


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The closest choice to a misspelt word, or None when nothing is close.

    Case-insensitive, since GPU and cloud names are often typed in either case.
    """
    by_lower = {c.lower(): c for c in choices}
    match = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[match[0]] if match else None


def suggestion(word: str, choices: Iterable[str]) -> str | None:
    """A 'did you mean' hint for SpecError, or None."""
    near = did_you_mean(word, choices)
    return f"did you mean {near!r}?" if near else None
