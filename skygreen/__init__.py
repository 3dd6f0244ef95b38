"""skygreen: cheap, green cloud GPU training on top of SkyPilot.

The laptop side (`skygreen.api`, the `skygreen` command) plans, renders and launches; the
container side (`skygreen.runtime`) wraps the user's PyTorch loop. Importing this package
imports neither sky nor torch.
"""

__version__ = "0.1.0"
