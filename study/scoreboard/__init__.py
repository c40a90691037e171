"""The controller scoreboard (``gpugov bench controllers``): scenarios (``scenarios``), the
scored controllers (``controllers``), the run and scoring (``run``), the solver comparison
(``solvers``), outputs (``report``), the command line (``command``) and its registration
under ``gpugov bench`` (``cli``). ``python -m gpugov.study.scoreboard`` runs it as a
script."""
