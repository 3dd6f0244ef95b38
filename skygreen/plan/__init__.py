"""Planning, on the laptop: price the offers for a task and rank them.

`catalog` (SkyPilot's prices) -> `cost` (one run's hours, dollars, energy, carbon from
`carbon`) -> `rank` (the ranked `Plan`) -> `report` (the table). `replay` checks the cost
model against real spot traces; `catalog_update` refreshes the catalog through SkyPilot.
The task file itself (`skygreen.task.spec`) is shared with the container side.
"""
