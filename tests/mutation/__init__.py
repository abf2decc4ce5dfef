"""Mutation testing of the contracts: operator-level mutants of the Torch reference (``engine``), run
through the backend registry against every contract that calls the mutated operator (``run``)."""
