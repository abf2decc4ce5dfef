"""Torch references (goldens) of the V4.1 operators."""
