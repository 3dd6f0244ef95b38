"""Checkpoints and the buckets that hold them.

`manifest` (key layout, the manifest that commits a step, reading the latest), `retention`
(what a commit keeps, quarantine of what does not load; `keep` checks the count),
`interval` (when to save), `gc` (moving old checkpoints to cold storage), and `store` (the
bucket seam) with its three implementations `s3_store`, `gcs_store` and `local_store`. The
tensors themselves are the runtime's (`skygreen.runtime.checkpointer`).
"""
