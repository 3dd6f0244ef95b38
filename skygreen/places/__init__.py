"""Places: where a job can run (cloud, region, zone, offer, nodes), what each costs per tick,
what a move between them costs, the exact multi-region optimum and the nomad policy.

A pure core: numpy for the optimum, nothing from a cloud SDK.
"""
