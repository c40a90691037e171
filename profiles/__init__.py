"""Bundled GPU performance profiles: ``<name>.csv`` plus ``<name>.json`` manifests.

Data only; load them with :func:`plant.profile_files.load_profile`. The schema, how the
literature-derived profiles are generated (``python -m gpugov.plant.roofline --out profiles/``)
and how to add a measured one are in ``README.md`` beside this file.
"""
