"""Loads the project's pytest plugin (pto_pytest.plugin) for sessions rooted here.

The plugin is deliberately not a ``pytest11`` entry point: installed into an environment it would add
``--platform`` / ``--device`` / ``--backend`` to every pytest session there, and upstream's own suites (pypto's
runtime, pypto's system tests) declare options of those names and then cannot start. Elsewhere, load it by name:
``pytest -p pto_pytest.plugin``.
"""

import os
import sys

# Machines here set PYTHONDONTWRITEBYTECODE=1. Then pytest cannot cache what its assertion rewriter makes of
# hypothesis' ~160 modules (an entry-point plugin's whole distribution is rewritten) or of the test modules, nor
# Python the project's own bytecode: every pytest process, xdist worker and CLI subprocess a test starts paid
# ~4 CPU s of rewriting and compiling before its first test (7.4 s -> 3.6 s for `pytest --co` of one file).
# The caches go to __pycache__ directories, which git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

pytest_plugins = ("pto_pytest.plugin",)

# Tests that take tens of seconds each (subprocess pytest sessions, upstream workers, S3 and disk faults), measured
# with ``pytest --durations=40`` on 2 cores. They are collected first so that pytest-xdist's workers do not end the
# run with one worker idle while the other finishes one of them (node-id prefixes; order inside kept).
LONG_FIRST = (
    "tests/test_pypto_backend.py::test_goldens_replay_through_upstream_keeps_actual_outputs",
    "tests/test_store_concurrency.py::test_record_regen_and_import_interleave_without_losing_a_commit",
    "tests/test_pypto_backend.py::test_pytest_runs_the_contracts_on_the_test_double",
    "tests/test_store_faults.py::test_a_full_disk_and_a_read_only_store",
    "tests/test_goldens.py::test_every_case_records_and_replays_in_every_wiring",
    "tests/test_pypto_backend.py::test_an_invalid_topology_is_a_usage_error",
    "tests/test_staleness.py::test_a_reference_bug_is_not_advised_as_a_regen",
    "tests/test_report.py::test_pytest_writes_one_page_from_every_xdist_worker",
    "tests/test_pypto_backend.py::test_pytest_on_an_unavailable_backend",
    "tests/test_goldens.py::test_the_kept_a5sim_outputs_are_judged_again",
    "tests/test_coverage_doc.py::test_cited_tests_are_collected_and_exercise_the_subject",
    "tests/test_user_cases.py::test_a_failing_property_leaves_a_counterexample_tree",
    "tests/test_user_cases.py::test_a_user_case_records_and_replays_and_catches_a_defect",
    "tests/test_store_reliability.py::test_four_concurrent_recorders_lose_no_commit",
    "tests/test_pypto_backend.py::test_the_seeded_hc_post_kernel_is_caught",
    "tests/test_pypto_backend.py::test_the_seeded_indexer_kernel_is_caught",
    "tests/test_goldens.py::test_last_failed_works_because_the_cache_provider_is_on",
    "tests/test_pypto_backend.py::test_a_launch_that_never_finishes",
    "tests/test_documented_commands.py::test_the_example_files_commands_run_as_written",
)


def pytest_collection_modifyitems(config, items):
    rank = {prefix: i for i, prefix in enumerate(LONG_FIRST)}

    def key(item):
        return next((r for prefix, r in rank.items() if item.nodeid.startswith(prefix)), len(rank))

    items.sort(key=key)  # stable: every other test keeps its place
