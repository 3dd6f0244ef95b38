"""`python -m skygreen.cli`: the same command as the `skygreen` entry point."""

from skygreen.cli.commands import main

main()
