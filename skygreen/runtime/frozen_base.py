"""A PEFT model's checkpoint: only what is trained, plus the identity of the frozen base.

A LoRA fine-tune of a 7B model trains a few million parameters; the 7B base never changes and
is loaded from its own files (the Hub, a local path) at every start. Saving the base with
every checkpoint would move and store about 14 GB per save for nothing: the adapter and its
optimizer state are megabytes. So a PEFT model's checkpoint holds its trainable parameters and
the base's identity, the model name and a sha256 digest of the frozen weights, and a restore
refuses to put an adapter on a different base (`BaseModelMismatchError`): an adapter trained
on one base is noise on another, and nothing else would notice.

Used by `sg.Run` (`TrainableState` stands in for the model in its state mapping) and by the HF
callback (the Trainer already saves only the adapter of a PEFT model; the identity goes into
the commit's meta, `FROZEN_BASE_META`). peft itself is never imported here: a model is a PEFT
model when one of its classes comes from the `peft` package.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from skygreen.errors import CheckpointError

__all__ = [
    "FROZEN_BASE_META",
    "BaseIdentity",
    "BaseModelMismatchError",
    "TrainableState",
    "base_identity",
    "check_base",
    "peft_model",
]

FROZEN_BASE_META = "frozen_base"
"""The manifest meta key (HF callback) and state key (`TrainableState`) of the base's identity."""


class BaseModelMismatchError(CheckpointError):
    """The checkpoint's adapter was trained on another base model than the one loaded now."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BaseIdentity:
    """Which frozen base a PEFT model sits on."""

    name: str | None
    """The base's name or path as the model was loaded (`config._name_or_path`); None if unknown."""
    digest: str
    """sha256 over every frozen parameter's name, dtype, shape and bytes, in name order."""
    params: int
    """Frozen parameters counted."""

    def to_json(self) -> dict[str, Any]:
        """The stored form (plain strings and numbers: it loads with `weights_only=True`)."""
        return {"name": self.name, "digest": self.digest, "params": self.params}


def peft_model(module: Any) -> Any | None:
    """The PEFT model inside `module` (itself, or under DDP's `.module`), or None when there is none."""
    seen = module
    for _ in range(4):
        if any(cls.__module__.split(".")[0] == "peft" for cls in type(seen).__mro__):
            return seen
        if not hasattr(seen, "module"):
            return None
        seen = seen.module
    return None


def base_name(model: Any) -> str | None:
    """The base model's name or path: the PEFT config's `base_model_name_or_path`, else the
    model config's `_name_or_path`; None when neither says."""
    for config in dict(getattr(model, "peft_config", None) or {}).values():
        name = getattr(config, "base_model_name_or_path", None)
        if name:
            return str(name)
    config = getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(config) if config else None


def base_identity(model: torch.nn.Module) -> BaseIdentity:
    """The name and digest of `model`'s frozen parameters (those that do not require grad).

    Reads every frozen byte once (a 7B base in bf16: 14 GB, some seconds): callers compute it
    once per process. Tensors are hashed as they sit in memory, so the same base loaded in
    another dtype is another base (its adapter trained against other numbers).
    """
    digest = hashlib.sha256()
    count = 0
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        if param.requires_grad:
            continue
        data = param.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{data.dtype}|{tuple(param.shape)}\n".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
        count += param.numel()
    return BaseIdentity(name=base_name(model), digest=digest.hexdigest(), params=count)


def check_base(saved: Mapping[str, Any] | None, current: BaseIdentity) -> None:
    """Refuse a checkpoint whose frozen base is not `current`.

    The digest decides (a name can be a path that moved); the names only help the message. A
    checkpoint without an identity (written before it was kept) passes.

    Raises:
        BaseModelMismatchError: the digests differ.
    """
    if not saved or not saved.get("digest"):
        return
    if saved["digest"] == current.digest:
        return
    raise BaseModelMismatchError(
        f"the checkpoint's adapter was trained on base model {saved.get('name') or '(unnamed)'} "
        f"(weights sha256 {str(saved['digest'])[:12]}, {saved.get('params', '?')} parameters), "
        f"but the base loaded now is {current.name or '(unnamed)'} "
        f"(weights sha256 {current.digest[:12]}, {current.params} parameters)\n"
        "  fix: load the same base model (name, revision and dtype) the run started with, "
        "or start a new run for the new base"
    )


class TrainableState:
    """A PEFT model as `sg.Run` checkpoints it: its trainable parameters and its base's identity.

    `state_dict()` is `{"frozen_base": {...}, "trainable": {name: tensor}}`; `load_state_dict`
    checks the base first (`check_base`), then copies every trainable tensor in, refusing a
    checkpoint that lacks one or has one the model does not train.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._identity: BaseIdentity | None = None

    @property
    def identity(self) -> BaseIdentity:
        """The base's identity, computed on first use (the base never changes during a run)."""
        if self._identity is None:
            self._identity = base_identity(self.model)
        return self._identity

    def trainable(self) -> dict[str, torch.nn.Parameter]:
        """The parameters that require grad, by name."""
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}

    def state_dict(self) -> dict[str, Any]:
        """The trainable tensors and the base's identity."""
        return {
            FROZEN_BASE_META: self.identity.to_json(),
            "trainable": {name: p.detach() for name, p in self.trainable().items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check the base, then copy the trainable tensors in.

        Raises:
            BaseModelMismatchError: the checkpoint was trained on another base.
            CheckpointError: the checkpoint is not a trainable-state one, or its tensors do not
                match the model's trainable parameters.
        """
        if not isinstance(state, Mapping) or "trainable" not in state:
            raise CheckpointError(
                "the checkpoint holds the whole model, but this model is a PEFT model that checkpoints "
                "only what it trains\n  fix: resume with the model the run was started with"
            )
        check_base(state.get(FROZEN_BASE_META), self.identity)
        params = self.trainable()
        saved = dict(state["trainable"])
        missing, unexpected = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
        if missing or unexpected:
            raise CheckpointError(
                f"the checkpoint's trainable tensors do not match the model's: missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}\n  fix: resume with the same adapter configuration (r, targets)"
            )
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(saved[name])
