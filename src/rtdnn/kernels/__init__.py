"""Triton kernels and their launch helpers. No validation and no policy live here."""
