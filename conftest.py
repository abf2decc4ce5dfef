"""Loads the project's pytest plugin (contracts.plugin) for sessions rooted here.

The plugin is deliberately not a ``pytest11`` entry point: installed into an environment it would add
``--platform`` / ``--device`` / ``--backend`` to every pytest session there, and upstream's own suites (pypto's
runtime, pypto's system tests) declare options of those names and then cannot start. Elsewhere, load it by name:
``pytest -p contracts.plugin``.
"""

pytest_plugins = ("contracts.plugin",)
