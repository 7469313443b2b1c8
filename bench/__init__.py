"""Benchmarks: every claim measured against numpy's BLAS and torch in the same run (``python -m bench``)."""
