"""Checkpoints and the buckets that hold them.

`manifest` (key layout, the manifest that commits a step, reading the latest), `retention`
(what a commit keeps, quarantine of what does not load; `keep` checks the count),
`interval` (when to save), `gc` (moving old checkpoints to cold storage), `bucket_url` (the one
bucket-URL parser), and `store` (the bucket seam: the protocol and the one retry layer) with
its three implementations `s3_store` and `gcs_store` (over their shared base `cloud_store`)
and `local_store`, opened by scheme in `store_factory`. The tensors themselves are the
runtime's (`skygreen.runtime.checkpointer`).
"""
