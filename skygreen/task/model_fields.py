"""Reading the task file's `model:` section: the model's size or shape, and how it is trained.

`params:` alone says how big the model is; `config:` (a Hugging Face `config.json`) or `hf:` (a
Hub repo id, whose `config.json` alone is fetched and cached) give its shape, from which
`skygreen.memory` counts the parameters, the activations and the logits. `method:`, `lora:` and
`optimizer:` say what is trained; `seq_len`, `micro_batch`, `activation_checkpointing` and
`flash_attention` what one GPU runs.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, ClassVar

import msgspec

from skygreen.errors import SpecError
from skygreen.memory.method import (
    ALL_LINEAR,
    DEFAULT_LORA_R,
    DEFAULT_LORA_TARGETS,
    LORA_TARGETS,
    METHODS,
    OPTIMIZERS,
    Method,
)
from skygreen.memory.shape import ConfigError, ModelShape, shape_from_config
from skygreen.task.declare import ReadWith, Record, declared, meaning, read_record
from skygreen.task.readers import check_keys, read_choice, read_list, read_mapping, read_number, read_str

SHARDINGS: tuple[str, ...] = ("fsdp", "ddp")
FSDP_FROM_PARAMS = 1e9
"""`model.sharding` left out: FSDP from a billion parameters (16 GB of weights, gradients and
AdamW states, more than most single GPUs hold beside activations), DDP below."""
DEFAULT_MAX_NODES = 4
DEFAULT_SEQ_LEN = 2048
"""`model.seq_len` left out: the context most 7B fine-tuning recipes train at (Llama-2's length)."""
TASK_FOLDER: ContextVar[Path | None] = ContextVar("task_folder", default=None)
"""The folder of the task file being read, which `config:` is relative to (the current
directory when None); `skygreen.task.spec.parse_spec` sets it."""


def read_targets(raw: Any, path: str) -> tuple[str, ...]:
    """The linears that get adapters: PEFT's names, or `all-linear` (also spelt `all_linear`)."""
    if raw in (ALL_LINEAR, "all_linear"):
        return (ALL_LINEAR,)
    return tuple(
        read_choice(t, f"{path}[{i}]", (*LORA_TARGETS, ALL_LINEAR)) for i, t in enumerate(read_list(raw, path))
    )


def read_method(raw: Any, path: str) -> Method:
    """`full`, `lora` or `qlora`, as the method's kind; `parse_model` adds the adapters and
    the optimizer the section gives."""
    return raw if isinstance(raw, Method) else Method(kind=read_choice(raw, path, METHODS))


class LoraSpec(Record, frozen=True, kw_only=True):
    """`model.lora:` of the task: the adapters of `lora` and `qlora`."""

    SECTION: ClassVar[str] = "skygreen.model.lora"
    r: Annotated[
        int, meaning("The adapters' rank: r x (d_in + d_out) trainable parameters per adapted matrix.", ge=1, le=4096)
    ] = DEFAULT_LORA_R
    targets: Annotated[
        tuple[str, ...],
        meaning(
            "The linears that get adapters, as PEFT names them; `all-linear` adapts every one.",
            allowed=" | ".join((*LORA_TARGETS, ALL_LINEAR)),
            default=", ".join(DEFAULT_LORA_TARGETS),
        ),
        ReadWith(
            read_targets,
            "list or string",
            {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        ),
    ] = DEFAULT_LORA_TARGETS


class ModelSpec(Record, frozen=True, kw_only=True):
    """`model:` of the task: the model and how it is trained, so the plan keeps only GPUs that
    can hold it (`skygreen.memory` does the arithmetic)."""

    params: Annotated[
        float,
        meaning(
            "All parameters of the model. Give this, `config` or `hf`: with a count alone the plan counts model "
            "states and `activation_gb`, no logits.",
            allowed="7e9, 350000000, or with a suffix: 7B, 350M, 1.5B (K, M, B, T)",
        ),
        ReadWith(read_params, "number or string", {"type": ["number", "string"]}),
    ]
    """All parameters (7e9 for a 7B model); from the shape when the task gives `config` or `hf`."""
    activation_gb: Annotated[
        float | None,
        meaning(
            "Activation memory per GPU at the micro-batch, measured or guessed: replaces the estimate.",
            ge=0,
            le=10_000,
            unit="GB (1e9 bytes) per GPU",
            default="from the shape with `config` or `hf`, else 0",
        ),
    ] = None
    sharding: Annotated[
        str,
        meaning(
            "`fsdp` shards weights, gradients and optimizer states over every GPU of the run (ZeRO stage 3); "
            "with `ddp` every GPU holds them whole.",
            choices=SHARDINGS,
            default=f"fsdp for a full fine-tune from {FSDP_FROM_PARAMS / 1e9:g}B parameters, ddp below and for lora "
            "and qlora",
        ),
    ] = "ddp"
    max_nodes: Annotated[
        int, meaning("The most nodes the plan may give a run whose task does not fix `num_nodes`.", ge=1, le=64)
    ] = DEFAULT_MAX_NODES
    shape: ModelShape | None = None
    """Read from `config` or fetched through `hf`; None for a bare `params:`."""
    config: Annotated[
        str | None,
        meaning(
            "The model's shape (hidden size, layers, heads, key-value heads, intermediate size, vocabulary, tied "
            "embeddings): the plan counts its parameters, activations and logits from it.",
            allowed="a path to a Hugging Face config.json, relative to the task file",
        ),
    ] = None
    hf: Annotated[
        str | None,
        meaning(
            "Fetch only the repo's config.json through huggingface_hub (cached) and read the shape from it. "
            "Offline or gated: download config.json yourself and give `config`.",
            allowed="a Hugging Face repo id, e.g. meta-llama/Llama-2-7b-hf",
        ),
    ] = None
    method: Annotated[
        Method,
        meaning(
            "`full` trains every weight; `lora` freezes the base in 16-bit and trains adapters; `qlora` also stores "
            "the base's linears in 4-bit NF4 (about 0.52 bytes per parameter with its constants).",
            allowed=" | ".join(METHODS),
            default="full",
        ),
        ReadWith(read_method, "string", {"enum": list(METHODS)}),
    ] = msgspec.field(default_factory=Method)
    """What is trained, with the adapters of `lora` and the optimizer folded in."""
    lora: Annotated[
        LoraSpec | None,
        meaning(
            "The adapters of `lora` and `qlora`.",
            default=f"{{r: {DEFAULT_LORA_R}, targets: [{', '.join(DEFAULT_LORA_TARGETS)}]}} (PEFT's Llama default)",
        ),
    ] = None
    """As the task gives it; `method` holds what it sets."""
    optimizer: Annotated[
        str | None,
        meaning(
            "The optimizer's state per trainable parameter: adamw 8 bytes (fp32 moments), adamw8bit 2, sgd (with "
            "momentum) 4, adafactor about 0; mixed precision adds a 4-byte fp32 master copy.",
            choices=OPTIMIZERS,
            default="adamw",
        ),
    ] = None
    """As the task gives it; `method.optimizer` holds the one in use."""
    seq_len: Annotated[
        int,
        meaning(
            "Tokens per sample: the longest sample sets the peak, so give the length you pad or pack to.",
            ge=1,
            le=10_000_000,
            unit="tokens",
        ),
    ] = DEFAULT_SEQ_LEN
    micro_batch: Annotated[
        int, meaning("Samples per forward pass per GPU, for the activation and logit memory.", ge=1, le=65_536)
    ] = 1
    activation_checkpointing: Annotated[
        bool,
        meaning(
            "Whether the trainer recomputes activations in the backward pass (HF `gradient_checkpointing`): "
            "only each layer's input is kept. Set false if your script does not turn it on.",
            default="true (as the QLoRA, torchtune and Unsloth recipes run)",
        ),
    ] = True
    flash_attention: Annotated[
        bool,
        meaning(
            "Whether attention runs fused (flash attention, PyTorch SDPA), which never stores the attention "
            'scores. Set false for eager attention (HF `attn_implementation="eager"`): it stores every layer\'s '
            "scores, 5 to 7 bytes per head for each pair of tokens, at a few thousand tokens more than all the "
            "other activations."
        ),
    ] = True


_PARAM_SUFFIX = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMbBtT])\s*\Z")
_PARAM_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
_CONFIG_HINT = "download the model's config.json and give model: {config: path/to/config.json}"


