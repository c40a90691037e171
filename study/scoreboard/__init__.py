"""The controller scoreboard (``gpugov bench controllers``): scenarios (``scenarios``), the
scored controllers (``controllers``), the run and scoring (``run``), the solver comparison
(``solvers``), outputs (``report``) and the command line (``cli``).
``python -m gpugov.study.scoreboard.run`` runs it as a script."""
