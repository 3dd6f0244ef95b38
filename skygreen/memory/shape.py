"""A transformer's shape, read from a Hugging Face `config.json`, and the parameter count it implies.

The fields and their spellings per family are those the EleutherAI cookbook's
`calc/calc_transformer_mem.py` reads (a GPT-2 branch for the `n_*` names): hidden size h, layers L,
attention heads a, key-value heads (GQA; absent means a), head dimension d (absent means h/a), MLP
intermediate size i, vocabulary V and tied embeddings.

Parameter count, Llama style (RMSNorm, SwiGLU, no biases; h_q = a*d, h_kv = kv*d):

    per_layer = h*h_q + 2*h*h_kv + h_q*h + 3*h*i + 2*h
    P         = V*h + (0 if tied else V*h) + L*per_layer + h

GPT-2 style (biases, LayerNorm, GELU MLP of two matrices, learned positions, tied head), the
Ultra-Scale Playbook's formula plus the positions: P = V*h + n_pos*h + L*(12h^2 + 13h) + 2h,
written out below for any i. Both match the published counts exactly (Llama-2-7B 6,738,415,616;
Llama-3-8B 8,030,261,248; Mistral-7B 7,241,732,096; GPT-2 124,439,808).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

STYLES: tuple[str, ...] = ("llama", "gpt2")
"""llama: gated MLP (gate, up, down), RMSNorm, no biases (Llama, Mistral, Qwen, Gemma);
gpt2: two-matrix MLP with biases, LayerNorm, learned positions (GPT-2, OPT-like)."""


class ConfigError(ValueError):
    """A `config.json` lacks a field the shape needs, or holds a value that cannot be one."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """The sizes that set a decoder-only transformer's memory and compute."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    style: str = "llama"
    positions: int = 0
    """Learned position embeddings (GPT-2's `n_positions`); 0 for rotary models."""

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelShape.{name} must be >= 1, got {getattr(self, name)}")
        if self.style not in STYLES:
            raise ValueError(f"ModelShape.style must be one of {STYLES}, got {self.style!r}")

    @property
    def q_dim(self) -> int:
        """Width of the query projection's output (a*d; h for most models)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key and of the value projection's output (kv*d: smaller than h under GQA)."""
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Each per-layer linear as PEFT names it (Llama spelling), -> (d_in, d_out)."""
        h, i = self.hidden, self.intermediate
        shapes = {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        if self.style == "llama":
            shapes["gate_proj"] = (h, i)
        return shapes

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the layer's linears (what QLoRA quantizes), biases left out."""
        return sum(d_in * d_out for d_in, d_out in self.linear_shapes().values())

    @property
    def layer_params(self) -> int:
        """All parameters of one transformer layer: linears, their biases (GPT-2) and norms."""
        h = self.hidden
        if self.style == "llama":
            return self.linear_params_per_layer + 2 * h
        biases = self.q_dim + 2 * self.kv_dim + h + self.intermediate + h
        return self.linear_params_per_layer + biases + 4 * h  # two LayerNorms, weight and bias

    @property
    def embedding_params(self) -> int:
        """Token (and learned position) embeddings plus an untied output head."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + self.positions * self.hidden + head

    @property
    def params(self) -> int:
        """The whole model's parameter count (see the module docstring)."""
        final_norm = self.hidden if self.style == "llama" else 2 * self.hidden
        return self.embedding_params + self.layers * self.layer_params + final_norm

    @property
    def largest_unit_params(self) -> int:
        """The biggest block FSDP or ZeRO-3 gathers whole at once: one layer, or the embedding
        (output head) when it is bigger (Llama-3's 128k vocabulary)."""
        return max(self.layer_params, self.vocab * self.hidden)


_NAMES: Mapping[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
}


def _field(config: Mapping[str, Any], name: str) -> int:
    for key in _NAMES[name]:
        if config.get(key) is not None:
            return _positive_int(config[key], key)
    raise ConfigError(_NAMES[name][0], f"is missing (also looked for {', '.join(_NAMES[name][1:]) or 'nothing else'})")


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 1:
        raise ConfigError(key, f"expected a whole number >= 1, got {value!r}")
    return int(value)


def shape_from_config(config: Mapping[str, Any]) -> ModelShape:
    """The shape a Hugging Face `config.json` (already parsed) describes.

    GPT-2's spelling (`n_embd`, `n_layer`, `n_head`, `n_inner`, `n_positions`) selects the GPT-2
    style; every other config is read as Llama style, with `intermediate_size` (or OPT's `ffn_dim`).

    Raises:
        ConfigError: a needed field is missing or is not a positive whole number.
    """
    if not isinstance(config, Mapping):
        raise ConfigError("(file)", f"a config.json holds a JSON object, got {type(config).__name__}")
    hidden = _field(config, "hidden")
    layers = _field(config, "layers")
    heads = _field(config, "heads")
    vocab = _field(config, "vocab")
    gpt2 = "n_embd" in config or config.get("model_type") == "gpt2"
    kv_heads = (
        _positive_int(config["num_key_value_heads"], "num_key_value_heads")
        if config.get("num_key_value_heads")
        else heads
    )
    head_dim = _positive_int(config["head_dim"], "head_dim") if config.get("head_dim") else hidden // heads
    if gpt2:
        inner = config.get("n_inner")
        intermediate = 4 * hidden if inner is None else _positive_int(inner, "n_inner")
        positions = _positive_int(config.get("n_positions", 1024), "n_positions")
        return ModelShape(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                          intermediate=intermediate, vocab=vocab, tied_embeddings=True, style="gpt2",
                          positions=positions)  # fmt: skip
    for key in ("intermediate_size", "ffn_dim"):
        if config.get(key) is not None:
            intermediate = _positive_int(config[key], key)
            break
    else:
        raise ConfigError("intermediate_size", "is missing (also looked for ffn_dim)")
    tied = config.get("tie_word_embeddings", False) is True
    return ModelShape(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                      intermediate=intermediate, vocab=vocab, tied_embeddings=tied)  # fmt: skip
