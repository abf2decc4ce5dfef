"""Contracts get ``backend`` (and profiles/options) from the project plugin (contracts.plugin, loaded by the root conftest.py)."""
