"""skygreen for training loops a framework drives: HF `Trainer` (`.transformers`) and Lightning
(`.lightning`). Each module imports its framework; this package imports nothing."""