def read_params(raw: Any, path: str) -> float:
    """A parameter count: a number (7e9, 350000000) or a string with a suffix (`7B`, `350M`)."""
    if isinstance(raw, str):
        match = _PARAM_SUFFIX.match(raw)
        if match is None:
            raise SpecError(path, "expected a parameter count", value=raw, allowed="7e9 | 7B | 350M | 1.5B",
                            hint="write e.g. 7e9 or 7B")  # fmt: skip
        raw = float(match.group(1)) * _PARAM_SCALE[match.group(2).lower()]
    value = read_number(raw, path, positive=True)
    if value < 1:
        raise SpecError(path, "a model has at least one parameter", value=raw, hint="write e.g. 7e9 or 7B")
    if value > 1e13:
        raise SpecError(
            path, "more parameters than any model skygreen can plan for", value=raw, hint="write e.g. 7e9 or 7B"
        )
    return value


def read_config_file(raw: Any, path: str, base_dir: Path) -> ModelShape:
    """The shape in the `config.json` at `raw`, relative to the task file's folder."""
    name = read_str(raw, path)
    file = Path(name).expanduser()
    file = file if file.is_absolute() else base_dir / file
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(path, f"no such file: {file}", value=name, hint="give the path of the model's config.json, "
                        "relative to the task file") from None  # fmt: skip
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecError(path, f"cannot read {file} as JSON: {e}", value=name, hint=_CONFIG_HINT) from None
    return _shape(config, path, name)


