"""skygreen for training loops a framework drives: HF `Trainer` and Lightning.

`skygreen.integrations.transformers` and `skygreen.integrations.lightning` each hold one
`SkygreenCallback`. Each module imports its framework (an extra: `skygreen[hf]`,
`skygreen[lightning]`); this package imports nothing, so it exports no names itself.
"""

__all__: list[str] = []
