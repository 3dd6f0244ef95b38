"""Render: a validated task + a plan + a run's settings -> the final SkyPilot task (a plain dict).

Pure: no sky import, no I/O except reading the shipped templates. What it writes:

- the task file's own SkyPilot keys, with the `skygreen:` section gone;
- `resources`: `use_spot`, the plan's top offers as `ordered` (cloud/region + `GPU:COUNT`,
  tried in the plan's order), and `job_recovery` with the validated strategy, the restart
  budget and skygreen's "preempted" exit code in `recover_on_exit_codes`. No `instance_type`:
  it would make SkyPilot read (and download) its catalog on the client, and SkyPilot picks
  the same instance from the accelerator anyway;
- `envs`: the runtime settings (`RuntimeSettings.to_env()`), including the stable
  `SKYGREEN_RUN_ID` that survives recoveries (SkyPilot's own task id may not);
- `secrets`: the names the task declares, never their values (values travel only in memory
  at launch, see `secret_values`);
- `setup` installing the skygreen runtime, and `run` starting the task's command under it
  (`torchrun` when there are several GPUs per node or several nodes).

The shell lives in `templates/` and is filled with `string.Template`; every user string that
lands in shell is quoted with `shlex.quote`.
"""

from __future__ import annotations

import copy
import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from skygreen import __version__
from skygreen.checkpoint.bucket_set import bucket_first, is_set_url, member_schemes, members
from skygreen.errors import NoOfferError, SkygreenError, SpecError
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.task.settings import RuntimeSettings

if TYPE_CHECKING:
    from skygreen.plan.rank import Plan

from skygreen.task.checks import OWNED_RESOURCE_KEYS, check_envs, torchrun_program
from skygreen.task.spec import RECOVERY_STRATEGIES, TaskSpec

TORCHRUN_MASTER_PORT = 29500
SOURCE_MOUNT = "~/.skygreen/src"
"""Where a source checkout of skygreen is mounted on the VM when it is installed from one."""

_PYTHON = ("python", "python3")


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeInstall:
    """How `setup` installs the skygreen runtime on the VM: a pip requirement, or a source
    checkout of skygreen that is mounted to the VM and installed from there."""

    requirement: str | None = None
    source_dir: str | None = None

    def __post_init__(self) -> None:
        if (self.requirement is None) == (self.source_dir is None):
            raise ValueError("RuntimeInstall needs exactly one of requirement or source_dir")

    @classmethod
    def default(cls) -> RuntimeInstall:
        """A pip requirement for the skygreen version running here (`skygreen==<version>`)."""
        return cls(requirement=f"skygreen=={__version__}")


LAPTOP_ONLY: tuple[str, ...] = ("skypilot", "click", "rich", "packaging")
"""Base dependencies only the laptop side uses (plan, launch, the CLI, reading requirements). The VM installs
skygreen without them: SkyPilot alone is about 100 packages and 460 MB, and setup runs again
on every VM a preempted job is recovered onto."""


