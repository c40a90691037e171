"""``python -m gpugov.study.scoreboard``: the scoreboard as a script."""

from gpugov.cli import one_blas_thread

one_blas_thread()  # before numpy loads, as the gpugov command does

from gpugov.study.scoreboard.command import main  # noqa: E402

raise SystemExit(main())
