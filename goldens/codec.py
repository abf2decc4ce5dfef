"""Tensor <-> Zarr array mapping. zarr has no bf16/fp8/e8m0 dtypes: such tensors are stored as their
unsigned bit view plus a ``dtype`` attribute and restored zero-copy with ``.view()``.

Spec: §7.3 (replay trees hold every input and output tensor), §2.1 (cache dtypes).
"""

from __future__ import annotations

import numpy as np
import torch

from goldens.errors import GoldenStoreError

# torch dtype name -> (storage numpy dtype, torch view dtype used to reach it)
_BIT_VIEWS: dict[str, tuple[np.dtype, torch.dtype]] = {
    "bfloat16": (np.dtype("uint16"), torch.uint16),
    "float8_e4m3fn": (np.dtype("uint8"), torch.uint8),
    "float8_e5m2": (np.dtype("uint8"), torch.uint8),
    "float8_e8m0fnu": (np.dtype("uint8"), torch.uint8),
}
_NATIVE = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise GoldenStoreError(f"dtype attribute: expected a torch dtype name, got {name!r}")
    return dt


def to_numpy(tensor: torch.Tensor) -> tuple[np.ndarray, dict]:
    """(numpy array sharing the tensor's memory where possible, attrs with the logical dtype and shape)."""
    t = tensor.detach().cpu().contiguous()
    name = dtype_name(t.dtype)
    if name in _BIT_VIEWS:
        arr = t.view(_BIT_VIEWS[name][1]).numpy()
    elif name in _NATIVE:
        arr = t.numpy()
    else:
        raise GoldenStoreError(f"tensor dtype {name} cannot be stored (supported: "
                               f"{sorted(_NATIVE | set(_BIT_VIEWS))})")
    return arr, {"dtype": name, "shape": list(t.shape)}


def from_numpy(arr: np.ndarray, attrs: dict, *, name: str = "array") -> torch.Tensor:
    """Restore a tensor from its stored numpy array and attrs (zero-copy view for bit-stored dtypes)."""
    logical = attrs.get("dtype")
    if logical is None:
        raise GoldenStoreError(f"{name}: missing 'dtype' attribute")
    if list(arr.shape) != list(attrs.get("shape", arr.shape)):
        raise GoldenStoreError(f"{name}: stored shape {list(arr.shape)} != recorded shape {attrs.get('shape')}")
    t = torch.from_numpy(arr if arr.flags.c_contiguous else arr.copy())  # ascontiguousarray would make 0-d 1-d
    if logical in _BIT_VIEWS:
        want = _BIT_VIEWS[logical][0]
        if arr.dtype != want:
            raise GoldenStoreError(f"{name}: {logical} must be stored as {want}, found {arr.dtype}")
        return t.view(torch_dtype(logical))
    if dtype_name(t.dtype) != logical:
        raise GoldenStoreError(f"{name}: stored numpy dtype {arr.dtype} does not match dtype attribute {logical}")
    return t
