"""Operator at scale: ``python -m bench.operator_scale`` (see __main__.py and run.py)."""
