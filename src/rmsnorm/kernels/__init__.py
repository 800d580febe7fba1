"""Kernels: one sub-package per backend (``triton``, ``cpu``), each exposing the launchers of
:mod:`rmsnorm.reference` with the same signatures. Nothing here is imported by
``import rmsnorm``."""
