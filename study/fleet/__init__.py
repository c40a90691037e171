"""``gpugov fleet``: a simulated fleet of gpugov nodes under a power budget.

N plants, each with its own profile and its own controller (built by the node's factory in
the node's safety chain), behind a router, fed by a trace scaled to the fleet; a budget
allocator splits the fleet's watt budget into per-node caps every 15 s (``allocators``).
See ``docs/fleet.md``.
"""
