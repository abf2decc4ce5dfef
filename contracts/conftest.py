"""Contracts get ``backend`` (and profiles/options) from the project plugin (pto_pytest.plugin, loaded by the root conftest.py)."""