def container_requirements() -> tuple[str, ...]:
    """What the runtime needs on the VM: skygreen's `runtime` extra plus the base requirements
    it imports (pyyaml), read from the installed package's metadata so the list follows
    pyproject.toml."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = requires("skygreen") or []
    except PackageNotFoundError:
        declared = []
    wanted = runtime_requirements(declared)
    if not any(Requirement(w).name.lower() == "torch" for w in wanted):
        raise SkygreenError(
            "skygreen's installed package metadata lists no runtime requirements, so the VM would get no torch\n"
            "  fix: reinstall skygreen (pip install -e . in a checkout, or pip install skygreen)"
        )
    return wanted


def runtime_requirements(declared: Sequence[str]) -> tuple[str, ...]:
    """Of `declared` (the package metadata's `Requires-Dist` lines), those the VM installs,
    without their markers: a base requirement (no marker) unless it is `LAPTOP_ONLY`, and one
    that only the `runtime` extra asks for. Parsed with `packaging` as pip parses them, so
    spacing, quoting, name case and extra environment markers all read alike."""
    laptop_only = {canonicalize_name(name) for name in LAPTOP_ONLY}
    wanted = []
    for line in declared:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None:
            keep = canonicalize_name(requirement.name) not in laptop_only
        else:
            keep = marker.evaluate({"extra": "runtime"}) and not marker.evaluate({"extra": ""})
        if keep:
            requirement.marker = None
            wanted.append(str(requirement))
    return tuple(wanted)


# ---------------------------------------------------------------- public


def render_task(
    spec: TaskSpec,
    plan: Plan | None,
    *,
    settings: RuntimeSettings,
    task_dir: Path,
    install: RuntimeInstall | None = None,
) -> dict[str, Any]:
    """The final SkyPilot task for one run.

    `plan` is a `skygreen.plan.rank.Plan` (its `candidates`, best first); None renders the task for
    `--local`: no cloud resources, no setup (the runtime is already installed here), and the
    command without torchrun (one process on this machine).
    """
    sky = copy.deepcopy(dict(spec.sky))
    task: dict[str, Any] = {"name": spec.name or "skygreen"}
    task["workdir"] = _workdir(sky.get("workdir"), task_dir)
    # With a model the plan picks the nodes that hold it; otherwise they are the task's own.
    nodes = plan.best.num_nodes if plan is not None and spec.green.model is not None else spec.num_nodes
    if nodes != 1 and plan is not None:
        task["num_nodes"] = nodes
    if plan is not None:
        task["resources"] = _resources(spec, plan, sky.get("resources"))
    task["envs"] = _envs(spec, settings, sky.get("envs"))
    secrets = _secret_refs(sky.get("secrets"))
    if secrets is not None:
        task["secrets"] = secrets
    file_mounts = dict(sky.get("file_mounts") or {})
    if plan is not None:
        install = install or RuntimeInstall.default()
        if install.source_dir is not None:
            file_mounts[SOURCE_MOUNT] = install.source_dir
        task["setup"] = _setup(spec, settings, install)
    elif sky.get("setup"):
        task["setup"] = sky["setup"]
    if file_mounts:
        task["file_mounts"] = file_mounts
    for key, value in sky.items():  # SkyPilot keys skygreen does not touch, kept as written
        if key not in task and key not in ("resources", "num_nodes", "run", "setup"):
            task[key] = value
    ranks = max((_ranks(e) for e in task["resources"]["ordered"]), default=1) * nodes if plan is not None else 1
    task["run"] = _run(spec, settings, distributed=plan is not None, ranks=max(ranks, spec.green.gpu_count * nodes))
    return task


def declared_secrets(spec: TaskSpec) -> tuple[str, ...]:
    """Names of the secrets the task declares (dict keys, or `secrets:NAME` list entries)."""
    raw = spec.sky.get("secrets")
    if isinstance(raw, Mapping):
        return tuple(str(k) for k in raw)
    if isinstance(raw, list):
        return tuple(str(item) for item in raw)
    return ()


def secret_values(spec: TaskSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """Values for the declared secrets, for the launch call only (never written anywhere).

    The environment of `skygreen up` wins over a value written in the task file; a secret with
    neither stays a reference that SkyPilot resolves itself (its managed secrets).
    """
    raw = spec.sky.get("secrets")
    values: dict[str, str] = {}
    if isinstance(raw, Mapping):
        for name, value in raw.items():
            name = str(name)
            if name.startswith("secrets:"):
                continue
            if environ.get(name):
                values[name] = environ[name]
            elif value is not None:
                values[name] = str(value)
    return values


def to_yaml(task: Mapping[str, Any]) -> str:
    """YAML text of a rendered task; multi-line scripts as readable `|` blocks."""
    return yaml.dump(dict(task), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


# ---------------------------------------------------------------- resources


def _resources(spec: TaskSpec, plan: Plan, user_resources: Any) -> dict[str, Any]:
    base = dict(user_resources or {})
    for key, owner in OWNED_RESOURCE_KEYS.items():
        if key in base:
            raise SpecError(
                f"resources.{key}",
                "is chosen by skygreen from the plan",
                value=base[key],
                hint=f"remove resources.{key}; set {owner} instead",
            )
    green = spec.green
    strategy = green.recovery.strategy.upper()
    if strategy not in RECOVERY_STRATEGIES:  # the spec validates it; SkyPilot's client does not
        raise SpecError(
            "skygreen.recovery.strategy",
            "unknown recovery strategy",
            value=strategy,
            allowed=", ".join(RECOVERY_STRATEGIES),
        )
    base["use_spot"] = green.spot
    base["job_recovery"] = {
        "strategy": strategy,
        "max_restarts_on_errors": green.recovery.max_restarts_on_errors,
        "recover_on_exit_codes": [PREEMPTED_EXIT_CODE],
    }
    ordered = _ordered(plan)
    if is_set_url(green.checkpoint.bucket):
        assert green.checkpoint.bucket is not None
        ordered = bucket_first(members(green.checkpoint.bucket), ordered, _infra)
    base["ordered"] = ordered[: green.max_candidates]
    return base


def _infra(entry: Mapping[str, Any]) -> tuple[str, str]:
    """(cloud, region) of one `ordered` entry (`"aws/us-east-1"`)."""
    cloud, _, region = str(entry["infra"]).partition("/")
    return cloud, region


def _ranks(entry: Mapping[str, Any]) -> int:
    """GPUs per node of one `ordered` entry (`"A100:8"` -> 8)."""
    return int(str(entry["accelerators"]).rpartition(":")[2])


def _ordered(plan: Plan) -> list[dict[str, Any]]:
    """The plan's offers as SkyPilot candidates, best first, one per cloud/region/GPU/count/spot
    (all of them: the caller keeps `max_candidates`, after a bucket set has put the places of
    the pick's bucket first).

    Offers differing only by instance type or zone collapse into one entry: SkyPilot picks the
    instance for the accelerator and tries every zone of the region itself. `num_nodes` belongs
    to the whole task in SkyPilot, so only offers on the winner's number of nodes are listed,
    with whatever GPU count each has (a sharded checkpoint reshards onto it; the plan kept only
    counts the effective batch splits evenly over).
    """
    nodes = plan.best.num_nodes
    entries: list[dict[str, Any]] = []
    for offer in plan.candidates:
        if offer.num_nodes != nodes:
            continue
        entry = {
            "infra": f"{offer.cloud}/{offer.region}",
            "accelerators": f"{offer.accelerator}:{offer.accelerator_count}",
            "use_spot": bool(offer.spot),
        }
        if entry not in entries:
            entries.append(entry)
    if not entries:
        raise NoOfferError(
            "the plan has no offers to launch\n  fix: run `skygreen plan TASK` to see which constraint to relax"
        )
    return entries


# ---------------------------------------------------------------- envs, secrets, workdir


def _envs(spec: TaskSpec, settings: RuntimeSettings, user_envs: Any) -> dict[str, str]:
    check_envs(spec)  # none of skygreen's own, every one with a value
    envs = {str(key): str(value) for key, value in dict(user_envs or {}).items()}
    envs.update(settings.to_env())
    return envs


def _secret_refs(raw: Any) -> dict[str, None] | list[str] | None:
    """The task's secrets as references only: names with null values (or the list form)."""
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        return {str(name): None for name in raw}
    if isinstance(raw, list):
        return [str(item) for item in raw]
    raise SpecError("secrets", "expected a mapping of names to values, or a list of secrets:NAME",
                    value=type(raw).__name__, hint="write one NAME: value per line, indented under secrets:")  # fmt: skip


def _workdir(raw: Any, task_dir: Path) -> Any:
    """The task's workdir resolved against the task file's folder (default: that folder)."""
    if isinstance(raw, Mapping):  # a git workdir {url, ref}: SkyPilot's business
        return dict(raw)
    if raw is None:
        return str(Path(task_dir).resolve())
    path = Path(str(raw)).expanduser()
    return str(path if path.is_absolute() else (Path(task_dir) / path).resolve())


# ---------------------------------------------------------------- setup and run


def _setup(spec: TaskSpec, settings: RuntimeSettings, install: RuntimeInstall) -> str:
    if install.source_dir is not None:
        target = '"$HOME/.skygreen/src"'
    else:
        target = shlex.quote(install.requirement or "")
    wanted = container_requirements()
    requirements = " ".join(shlex.quote(r) for r in wanted)
    user_setup = spec.sky.get("setup")
    user_part = ""
    if user_setup:
        user_part = _template("user_setup.sh.tmpl").substitute(user_setup_quoted=shlex.quote(str(user_setup)))
    return (
        _template("setup.sh.tmpl")
        .substitute(
            version=__version__,
            run_id=settings.run_id,
            install_target=target,
            runtime_requirements=requirements,
            wanted_quoted=shlex.quote(f"{__version__} {install.requirement or 'source'} {requirements}"),
            version_quoted=shlex.quote(__version__),
            reuse=0 if install.source_dir is not None else 1,  # a checkout may change under one version
            store_install=_store_install(settings.bucket, wanted),
            user_setup=user_part,
        )
        .rstrip()
        + "\n"
    )


STORE_CLIENTS: dict[str, str] = {"s3": "boto3", "gs": "google-cloud-storage", "az": "azure-storage-blob"}
"""The client library each bucket scheme's store imports: on a fresh image setup installs it right
after skygreen, so the checkpoint prefetch can start before the other runtime requirements."""
AZURE_IDENTITY = "azure-identity>=1.15"
"""Installed beside azure-storage-blob for an az:// bucket, so a VM with a managed identity needs
no key (the `azure` extra in pyproject.toml; a test holds the two equal). Keys travel as the
task's declared `secrets` (AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY), never in the YAML."""


def _store_install(bucket: str, wanted: Sequence[str]) -> str:
    """The setup lines that install the bucket's client library (as the runtime requirements pin
    it), or a no-op for a local bucket."""
    schemes = member_schemes(bucket)  # every bucket of a set
    clients = [STORE_CLIENTS[s] for s in schemes if s in STORE_CLIENTS]
    pinned = [r for r in wanted if canonicalize_name(Requirement(r).name) in clients]
    if not pinned:
        return ":  # a local bucket needs no client library"
    packages = [*pinned, AZURE_IDENTITY] if "az" in schemes else pinned
    return (
        f'skygreen_say "installing {" and ".join(clients)} for the bucket before the rest, so the prefetch can start"\n'
        f"    skygreen_pip {' '.join(shlex.quote(p) for p in packages)}"
    )


def _run(spec: TaskSpec, settings: RuntimeSettings, *, distributed: bool, ranks: int = 1) -> str:
    command = spec.sky.get("run")
    if not command or not str(command).strip():
        raise SpecError("run", "is required: the command that trains", hint="add e.g. `run: python train.py`")
    command = str(command).strip()
    if distributed and ranks > 1:
        command = torchrun_command(command, spec)
    if spec.green.trainer == "folder":  # restores, mirrors and commits the script's checkpoint folders
        command = f"python -m skygreen.folder_mode -- {shlex.quote(command)}"
    return _template("run.sh.tmpl").substitute(
        version=__version__,
        run_id=settings.run_id,
        preempted_exit_code=PREEMPTED_EXIT_CODE,
        command_quoted=shlex.quote(command),
    )


def torchrun_command(command: str, spec: TaskSpec) -> str:
    """`python train.py ARGS` -> `torchrun <SkyPilot's node layout> train.py ARGS`; a command
    that already calls torchrun is left alone (`task.checks.torchrun_program` says which)."""
    program = torchrun_program(command, spec)
    if program is None:
        return command
    return _template("torchrun.sh.tmpl").substitute(master_port=TORCHRUN_MASTER_PORT, program=program).strip()


@cache
def _template(name: str) -> string.Template:
    return string.Template(template_path(name).read_text(encoding="utf-8"))


def template_path(name: str) -> Any:
    """A shipped template: `skygreen/templates` (a link to the repository's `templates/`
    in a checkout, real files in an installed wheel)."""
    return resources.files("skygreen").joinpath("templates").joinpath(name)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str_representer)
