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
    """The FSDP2 policy for a task's precision: parameters gathered and computed in bf16/fp16,
    gradients reduced in fp32 (a sum over many ranks in half precision loses digits), the
    sharded master weights and the optimizer in fp32. fp32 is the default policy.

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
    """The precision the runtime will train in on `device` (bf16, fp16 or fp32): the task's
    `precision`, with `auto` resolved for the GPU as `Run` resolves it; fp32 under smoke tests.
    Call before sharding, and pass it to `shard`, so FSDP2 casts as the task asked."""
    import os

    from skygreen.runtime.environment import device_facts, pick_precision
    from skygreen.settings import SMOKE_ENV, RuntimeSettings

    env = os.environ if environ is None else environ
    if env.get(SMOKE_ENV) == "1":
        return "fp32"
    settings = RuntimeSettings.from_env(env)
    return pick_precision(settings, device_facts(device), code_precision=None, environ=env).precision


def shard(model: torch.nn.Module, *, blocks: Iterable[torch.nn.Module], precision: str = "fp32") -> torch.nn.Module:
    """`fully_shard` each of `blocks` (e.g. the transformer layers), then the root, with the
    policy for `precision`; returns the model (now an `FSDPModule`). Needs a process group.

    Sharding block by block lets FSDP gather one block's weights at a time, which is what
    bounds the memory; the root holds what is left (embeddings, the head).
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
    """The state of a sharded model as a checkpoint holds it: sharded DTensors keyed by parameter
    name, which the sharded checkpointer reshards to whatever world size loads them.

    Args:
        model: the root module wrapped with `fully_shard`.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        """This rank's shards of every parameter and buffer, by name."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put loaded (already resharded) shards back into the model."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, dict(state))


class ShardedOptimizerState:
    """The state of an optimizer over a sharded model, keyed by parameter name (a plain
    `optimizer.state_dict()` is keyed by parameter id, which does not survive resharding).

    Args:
        model: the root module wrapped with `fully_shard`.
        optimizer: the optimizer over its parameters.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        """This rank's shards of the optimizer's state, with its hyper-parameters."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put a loaded optimizer state back (after the model's)."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, dict(state))


def sharded_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Stateful]:
    """The `model` and `optimizer` entries of a checkpoint's state mapping for a sharded model,
    to pass to `ShardedCheckpointer.save_state` / `restore_state` with the other named states.

    Args:
        model: the root module wrapped with `fully_shard`.
        optimizer: the optimizer over its parameters.

    Returns:
        `{"model": ..., "optimizer": ...}`, each with `state_dict()` / `load_state_dict()`.
    """
    return {"model": ShardedModelState(model), "optimizer": ShardedOptimizerState(model, optimizer)}
