"""gpugov: a serving-aware GPU clock governor, and the simulated serving plant it is studied on.

One import namespace. The repository's top-level folders map into it through the build
configuration (``pyproject.toml``): ``plant/`` is ``gpugov.plant``, ``controllers/`` is
``gpugov.controllers``, ``daemon/`` is ``gpugov.daemon``, ``profiles/`` is
``gpugov.profiles``. This module stays import-free so that ``gpugov --help`` starts fast.
"""

__version__ = "0.2.0"
