"""``gpugov emulate``: a whole node on loopback, backed by the simulated plant, no GPU needed."""
