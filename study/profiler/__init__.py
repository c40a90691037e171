"""``gpugov profile``: measure a GPU profile (CSV + manifest) by sweeping locked clocks."""
