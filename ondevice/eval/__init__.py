"""Measuring ondevice: the bench runner (bench.py), prompt sets (prompts.py) and batch-noise
numerics that the exactness tests use (numerics.py)."""
