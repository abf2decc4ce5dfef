"""Deliberately wrong implementations, each a Backend derived from the torch reference with one
operator replaced. ``tests/test_seeded_defects.py`` asserts every contract family catches one.
Load any of them with ``pytest contracts/ --backend-module tests.defects.<module>:<NAME>``.
"""
