"""Benchmarks of the shardfeed client against the loaders PyTorch users run.

Kept out of the ``shardfeed`` package: they need boto3 and Pillow, which a
trainer using shardfeed does not.
"""
