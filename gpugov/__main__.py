"""``python -m gpugov``: the same entry point as the ``gpugov`` console script."""

import sys

from gpugov.cli import main

if __name__ == "__main__":
    sys.exit(main())
