"""backends.upstream.entries: a kernel entry's declaration read from source (order, directions, dtypes, static
and dynamic dims) and the refusal of a call that does not fit it. Plain source text here; the real V4-Pro
entries are read in tests/test_pypto_backend.py (through the test double) and, with a checkout, by hand."""

from __future__ import annotations

import pytest
import torch

from backends.upstream.entries import EntryError, declared, mismatch

SOURCE = '''
@pl.jit
def entry(
    x: pl.Tensor[[T_DYN, D], pl.BF16],
    table: pl.Tensor[[B_DYN, D // 2], pl.INT32],
    n: pl.Scalar[pl.INT32],
    cache: pl.InOut[pl.Tensor[[4, D], pl.FP32]],
    y: pl.Out[pl.Tensor[[T_DYN, D], pl.FP32]],
):
    pass


def plain(a, b):
    pass


def odd(a: pl.Out[pl.Scalar[pl.INT32]]):
    pass
'''


class Dyn:
    """What pl.dynamic gives: not an int."""


NAMESPACE = {"D": 8, "T_DYN": Dyn(), "B_DYN": Dyn()}


def test_an_entry_declares_order_directions_dtypes_and_which_dims_are_compiled_in():
    params = declared(SOURCE, "entry", NAMESPACE, where="toy.py")
    assert [(p.name, p.direction, p.dtype, p.dims) for p in params] == [
        ("x", "in", "bfloat16", ("T_DYN", 8)), ("table", "in", "int32", ("B_DYN", 4)), ("n", "scalar", "int32", ()),
        ("cache", "inout", "float32", (4, 8)), ("y", "out", "float32", ("T_DYN", 8))]
    assert [p.is_output for p in params] == [False, False, False, True, True]


@pytest.mark.parametrize("entry, message", [("missing", "has no top-level kernel entry 'missing'"),
                                             ("plain", "parameter 'a' is not annotated"),
                                             ("odd", "pl.Out / pl.InOut of something not a pl.Tensor")])
def test_an_unreadable_entry_is_refused_by_name(entry, message):
    with pytest.raises(EntryError, match=message):
        declared(SOURCE, entry, NAMESPACE, where="toy.py")


def _call(**over):
    call = {"x": torch.zeros(3, 8, dtype=torch.bfloat16), "table": torch.zeros(2, 4, dtype=torch.int32), "n": 3,
            "cache": torch.zeros(4, 8), "y": torch.zeros(3, 8)}
    call.update(over)
    return call


def test_a_call_that_fits_the_declaration_is_accepted_with_any_dynamic_size():
    params = declared(SOURCE, "entry", NAMESPACE)
    assert mismatch(params, _call()) is None
    assert mismatch(params, _call(x=torch.zeros(7, 8, dtype=torch.bfloat16), y=torch.zeros(7, 8))) is None


@pytest.mark.parametrize("over, why", [
    ({"x": torch.zeros(3, 16, dtype=torch.bfloat16)}, "x dim 1: the kernel is compiled for 8 (its static geometry), "
                                                      "the call has 16"),
    ({"cache": torch.zeros(5, 8)}, "cache dim 0: the kernel is compiled for 4"),
    ({"x": torch.zeros(3, 8)}, "x: the entry takes bfloat16, the call has float32"),
    ({"table": torch.zeros(2, 4, 1, dtype=torch.int32)}, "table: the entry takes rank 2"),
    ({"y": torch.zeros(5, 8)}, "y dim 0: dynamic T_DYN is 3 elsewhere in the call, 5 here"),
    ({"extra": torch.zeros(1)}, "unexpected ['extra']"),
])
def test_a_call_that_does_not_fit_is_refused_naming_the_argument_and_dim(over, why):
    assert why in mismatch(declared(SOURCE, "entry", NAMESPACE), _call(**over))


def test_a_missing_argument_is_named():
    call = _call()
    del call["n"]
    assert "missing ['n']" in mismatch(declared(SOURCE, "entry", NAMESPACE), call)
