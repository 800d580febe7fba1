"""Kernels: one sub-package per backend (``triton``, ``cpu``), each exposing the launchers of
:mod:`rmsnorm.reference` with the same signatures. ``import rmsnorm`` imports the
``cpu`` package, which loads numba only on the first call; ``triton`` is imported on first use."""
