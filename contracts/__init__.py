"""Reusable contracts (checks, strategies, property tests) for the PyPTO DeepSeek-V4 kernel ABI."""
