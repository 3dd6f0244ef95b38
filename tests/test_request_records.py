"""The request records `up` and `simulate` travel in from the CLI through the API: built once
from the flags, frozen, keyword-only, and refusing bad flags by name when made."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from skygreen import api
from skygreen.errors import SpecError

TASK, TRACE = Path("task.yaml"), Path("t.csv")


def test_up_request_reads_its_durations_and_checks_its_policy():
    request = api.UpRequest(task_path=TASK, deadline="36h", compute="90m", policy="greedy")
    assert request.task_path == TASK
    assert (request.deadline_h, request.compute_h) == (36.0, 1.5)
    assert request.smoke and request.watch and not request.local  # the defaults a plain `up` has
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.local = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        api.UpRequest(TASK)  # type: ignore[call-arg]  # keyword-only
    with pytest.raises(SpecError, match="--deadline"):
        api.UpRequest(task_path=TASK, deadline="soon")
    with pytest.raises(SpecError, match="--policy") as refused:
        api.UpRequest(task_path=TASK, deadline="36h", policy="fastest")
    assert "fastest" in str(refused.value) and "skygreen" in str(refused.value)


def test_simulation_request_reads_its_durations_and_refuses_bad_flags_by_name():
    request = api.SimulationRequest(trace=TRACE, hours="20h", deadline="2d", changeover="30m", start="6h")
    assert (request.compute_h, request.deadline_h, request.changeover_h, request.start_h) == (20.0, 48.0, 0.5, 6.0)
    assert request.policy == "all" and request.trace == TRACE
    base: dict[str, Any] = {"trace": TRACE, "hours": "20h", "deadline": "2d", "changeover": "30m"}
    flag_sets: tuple[tuple[dict[str, Any], str], ...] = (
        ({"policy": "skygren"}, "--policy"),
        ({"nodes": 0}, "--nodes"),
        ({"hours": "lots"}, "--hours"),
        ({"start": "-1h"}, "--start"),
    )
    for flags, name in flag_sets:
        with pytest.raises(SpecError, match=name):
            api.SimulationRequest(**{**base, **flags})


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchRequest"):
        api.NoSuchRequest  # noqa: B018
