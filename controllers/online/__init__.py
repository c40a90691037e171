"""The self-calibrating MPC (``mpc-online``): the controller (``controller``), the model it
identifies online (``identification``), its safe exploration (``exploration``) and the
rough prior from hints or a profile (``prior``)."""
