"""Quantized cache ABI: layout descriptors, publish (quantize mapped rows only) and read (dequantize
the whole cache), plus the capacity calculator (``python -m kernels.cache capacity``).

Spec: §2.1 (shapes, dtypes, owners), §2.3 (publish/read), §1 (schedule owners).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import numpy as np
import torch

from kernels import quant
from kernels.config import FLASH, PRESETS, V41Config
from kernels.errors import ContractInputError
from kernels.operators import operator

SPEC = "§2.1"
# Bump when the arithmetic or a rounding rule changes on purpose: goldens recorded before go stale.
ROUNDING_VERSION = "cache-abi-1"


@dataclass(frozen=True)
class CacheLayout:
    """One cache kind: ``payload`` [blocks, rows, 1, payload_width], ``scale`` [blocks, rows, 1, groups]."""

    kind: str
    logical_width: int
    payload_dtype: torch.dtype
    payload_width: int
    scale_dtype: torch.dtype | None
    group: int
    rule: str | None  # quant rule name (None: FP32 state, no quantization)
    rows_per_block: int
    owners: tuple[int, ...]  # layers that publish into it
    tokens_per_row: int = 1  # compressed ratio: one row covers `ratio` tokens

    @property
    def n_groups(self) -> int:
        return self.logical_width // self.group if self.group else 0

    def payload_shape(self, blocks: int) -> tuple[int, ...]:
        if self.kind == "state_r2":
            return (blocks, self.rows_per_block, self.payload_width)
        return (blocks, self.rows_per_block, 1, self.payload_width)

    def scale_shape(self, blocks: int) -> tuple[int, ...] | None:
        return None if self.scale_dtype is None else (blocks, self.rows_per_block, 1, self.n_groups)

    def row_bytes(self) -> int:
        payload = self.payload_width * torch.empty(0, dtype=self.payload_dtype).element_size()
        scale = self.n_groups * 1 if self.scale_dtype is not None else 0
        return payload + scale


def layouts(config: V41Config = FLASH) -> dict[str, CacheLayout]:
    """Every cache kind of ``config``, owners taken from the schedule. Spec: §2.1."""
    c = config
    d, di = c.head_dim, c.index_head_dim
    r2 = c.sources_of_ratio(2)
    r1 = c.sources_of_ratio(1)
    e4m3, e8m0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
    return {
        "window": CacheLayout("window", d, e4m3, d, e8m0, c.window_cache_group, "window", c.block_size,
                              tuple(range(c.num_hidden_layers))),
        "compressed_r2": CacheLayout("compressed_r2", d, torch.uint8, d // 2, e4m3, c.compressed_cache_group,
                                     "compressed", c.block_size, r2, tokens_per_row=2),
        "compressed_r1": CacheLayout("compressed_r1", d, torch.uint8, d // 2, e4m3, c.compressed_cache_group,
                                     "compressed", c.block_size, r1),
        "index": CacheLayout("index", di, torch.uint8, di // 2, e8m0, c.index_cache_group, "index", c.block_size,
                             tuple(c.kv_source_layer_ids)),
        "state_r2": CacheLayout("state_r2", 2 * d, torch.float32, 2 * d, None, 0, None, c.state_capacity, r2),
    }


@dataclass(frozen=True)
class QuantCache:
    """Cache storage for one layer: ``payload`` and ``scale`` tensors in the layout's dtypes."""

    layout: CacheLayout
    payload: torch.Tensor
    scale: torch.Tensor | None

    @property
    def rows(self) -> int:
        return self.payload.shape[0] * self.payload.shape[1]

    def clone(self) -> QuantCache:
        return QuantCache(self.layout, self.payload.clone(), None if self.scale is None else self.scale.clone())

    def numpy_bits(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Zero-copy numpy views of the raw bits (uint8 payload/scale; float32 state)."""
        p = self.payload if self.payload.dtype in (torch.uint8, torch.float32) else self.payload.view(torch.uint8)
        s = None if self.scale is None else self.scale.view(torch.uint8).numpy()
        return p.numpy(), s


def empty_cache(layout: CacheLayout, blocks: int, *, fill_byte: int = 0, generator: torch.Generator | None = None
                ) -> QuantCache:
    """A cache of ``blocks`` blocks; bytes are ``fill_byte`` or random sentinel bytes (``generator``)."""

    def make(shape, dtype):
        if generator is not None and dtype == torch.float32:  # keep FP32 sentinels finite
            return torch.rand(shape, generator=generator) * 8 - 4
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if generator is not None:
            raw = torch.randint(0, 256, (nbytes,), generator=generator, dtype=torch.uint8)
        else:
            raw = torch.full((nbytes,), fill_byte, dtype=torch.uint8)
        return raw.view(dtype).reshape(shape)

    scale_shape = layout.scale_shape(blocks)
    return QuantCache(layout, make(layout.payload_shape(blocks), layout.payload_dtype),
                      None if scale_shape is None else make(scale_shape, layout.scale_dtype))


def _check_slots(cache: QuantCache, values: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    name = cache.layout.kind
    if values.ndim != 2 or values.shape[1] != cache.layout.logical_width:
        raise ContractInputError(f"{name}.values", None, f"[N, {cache.layout.logical_width}]",
                                 f"shape {tuple(values.shape)}", SPEC)
    slots = torch.as_tensor(slots).to(torch.int64).reshape(-1)
    if slots.numel() != values.shape[0]:
        raise ContractInputError(f"{name}.slots", None, f"{values.shape[0]} entries (one per value row)",
                                 slots.numel(), SPEC)
    bad = slots >= cache.rows
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ContractInputError(f"{name}.slots", (i,), f"< {cache.rows} physical rows", int(slots[i]), SPEC)
    seen: dict[int, int] = {}
    for i, s in enumerate(slots.tolist()):
        if s >= 0 and seen.setdefault(s, i) != i:
            raise ContractInputError(f"{name}.slots", (i,), f"distinct live slots (one writer per row; slot {s} "
                                     f"is already written by row {seen[s]})", s, SPEC)
    return slots


@operator(returns='new QuantCache; only rows with slot >= 0 change', spec='§2.3')
def cache_publish(cache: QuantCache, values: torch.Tensor, slots: torch.Tensor) -> QuantCache:
    """Quantize the rows with ``slots >= 0`` and write their bytes at flattened row ``slot``; every other
    byte stays unchanged. Returns a new cache. ``values`` [N, logical]. Spec: §2.3."""
    slots = _check_slots(cache, values, slots)
    out = cache.clone()
    live = slots >= 0
    if not bool(live.any()):
        return out
    rows = slots[live]
    if cache.layout.rule is None:
        flat = out.payload.reshape(cache.rows, -1)
        flat[rows] = values[live].to(torch.float32)
        return out
    q = quant.mx_quantize(values[live], cache.layout.rule)
    out.payload.view(torch.uint8).reshape(cache.rows, -1)[rows] = q.payload.view(torch.uint8)
    out.scale.view(torch.uint8).reshape(cache.rows, -1)[rows] = q.scale.view(torch.uint8)
    return out


@operator(returns='[blocks, rows, 1, logical]', spec='§2.3')
def cache_read(cache: QuantCache, *, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dequantize the whole cache -> [blocks, rows, 1, logical] in ``dtype`` (state: FP32 as stored). Spec: §2.3."""
    if cache.layout.rule is None:
        return cache.payload.clone()
    q = quant.MXTensor(cache.payload, cache.scale, cache.layout.rule)
    return quant.mx_dequantize(q, dtype=torch.float32).to(dtype)


# ---------------------------------------------------------------------------
# capacity calculator


@dataclass(frozen=True)
class CapacityLine:
    cache: str
    layers: int
    rows: int
    lowbit_bytes: int
    bf16_bytes: int
    formula: str


def capacity(config: V41Config, context: int) -> list[CapacityLine]:
    """Per-request bytes of each cache kind at ``context`` positions (rows rounded up to whole blocks).

    The window keeps only the pages a 128-token window can touch (2 blocks); compressed rows are
    context//ratio; the ratio-2 state is one FP32 ring block per ratio-2 source. Spec: §2.1, §1.
    """
    lay = layouts(config)
    bs = config.block_size

    def blocks(rows: int) -> int:
        return -(-rows // bs)

    window_rows = blocks(config.sliding_window + bs - 1) * bs
    out = []
    w = lay["window"]
    out.append(CapacityLine("window", len(w.owners), window_rows, len(w.owners) * window_rows * w.row_bytes(),
                            len(w.owners) * window_rows * w.logical_width * 2,
                            f"{len(w.owners)} layers x {window_rows} rows x ({w.payload_width} + {w.n_groups}) B"))
    for kind, ratio in (("compressed_r2", 2), ("compressed_r1", 1)):
        lk = lay[kind]
        rows = blocks(context // ratio) * bs
        n = len(lk.owners)
        out.append(CapacityLine(kind, n, rows, n * rows * lk.row_bytes(), n * rows * lk.logical_width * 2,
                                f"{n} layers x ceil({context}/{ratio}/{bs})*{bs} rows x "
                                f"({lk.payload_width} + {lk.n_groups}) B"))
    ix = lay["index"]
    for ratio in (2, 1):
        n = len(config.sources_of_ratio(ratio))
        rows = blocks(context // ratio) * bs
        out.append(CapacityLine(f"index_r{ratio}", n, rows, n * rows * ix.row_bytes(), n * rows * ix.logical_width * 2,
                                f"{n} layers x {rows} rows x ({ix.payload_width} + {ix.n_groups}) B"))
    st = lay["state_r2"]
    n = len(st.owners)
    sb = n * config.state_capacity * st.payload_width * 4
    out.append(CapacityLine("state_r2", n, config.state_capacity, sb, sb,
                            f"{n} layers x {config.state_capacity} slots x {st.payload_width} x 4 B (FP32 both ways)"))
    return out


def _main_capacity(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    config = PRESETS[args.preset]
    if not isinstance(config, V41Config):
        print(f"capacity: preset {args.preset!r} is not a V4.1 preset", file=sys.stderr)
        return 2
    if args.tp not in (1, 2, 4, 8) or args.dp < 1:
        print("capacity: --tp must be 1, 2, 4 or 8 and --dp >= 1", file=sys.stderr)
        return 2
    lines = capacity(config, args.context)
    low = sum(x.lowbit_bytes for x in lines)
    bf16 = sum(x.bf16_bytes for x in lines)
    per_card_requests = -(-args.requests // args.dp)
    table = Table(title=f"{config.name}: per-request cache at {args.context:,} positions")
    for col in ("cache", "layers", "rows", "low-bit bytes", "BF16 bytes", "formula (low-bit)"):
        table.add_column(col)
    for x in lines:
        table.add_row(x.cache, str(x.layers), f"{x.rows:,}", f"{x.lowbit_bytes:,}", f"{x.bf16_bytes:,}", x.formula)
    con = Console(width=160)
    con.print(table)
    gb = 1e9
    con.print(f"per request per card: low-bit {low / gb:.3f} GB, BF16 {bf16 / gb:.3f} GB (ratio {bf16 / low:.2f}x)")
    con.print(f"layout TP{args.tp} x DP{args.dp}: caches are replicated across the TP ranks of a DP group, so each "
              f"card holds ceil({args.requests}/{args.dp}) = {per_card_requests} requests")
    con.print(f"per card for {args.requests} requests: low-bit {per_card_requests * low / gb:.2f} GB, "
              f"BF16 {per_card_requests * bf16 / gb:.2f} GB")
    con.print("formula: bytes = sum over caches of layers x rows x (payload + scale bytes per row); rows = "
              "ceil(positions/ratio/128)*128 (window: 2 blocks); BF16 = layers x rows x logical width x 2; "
              "GB = 1e9 bytes")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.cache", description="Quantized cache ABI tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capacity", help="bytes per request per card of the low-bit and a BF16 cache",
                         description="Bytes per request per card of the low-bit cache and of a BF16 cache, "
                                     "derived from the cache layouts (spec §2.1).")
    cap.add_argument("--preset", default="flash", choices=[k for k, v in PRESETS.items() if isinstance(v, V41Config)])
    cap.add_argument("--context", type=int, default=1_048_576, help="positions per request (default 1,048,576)")
    cap.add_argument("--requests", type=int, default=32, help="requests per DP group (default 32)")
    cap.add_argument("--tp", type=int, default=4, help="attention TP size (caches replicated across it)")
    cap.add_argument("--dp", type=int, default=1, help="DP groups the requests are spread over (default 1)")
    args = parser.parse_args(argv)
    if args.context < 0:
        parser.error("--context must be >= 0")
    return _main_capacity(args)


if __name__ == "__main__":
    sys.exit(main())
