"""``python -m gpugov.study.scoreboard``: the scoreboard as a script."""

from gpugov.study.scoreboard.command import main

raise SystemExit(main())