def fetch_hub_config(raw: Any, path: str) -> ModelShape:
    """The shape in the `config.json` of the Hub repo `raw` (fetched once, then from the cache)."""
    from skygreen.memory.hub import HubError, fetch_config

    repo = read_str(raw, path)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", repo):
        raise SpecError(path, "expected a Hugging Face repo id", value=repo,
                        allowed="owner/name, e.g. meta-llama/Llama-2-7b-hf", hint=_CONFIG_HINT)  # fmt: skip
    try:
        config = fetch_config(repo)
    except HubError as e:
        raise SpecError(path, str(e), value=repo, hint=_CONFIG_HINT) from None
    return _shape(config, path, repo)


def _shape(config: Any, path: str, given: str) -> ModelShape:
    try:
        return shape_from_config(config)
    except ConfigError as e:
        raise SpecError(path, f"config.json field {e.key} {e.problem}", value=given,
                        hint="give a decoder-only transformer's config.json (Llama, Mistral, Qwen, GPT-2), "
                        "or the parameter count as params:") from None  # fmt: skip


def parse_model(raw: Any, path: str) -> ModelSpec:
    """The `model:` section; `config:` is relative to the task file's folder (`TASK_FOLDER`)."""
    if isinstance(raw, ModelSpec):
        return raw
    base_dir = TASK_FOLDER.get() or Path.cwd()
    raw = read_mapping(raw, path)
    check_keys(raw, [f.name for f in declared(ModelSpec)], path)
    if isinstance(raw.get("lora"), dict):  # before `params` is required: a misspelt key is named first
        check_keys(raw["lora"], [f.name for f in declared(LoraSpec)], f"{path}.lora")
    given = [k for k in ("params", "config", "hf") if raw.get(k) is not None]
    if not given:
        raise SpecError(f"{path}.params", "is required", hint="give the parameter count, e.g. params: 7e9, "
                        "or the model's shape: config: path/to/config.json or hf: owner/name")  # fmt: skip
    if len(given) > 1:
        raise SpecError(f"{path}.{given[1]}", f"give one of params, config and hf, not {' and '.join(given)}",
                        value=raw[given[1]], hint=f"remove {given[1]}: or {given[0]}:")  # fmt: skip
    shape = None
    if raw.get("config") is not None:
        shape = read_config_file(raw["config"], f"{path}.config", base_dir)
    elif raw.get("hf") is not None:
        shape = fetch_hub_config(raw["hf"], f"{path}.hf")
    params = float(shape.params) if shape is not None else read_params(raw["params"], f"{path}.params")
    spec = typing.cast(ModelSpec, read_record(ModelSpec, {**raw, "params": params}, path, also={"shape": shape}))
    method = _method(spec, raw, path)
    # Adapters keep the states small: LoRA and QLoRA run data-parallel unless the task says otherwise.
    big = params >= FSDP_FROM_PARAMS and not method.adapters
    sharding = spec.sharding if raw.get("sharding") is not None else "fsdp" if big else "ddp"
    return msgspec.structs.replace(spec, method=method, sharding=sharding)


def _method(spec: ModelSpec, raw: Mapping[str, Any], path: str) -> Method:
    """The method's kind with the section's adapters and optimizer folded in."""
    if spec.lora is not None and spec.method.kind == "full":
        raise SpecError(f"{path}.lora", "only means something with method: lora or qlora", value=raw["lora"],
                        hint="set method: lora (or qlora), or remove lora:")  # fmt: skip
    lora = spec.lora or LoraSpec()
    optimizer = spec.optimizer or Method().optimizer
    return Method(kind=spec.method.kind, lora_r=lora.r, lora_targets=lora.targets, optimizer=optimizer)
