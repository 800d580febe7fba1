"""Kernels: one sub-package per backend (``triton``, ``cpu``), each defining the five launchers of
the backend contract (:class:`rmsnorm._contract.Backend`). ``import rmsnorm`` imports the
``cpu`` package, which loads numba only on the first call; ``triton`` is imported on first use."""
