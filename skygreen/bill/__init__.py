"""The whole bill of a run: compute, and every byte it moves and stores.

A pure core with its data beside it (`data/*.csv`, each row with its source and date) and no
cloud SDK inside:

- `rates`: the sourced rate table (internet egress tiers, transfer inside a cloud, object
  storage, requests) and the places (cloud, region, continent) it prices between;
- `traffic`: the bytes and requests a run makes on one offer (saves, restores, GB-months);
- `run_bill`: the bill of a run (compute, transfer, storage, requests, total);
- `interval`: the checkpoint interval that minimises the expected total cost.

`plan`, `cost` and the runtime read these; none keeps its own copy of a rate or a formula.
"""
