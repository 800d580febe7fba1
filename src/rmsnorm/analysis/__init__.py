"""The lab: statistics of rows (μ, σ, RMS), the simulated transformer, capture hooks and plots. Pure
functions over tensors; the CLI and the report call them."""
