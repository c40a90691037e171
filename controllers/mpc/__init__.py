"""Model-predictive clock control: the seed's MPC and its model (``controller``,
``model``), the SLSQP reference solver (``solvers``) and the fast discrete-search solver
(``fast``) with its compiled kernel (``search_kernel``)."""
