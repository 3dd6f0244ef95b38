"""What runs cost, on the laptop: the ledger priced, tasks estimated, runs compared, drawn.

`costing` (a run's cost from its ledger, a task per cloud, `compare`), `speeds` (the speeds
earlier runs measured, which `plan` reads) -> `report` (the terminal tables) and `page` (figures and the one-page HTML report,
matplotlib from the `report` extra). The ledger itself and its pricing are `skygreen.ledger`.
"""
