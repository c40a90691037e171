"""``python -m gpugov.study.scoreboard.run``: the scoreboard as a script."""

from gpugov.study.scoreboard.run import main

raise SystemExit(main())
