"""TEST DOUBLE of upstream ``golden/validation.py``'s ``validate_golden``: every output judged by its
``compare_fn`` entry (called as ``cmp(actual, expected, *, actual_outputs, expected_outputs, inputs, rtol,
atol) -> (ok, detail)``) or else ``torch.allclose``; any failure raises AssertionError naming the outputs."""

from __future__ import annotations

from collections.abc import Callable

import torch


def validate_golden(outputs: dict[str, torch.Tensor], golden: dict[str, torch.Tensor], rtol: float = 1e-5,
                    atol: float = 1e-5, compare_fn: dict[str, Callable] | None = None,
                    inputs: dict[str, torch.Tensor] | None = None) -> None:
    compare_fn = compare_fn or {}
    inputs = inputs or {}
    failures: dict[str, str] = {}
    for name, actual_tensor in outputs.items():
        actual, expected = actual_tensor.cpu(), golden[name].cpu()
        if name in compare_fn:
            ok, detail = compare_fn[name](actual, expected, actual_outputs=outputs, expected_outputs=golden,
                                          inputs=inputs, rtol=rtol, atol=atol)
            if not ok:
                failures[name] = f"  '{name}' FAIL\n{detail}"
            continue
        if not torch.allclose(actual, expected, rtol=rtol, atol=atol):
            failures[name] = f"  '{name}' FAIL  rtol={rtol} atol={atol}"
    if failures:
        raise AssertionError(f"Output(s) does not match golden: {list(failures)}\n" + "\n".join(failures.values()))
