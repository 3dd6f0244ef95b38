"""FSDP2 (`torch.distributed.fsdp.fully_shard`) under `Run`: what changes when the model is sharded.

A model the user wrapped with `fully_shard` before handing it to `Run` is recognised here
(`is_sharded`), and the runtime then:

- does not wrap it in DDP (FSDP reduce-scatters the gradients itself);
- skips the gradient reduce-scatter on all but the last micro-step of an accumulation window
  (`set_requires_gradient_sync`), as DDP's `no_sync` does, so a step costs one reduction;
- clips the gradient norm over the sharded parameters: each rank's norm covers its shards,
  the total is reduced across ranks (DTensor does that inside `clip_grad_norm_`), and the norm
  handed back is a plain tensor, the same on every rank;
- checkpoints the model and the optimizer as `sharded_states` (their state taken with
  `get_model_state_dict` / `get_optimizer_state_dict`: keyed by names, not parameter ids, so
  the state reshards) through `skygreen.runtime.sharded`, in the same mapping of named
  stateful objects as every run (`Checkpointer.save_state` / `restore_state`);
- with `micro: auto` on several ranks, measures the micro-batch instead of trying sizes until
  one runs out of memory (`skygreen.runtime.autotune.MemoryProbe` says why).

FSDP2 takes its precision when the model is sharded, not later: `mixed_precision` turns the
task's precision into the `MixedPrecisionPolicy` to pass to `fully_shard`, and `shard` does the
wrapping (each listed block, then the root) with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from skygreen.errors import InputError
from skygreen.runtime.state import Stateful

_PARAM_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether `module` (the root given to `Run`) was wrapped with FSDP2's `fully_shard`."""
    return isinstance(module, FSDPModule)


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """Return the FSDP2 policy for a task's precision.

    Parameters gathered and computed in bf16/fp16, gradients reduced in fp32 (a sum over many
    ranks in half precision loses digits), the sharded master weights and the optimizer in
    fp32. fp32 is the default policy.

    Args:
        precision: "bf16", "fp16" or "fp32".

    Raises:
        InputError: an unknown precision.
    """
    if precision not in _PARAM_DTYPES:
        raise InputError(f"precision: {precision!r} is not one of {', '.join(_PARAM_DTYPES)}")
    dtype = _PARAM_DTYPES[precision]
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def task_precision(device: torch.device, environ: Mapping[str, str] | None = None) -> str:
    """Return the precision the runtime will train in on `device`: bf16, fp16 or fp32.

    The task's `precision`, with `auto` resolved for the GPU as `Run` resolves it; fp32 under
    the smoke test. Call before sharding, and pass it to `shard`, so FSDP2 casts as the task
    asked: the cast is fixed when the model is sharded, before `Run` sees it.

    Args:
        device: the device the model trains on.
        environ: the process environment (default: `os.environ`), read as `RuntimeSettings.from_env`.

    Returns:
        "bf16", "fp16" or "fp32".

    Raises:
        RuntimeSetupError: the run's settings are missing (outside `skygreen up`) or malformed,
            or the precision is unknown or unsupported on `device`.
    """
    import os

    from skygreen.runtime.environment import device_facts, pick_precision
    from skygreen.task.settings import SMOKE_ENV, RuntimeSettings

    env = os.environ if environ is None else environ
    if env.get(SMOKE_ENV) == "1":
        return "fp32"
    settings = RuntimeSettings.from_env(env)
    return pick_precision(settings, device_facts(device), code_precision=None, environ=env).precision


def shard(model: torch.nn.Module, *, blocks: Iterable[torch.nn.Module], precision: str = "fp32") -> torch.nn.Module:
    """Shard `model` with FSDP2: `fully_shard` each of `blocks`, then the root.

    Sharding block by block lets FSDP gather one block's weights at a time, which is what
    bounds the memory; the root holds what is left (embeddings, the head). Parameters are
    gathered and computed in `precision`, gradients reduced and master weights kept in fp32.
    Needs a process group.

    Args:
        model: the model, not yet sharded.
        blocks: its repeated blocks (e.g. the transformer layers).
        precision: "bf16", "fp16" or "fp32" (`task_precision(device)` gives the task's).

    Returns:
        `model` itself, now an `FSDPModule`, ready for `Run` or a loop of its own.

    Raises:
        InputError: `precision` is not bf16, fp16 or fp32.
    """
    policy = mixed_precision(precision)
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """Reduce-scatter gradients after this micro-step's backward (`sync`) or keep accumulating."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm over sharded (DTensor) gradients; the norm as a plain tensor."""
    params = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    full = getattr(norm, "full_tensor", None)
    return full() if callable(full) else norm


class ShardedModelState:
    """The state of a sharded model as a checkpoint holds it.

    Sharded DTensors keyed by parameter name, which the sharded checkpointer reshards to
    whatever world size loads them.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        """Wrap the state of `model`.

        Args:
            model: the root module wrapped with `fully_shard`.
        """
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        """Return this rank's shards of every parameter and buffer, by name."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put loaded (already resharded) shards back into the model."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, dict(state))


class ShardedOptimizerState:
    """The state of an optimizer over a sharded model, keyed by parameter name.

    A plain `optimizer.state_dict()` is keyed by parameter id, which does not survive resharding.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Wrap the state of `optimizer`.

        Args:
            model: the root module wrapped with `fully_shard`.
            optimizer: the optimizer over its parameters.
        """
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        """Return this rank's shards of the optimizer's state, with its hyper-parameters."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put a loaded optimizer state back (after the model's)."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, dict(state))


def sharded_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Stateful]:
    """Build the `model` and `optimizer` entries of a checkpoint's state mapping for a sharded model.

    Pass them to `ShardedCheckpointer.save_state` / `restore_state` with the other named
    states: keyed by parameter name, they reshard when a run resumes on another GPU count.

    Args:
        model: the root module wrapped with `fully_shard`.
        optimizer: the optimizer over its parameters.

    Returns:
        `{"model": ..., "optimizer": ...}`, each with `state_dict()` / `load_state_dict()`.
    """
    return {"model": ShardedModelState(model), "optimizer": ShardedOptimizerState(model, optimizer)}
