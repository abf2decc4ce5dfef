"""Contracts get ``backend`` (and profiles/options) from the pto_contracts plugin (contracts.plugin)."""
