"""Benchmarks beside PyTorch/cuDNN, and the self-check used on machines without a GPU."""
