"""ForwardMetadata lowering: engine batch description -> every per-token/per-request field the kernels read.

Spec: §3 (G2 ``build_forward_metadata``), §1 (schedule: sources and ratios).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch

from kernels.config import FLASH, V41Config
from kernels.errors import ContractInputError, first_true
from kernels.operators import operator

SPEC = "§3"
# Bump when the arithmetic or a rounding rule changes on purpose: goldens recorded before go stale.
ROUNDING_VERSION = "metadata-g2-1"

PER_TOKEN_FIELDS = ("token_to_req_indices", "moe_token_owners", "position_ids", "window_slots",
                    "window_indices", "window_lens")
PER_TOKEN_SOURCE_FIELDS = ("compressed_slots", "index_slots", "compressed_lens", "compressed_rope_position_ids")
PER_REQUEST_FIELDS = ("query_lens", "logit_row_indices", "kv_seq_lens", "new_kv_seq_lens")
PER_REQUEST_SOURCE_FIELDS = ("compressed_seq_lens", "compressed_seq_remainders")
SOURCE_FIELDS = ("compressed_slots", "index_slots", "state_block_tables", "compressed_seq_lens",
                 "compressed_seq_remainders", "compressed_lens", "compressor_output_start_loc",
                 "compressor_source_token_indices", "compressor_position_ids", "compressed_rope_position_ids")

# Value a padding row (t >= num_tokens) carries in each per-token field.
PADDING_VALUES = {"token_to_req_indices": -1, "position_ids": -1, "window_slots": -1, "window_indices": -1,
                  "window_lens": 0, "compressed_slots": -1, "index_slots": -1, "compressed_lens": 0,
                  "compressed_rope_position_ids": -1}


@dataclass(frozen=True)
class ForwardMetadata:
    """Everything a V4.1 forward reads besides weights and caches.

    Per-token fields have ``T = capacity`` rows (``num_tokens`` active rows then padding);
    per-source fields are dicts keyed by KV source layer id. Spec: §3 table.
    """

    num_tokens: int
    query_start_loc: torch.Tensor  # [B+1] I32
    query_lens: torch.Tensor  # [B] I32
    logit_row_indices: torch.Tensor  # [B] I32
    token_to_req_indices: torch.Tensor  # [T] I32
    moe_token_owners: torch.Tensor  # [T] I32
    position_ids: torch.Tensor  # [T] I32
    kv_seq_lens: torch.Tensor  # [B] I32
    new_kv_seq_lens: torch.Tensor  # [B] I32
    window_slots: torch.Tensor  # [T] I64
    window_indices: torch.Tensor  # [T, window] I32
    window_lens: torch.Tensor  # [T] I32
    compressed_slots: dict[int, torch.Tensor]  # [T] I64
    index_slots: dict[int, torch.Tensor]  # [T] I64
    state_block_tables: dict[int, torch.Tensor]  # [B, 1] I32 (ratio-2 sources)
    compressed_seq_lens: dict[int, torch.Tensor]  # [B] I32
    compressed_seq_remainders: dict[int, torch.Tensor]  # [B] I32
    compressed_lens: dict[int, torch.Tensor]  # [T] I32
    compressor_output_start_loc: dict[int, torch.Tensor]  # [B+1] I32
    compressor_source_token_indices: dict[int, torch.Tensor]  # [n_out] I32
    compressor_position_ids: dict[int, torch.Tensor]  # [n_out] I32
    compressed_rope_position_ids: dict[int, torch.Tensor]  # [T] I32

    @property
    def capacity(self) -> int:
        return int(self.position_ids.numel())

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# ---------------------------------------------------------------------------
# input parsing


def _parse_int_vector(name: str, value: object) -> torch.Tensor:
    tensor = torch.as_tensor(value) if not isinstance(value, torch.Tensor) else value
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise ContractInputError(name, None, "an integer tensor", tensor.dtype, SPEC)
    if tensor.ndim != 1:
        raise ContractInputError(name, None, "a 1-D tensor", f"shape {tuple(tensor.shape)}", SPEC)
    return tensor.to(torch.int64).cpu()


def _parse_table(name: str, value: object, rows: int) -> torch.Tensor:
    tensor = torch.as_tensor(value) if not isinstance(value, torch.Tensor) else value
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise ContractInputError(name, None, "an integer tensor", tensor.dtype, SPEC)
    if tensor.ndim != 2 or tensor.shape[0] != rows:
        raise ContractInputError(name, None, f"shape [{rows}, pages] (one row per request)",
                                 f"shape {tuple(tensor.shape)}", SPEC)
    return tensor.to(torch.int64).cpu()


# ---------------------------------------------------------------------------
# slot arithmetic


def paged_slots(
    positions: torch.Tensor,
    request_ids: torch.Tensor,
    block_table: torch.Tensor,
    *,
    block_size: int,
    divisor: int = 1,
    only_complete: bool = False,
    field: str = "block_table",
) -> torch.Tensor:
    """Physical flattened rows ``table[req, (p//div)//bs]*bs + (p//div)%bs``; -1 where not published.

    With ``only_complete`` only positions with ``(p+1) % divisor == 0`` publish. Raises on a
    request outside the table, a logical page past the table, or a page < 0.
    Spec: §2.1 (physical row), §3 (paged_slots, G2).
    """
    if block_size <= 0 or divisor <= 0:
        raise ContractInputError("block_size/divisor", None, "> 0", (block_size, divisor), SPEC)
    for name, vector in (("positions", positions), ("request_ids", request_ids)):
        if vector.ndim != 1 or vector.dtype.is_floating_point or vector.dtype == torch.bool:
            raise ContractInputError(name, None, "a 1-D integer tensor", f"{vector.dtype}{list(vector.shape)}", SPEC)
    if request_ids.shape != positions.shape:
        raise ContractInputError("request_ids", None, f"one per position ({positions.shape[0]})",
                                 request_ids.shape[0], SPEC)
    if block_table.ndim != 2 or block_table.dtype.is_floating_point or block_table.dtype == torch.bool:
        raise ContractInputError(field, None, "a 2-D integer table", f"{block_table.dtype}{list(block_table.shape)}",
                                 SPEC)
    positions = positions.to(torch.int64)
    request_ids = request_ids.to(torch.int64)
    slots = torch.full_like(positions, -1)
    publish = positions >= 0
    if only_complete:
        publish &= (positions + 1) % divisor == 0
    if not bool(publish.any()):
        return slots
    logical = torch.div(positions[publish], divisor, rounding_mode="floor")
    page = torch.div(logical, block_size, rounding_mode="floor")
    req = request_ids[publish]
    where = publish.nonzero().flatten()
    bad = (req < 0) | (req >= block_table.shape[0])
    if bool(bad.any()):
        i = first_true(bad)
        raise ContractInputError(field, (int(req[i]),), f"a request row in [0, {block_table.shape[0]})",
                                 f"request {int(req[i])} for token {int(where[i])}", SPEC)
    bad = page >= block_table.shape[1]
    if bool(bad.any()):
        i = first_true(bad)
        raise ContractInputError(field, (int(req[i]), int(page[i])),
                                 f"a logical page < {block_table.shape[1]} (table width)",
                                 f"page {int(page[i])} for position {int(positions[where[i]])} "
                                 f"(token {int(where[i])})", SPEC)
    physical = block_table[req, page]
    bad = physical < 0
    if bool(bad.any()):
        i = first_true(bad)
        raise ContractInputError(field, (int(req[i]), int(page[i])), "a physical page >= 0 (allocated)",
                                 f"{int(physical[i])} for position {int(positions[where[i]])} "
                                 f"of request {int(req[i])} (token {int(where[i])}): no physical allocation",
                                 SPEC)
    slots[publish] = physical * block_size + logical % block_size
    return slots


def window_metadata(positions: torch.Tensor, request_ids: torch.Tensor, block_table: torch.Tensor, *,
                    window: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Window write slots [T] I64, visible rows [T, window] I32 (oldest first, -1 after), lens [T] I32.

    Spec: §3 (window_slots, window_indices, window_lens).
    """
    slots = paged_slots(positions, request_ids, block_table, block_size=block_size, field="window_block_table")
    lens = torch.minimum(positions + 1, torch.full_like(positions, window)).clamp_min(0)
    offsets = torch.arange(window)
    visible = (positions - lens + 1).unsqueeze(-1) + offsets
    valid = offsets.unsqueeze(0) < lens.unsqueeze(-1)
    indices = torch.full(visible.shape, -1, dtype=torch.int64)
    if bool(valid.any()):
        reqs = request_ids.unsqueeze(-1).expand_as(visible)
        indices[valid] = paged_slots(visible[valid], reqs[valid], block_table, block_size=block_size,
                                     field="window_block_table")
    return slots, indices.to(torch.int32), lens.to(torch.int32)


def compressor_metadata(query_start_loc: torch.Tensor, kv_seq_lens: torch.Tensor, ratio: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ragged compressor outputs: starts [B+1], source token rows [n_out], group-first positions [n_out].

    Group g of request r completes at position (g+1)*ratio-1, i.e. packed row
    ``qsl[r] + (g+1)*ratio - 1 - kv[r]``. Spec: §3 (compressor_* fields).
    """
    qsl = query_start_loc.to(torch.int64)
    kv = kv_seq_lens.to(torch.int64)
    old = torch.div(kv, ratio, rounding_mode="floor")
    new = torch.div(kv + (qsl[1:] - qsl[:-1]), ratio, rounding_mode="floor")
    counts = new - old
    starts = torch.cat((torch.zeros(1, dtype=torch.int64), counts.cumsum(0)))
    req = torch.repeat_interleave(torch.arange(kv.numel()), counts)
    group = old[req] + (torch.arange(int(starts[-1])) - starts[:-1][req])
    source_rows = qsl[:-1][req] + (group + 1) * ratio - 1 - kv[req]
    return starts.to(torch.int32), source_rows.to(torch.int32), (group * ratio).to(torch.int32)


# ---------------------------------------------------------------------------
# the builder


def _check_batch(qsl: torch.Tensor, kv: torch.Tensor, *, config: V41Config, tp_size: int, capacity: int | None):
    """The batch's own checks -> (query_lens, num_tokens, capacity, new_kv_seq_lens)."""
    if qsl.numel() != kv.numel() + 1:
        raise ContractInputError("query_start_loc", None, f"{kv.numel() + 1} entries (len(kv_seq_lens)+1)",
                                 qsl.numel(), SPEC)
    if int(qsl[0]) != 0:
        raise ContractInputError("query_start_loc", (0,), "0", int(qsl[0]), SPEC)
    query_lens = qsl[1:] - qsl[:-1]
    if bool((query_lens < 0).any()):
        r = first_true(query_lens < 0)
        raise ContractInputError("query_start_loc", (r + 1,), f"nondecreasing, >= {int(qsl[r])}",
                                 int(qsl[r + 1]), SPEC)
    if bool((kv < 0).any()):
        r = first_true(kv < 0)
        raise ContractInputError("kv_seq_lens", (r,), ">= 0", int(kv[r]), SPEC)
    if isinstance(tp_size, bool) or tp_size not in (1, 2, 4, 8):
        raise ContractInputError("tp_size", None, "one of (1, 2, 4, 8)", tp_size, "§1")
    batch = kv.numel()
    num_tokens = int(qsl[-1])
    cap = num_tokens if capacity is None else int(capacity)
    if cap < num_tokens:
        raise ContractInputError("capacity", None, f">= num_tokens={num_tokens}", cap, SPEC)
    new_kv = kv + query_lens
    if batch and int(new_kv.max()) > config.max_position_embeddings:
        r = int(new_kv.argmax())
        raise ContractInputError("kv_seq_lens", (r,), f"kv + query_len <= max_position "
                                 f"{config.max_position_embeddings}", int(new_kv[r]), SPEC)
    return query_lens, num_tokens, cap, new_kv


def _compressed_tables(compressed_block_tables: Mapping[int, object], batch: int, config: V41Config):
    """One compressed table per KV source, checked, equal across the sources of a ratio."""
    tables: dict[int, torch.Tensor] = {}
    by_ratio: dict[int, tuple[int, torch.Tensor]] = {}
    for src in config.kv_source_layer_ids:
        if src not in compressed_block_tables:
            raise ContractInputError(f"compressed_block_tables[{src}]", None,
                                     f"a table for every KV source {config.kv_source_layer_ids}", "missing", SPEC)
        table = _parse_table(f"compressed_block_tables[{src}]", compressed_block_tables[src], batch)
        ratio = config.compress_ratios[src]
        first_src, first = by_ratio.setdefault(ratio, (src, table))
        if not torch.equal(first, table):
            raise ContractInputError(f"compressed_block_tables[{src}]", None,
                                     f"the same table as source {first_src} (ratio {ratio} sources share one)",
                                     "a different table", SPEC)
        tables[src] = table
    return tables


def _state_tables(state_block_tables: Mapping[int, object], batch: int, config: V41Config) -> dict[int, torch.Tensor]:
    """The state block table of every ratio>1 source: INT32 [B, 1], -1 for an inactive request, no block shared
    by two live requests."""
    states: dict[int, torch.Tensor] = {}
    for src in config.kv_source_layer_ids:
        if config.compress_ratios[src] <= 1:
            continue
        if src not in state_block_tables:
            raise ContractInputError(f"state_block_tables[{src}]", None,
                                     "a state block table for every ratio-2 source", "missing", SPEC)
        raw = state_block_tables[src]
        st = raw if isinstance(raw, torch.Tensor) else torch.as_tensor(raw)
        if st.dtype != torch.int32 or tuple(st.shape) != (batch, 1):
            raise ContractInputError(f"state_block_tables[{src}]", None, f"INT32 [{batch}, 1]",
                                     f"{st.dtype} {list(st.shape)}", SPEC)
        if bool((st < -1).any()):
            r = first_true(st[:, 0] < -1)
            raise ContractInputError(f"state_block_tables[{src}]", (r, 0), ">= -1 (-1 marks an inactive request)",
                                     int(st[r, 0]), SPEC)
        live = st[:, 0]
        seen: dict[int, int] = {}
        for r, block in enumerate(live.tolist()):
            if block < 0:
                continue
            if block in seen:
                raise ContractInputError(f"state_block_tables[{src}]", (r, 0),
                                         f"a block distinct from every other live request's "
                                         f"(request {seen[block]} owns {block})", block, SPEC)
            seen[block] = r
        states[src] = st.cpu()
    return states


def _source_fields(out: dict, src: int, table: torch.Tensor, state: torch.Tensor | None, qsl, kv, new_kv, query_lens,
                   positions, request_ids, config: V41Config) -> None:
    """Every per-source field of KV source ``src`` into ``out``: its visible pages checked, slots (-1 for a request
    whose state is inactive), lengths and remainders, the compressor's rows and the compressed RoPE positions."""
    batch = kv.numel()
    ratio = config.compress_ratios[src]
    visible_pages = -(-torch.div(new_kv, ratio, rounding_mode="floor") // config.block_size)
    for r in range(batch):
        if int(query_lens[r]) == 0:
            continue
        need = int(visible_pages[r])
        row = table[r, :need]
        if need > table.shape[1] or bool((row < 0).any()):
            page = need - 1 if need > table.shape[1] else first_true(row < 0)
            value = "beyond the table width" if need > table.shape[1] else int(row[page])
            raise ContractInputError(
                f"compressed_block_tables[{src}]", (r, page),
                f"allocated pages 0..{need - 1} (missing visible compressed pages: "
                f"{int(new_kv[r])}//{ratio} rows visible)", value, SPEC)
    field = f"compressed_block_tables[{src}]"
    slots = paged_slots(positions, request_ids, table, block_size=config.block_size, divisor=ratio,
                        only_complete=True, field=field)
    if state is not None:
        inactive = state[request_ids, 0] < 0
        slots = slots.masked_fill(inactive, -1)
    out["compressed_slots"][src] = slots
    out["index_slots"][src] = slots.clone()
    out["compressed_seq_lens"][src] = torch.div(new_kv, ratio, rounding_mode="floor").to(torch.int32)
    out["compressed_seq_remainders"][src] = (new_kv % ratio).to(torch.int32)
    out["compressed_lens"][src] = torch.div(positions + 1, ratio, rounding_mode="floor").to(torch.int32)
    starts, rows, group_pos = compressor_metadata(qsl, kv, ratio)
    out["compressor_output_start_loc"][src] = starts
    out["compressor_source_token_indices"][src] = rows
    out["compressor_position_ids"][src] = group_pos
    complete = (positions + 1) % ratio == 0
    out["compressed_rope_position_ids"][src] = torch.where(complete, positions + 1 - ratio, -1).to(torch.int32)
    if state is not None:
        out["state_block_tables"][src] = state


@operator(returns='ForwardMetadata (kernels.metadata)', spec='§3')
def build_forward_metadata(
    query_start_loc: object,
    kv_seq_lens: object,
    window_block_table: object,
    compressed_block_tables: Mapping[int, object],
    state_block_tables: Mapping[int, object],
    *,
    config: V41Config = FLASH,
    tp_size: int = 1,
    capacity: int | None = None,
) -> ForwardMetadata:
    """Lower a packed batch (prefill chunks and/or decode rows) to ForwardMetadata.

    ``query_start_loc`` [B+1], ``kv_seq_lens`` [B] (previously cached length),
    ``window_block_table`` [B, pages], ``compressed_block_tables`` {KV source: [B, pages]},
    ``state_block_tables`` {ratio-2 source: I32 [B, 1]}. ``capacity`` (default: the token
    count) pads every per-token field to T rows with neutral values (see PADDING_VALUES).
    Every error names the field, the request row and the offending value.

    Spec: §3.
    """
    qsl = _parse_int_vector("query_start_loc", query_start_loc)
    kv = _parse_int_vector("kv_seq_lens", kv_seq_lens)
    query_lens, num_tokens, cap, new_kv = _check_batch(qsl, kv, config=config, tp_size=tp_size, capacity=capacity)
    batch = kv.numel()

    window_table = _parse_table("window_block_table", window_block_table, batch)

    tables = _compressed_tables(compressed_block_tables, batch, config)

    states = _state_tables(state_block_tables, batch, config)

    # Per-token derivations.
    request_ids = torch.repeat_interleave(torch.arange(batch), query_lens)
    offsets = torch.arange(num_tokens) - qsl[:-1][request_ids]
    positions = kv[request_ids] + offsets
    logit_rows = torch.where(query_lens > 0, qsl[1:] - 1, -1)
    window_slots, window_indices, window_lens = window_metadata(
        positions, request_ids, window_table, window=config.sliding_window, block_size=config.block_size)

    out: dict[str, dict[int, torch.Tensor]] = {name: {} for name in SOURCE_FIELDS}
    for src in config.kv_source_layer_ids:
        _source_fields(out, src, tables[src], states.get(src), qsl, kv, new_kv, query_lens, positions, request_ids,
                       config)

    def pad(name: str, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        value = value.to(dtype)
        if cap == num_tokens:
            return value
        fill = torch.full((cap - num_tokens, *value.shape[1:]), PADDING_VALUES[name], dtype=dtype)
        return torch.cat((value, fill))

    i32, i64 = torch.int32, torch.int64
    for name in PER_TOKEN_SOURCE_FIELDS:
        dtype = i64 if name.endswith("slots") else i32
        out[name] = {src: pad(name, v, dtype) for src, v in out[name].items()}
    return ForwardMetadata(
        num_tokens=num_tokens,
        query_start_loc=qsl.to(i32),
        query_lens=query_lens.to(i32),
        logit_row_indices=logit_rows.to(i32),
        token_to_req_indices=pad("token_to_req_indices", request_ids, i32),
        moe_token_owners=(torch.arange(cap) % tp_size).to(i32),
        position_ids=pad("position_ids", positions, i32),
        kv_seq_lens=kv.to(i32),
        new_kv_seq_lens=new_kv.to(i32),
        window_slots=pad("window_slots", window_slots, i64),
        window_indices=pad("window_indices", window_indices, i32),
        window_lens=pad("window_lens", window_lens, i32),
        **out,
    )

