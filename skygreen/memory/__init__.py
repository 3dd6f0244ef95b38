"""Model memory and step time: a transformer's shape (`shape`), how it is trained (`method`), the GPU
memory it needs (`estimate`), the links between GPUs (`interconnect`) and one step's compute and
communication (`step`). Pure arithmetic: no torch, no cloud SDK; `hub` alone imports
`huggingface_hub`, when a task names a model by its Hub id."""
