"""ForwardMetadata invariants, each re-derived independently (plain Python, element by element)
from the engine inputs, never from the builder under test.

``inputs`` is the keyword dict passed to ``build_forward_metadata`` (see
``contracts.strategies.materialize``); ``meta`` is what the backend returned.

Spec: §3 (field table, derivations, allocation rules), §2.1 (physical row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from contracts.result import CheckResult, Tally, Violation

SPEC = "§3"


@dataclass(frozen=True)
class _Batch:
    qsl: list[int]
    kv: list[int]
    window_table: list[list[int]]
    tables: dict[int, list[list[int]]]
    states: dict[int, list[int]]
    ratios: dict[int, int]
    block: int
    window: int
    tp: int
    capacity: int

    @property
    def batch(self) -> int:
        return len(self.kv)

    @property
    def num_tokens(self) -> int:
        return self.qsl[-1]

    def requests(self):
        """(request, first token, query len) for every request."""
        for r in range(self.batch):
            yield r, self.qsl[r], self.qsl[r + 1] - self.qsl[r]

    def tokens(self):
        """(token, request, position) for every active token."""
        for r, first, n in self.requests():
            for i in range(n):
                yield first + i, r, self.kv[r] + i

    def slot(self, table_row: list[int], logical: int) -> int:
        return table_row[logical // self.block] * self.block + logical % self.block


def _lst(t: object) -> list:
    return t.tolist() if isinstance(t, torch.Tensor) else list(t)


def _lengths(t: Tally, fields: dict[str, tuple[list, int]]) -> bool:
    """Each field holds its number of rows (name -> (values, rows)); one that does not fails naming it, and the
    check stops before indexing past it. True when every length is right."""
    ok = True
    for name, (values, rows) in fields.items():
        if len(values) != rows:
            t.fail(Violation(f"{name}.len", (), len(values), rows, note="rows of the field"))
            ok = False
    return ok


def _batch(inputs: dict) -> _Batch:
    c = inputs["config"]
    qsl = [int(v) for v in _lst(inputs["query_start_loc"])]
    return _Batch(
        qsl=qsl, kv=[int(v) for v in _lst(inputs["kv_seq_lens"])],
        window_table=_lst(inputs["window_block_table"]),
        tables={s: _lst(t) for s, t in inputs["compressed_block_tables"].items()},
        states={s: [row[0] for row in _lst(t)] for s, t in inputs["state_block_tables"].items()},
        ratios={s: c.compress_ratios[s] for s in c.kv_source_layer_ids},
        block=c.block_size, window=c.sliding_window, tp=inputs.get("tp_size", 1),
        capacity=inputs.get("capacity") if inputs.get("capacity") is not None else qsl[-1])


def _get(meta, name, src=None) -> list:
    value = getattr(meta, name)
    if src is not None:
        value = value[src]
    return _lst(value)


def check_query_layout(meta, inputs: dict) -> CheckResult:
    """query_start_loc starts at 0 and never decreases; num_tokens == qsl[-1]; query_lens == diff;
    kv/new_kv pass through. Spec: §3."""
    b, t = _batch(inputs), Tally("check_query_layout", SPEC)
    qsl = _get(meta, "query_start_loc")
    t.expect("query_start_loc", (), qsl, b.qsl)
    if qsl:
        t.expect("query_start_loc", (0,), qsl[0], 0)
    for r in range(1, len(qsl)):
        if qsl[r] < qsl[r - 1]:
            t.fail(Violation("query_start_loc", (r,), qsl[r], f">= {qsl[r - 1]}", note="decreasing"))
    t.expect("num_tokens", (), int(meta.num_tokens), b.num_tokens, note="num_tokens == query_start_loc[-1]")
    lens, kv, new_kv = _get(meta, "query_lens"), _get(meta, "kv_seq_lens"), _get(meta, "new_kv_seq_lens")
    if not _lengths(t, {"query_lens": (lens, b.batch), "kv_seq_lens": (kv, b.batch),
                        "new_kv_seq_lens": (new_kv, b.batch)}):
        return t.result()
    for r, _first, n in b.requests():
        t.expect("query_lens", (r,), lens[r], n)
        t.expect("kv_seq_lens", (r,), kv[r], b.kv[r])
        t.expect("new_kv_seq_lens", (r,), new_kv[r], b.kv[r] + n)
    return t.result()


def check_token_requests(meta, inputs: dict) -> CheckResult:
    """token_to_req_indices agrees with query_start_loc; padding rows are -1. Spec: §3."""
    b, t = _batch(inputs), Tally("check_token_requests", SPEC)
    req = _get(meta, "token_to_req_indices")
    t.expect("token_to_req_indices.len", (), len(req), b.capacity)
    for tok, r, _p in b.tokens():
        if tok < len(req):
            t.expect("token_to_req_indices", (tok,), req[tok], r)
    for tok in range(b.num_tokens, min(len(req), b.capacity)):
        t.expect("token_to_req_indices", (tok,), req[tok], -1, note="padding row")
    return t.result()


def check_positions(meta, inputs: dict) -> CheckResult:
    """position = kv_seq_len[req] + (t - qsl[req]), consecutive within each chunk; padding -1. Spec: §3."""
    b, t = _batch(inputs), Tally("check_positions", SPEC)
    pos = _get(meta, "position_ids")
    t.expect("position_ids.len", (), len(pos), b.capacity)
    for tok, r, p in b.tokens():
        if tok < len(pos):
            t.expect("position_ids", (tok,), pos[tok], p, note=f"kv_seq_lens[{r}] + offset in request {r}")
            if tok > b.qsl[r] and tok - 1 < len(pos):
                t.expect("position_ids", (tok,), pos[tok] - pos[tok - 1], 1, note="consecutive within a chunk")
    for tok in range(b.num_tokens, min(len(pos), b.capacity)):
        t.expect("position_ids", (tok,), pos[tok], -1, note="padding row")
    return t.result()


def check_window(meta, inputs: dict) -> CheckResult:
    """window_slots = slot(p); window_indices = slots of max(0,p-W+1)..p oldest first, then -1;
    window_lens = min(p+1, W). Spec: §3 (MD-11)."""
    b, t = _batch(inputs), Tally("check_window", SPEC)
    slots, idx, lens = _get(meta, "window_slots"), _get(meta, "window_indices"), _get(meta, "window_lens")
    if not _lengths(t, {"window_slots": (slots, b.capacity), "window_indices": (idx, b.capacity),
                        "window_lens": (lens, b.capacity)}):
        return t.result()
    for tok, r, p in b.tokens():
        row = b.window_table[r]
        t.expect("window_slots", (tok,), slots[tok], b.slot(row, p))
        n = min(p + 1, b.window)
        t.expect("window_lens", (tok,), lens[tok], n)
        want = [b.slot(row, q) for q in range(p - n + 1, p + 1)] + [-1] * (b.window - n)
        got = idx[tok]
        if got != want:
            col = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), min(len(got), len(want)))
            t.fail(Violation("window_indices", (tok, col), got[col] if col < len(got) else "missing",
                             want[col] if col < len(want) else "nothing",
                             note=f"position {p - n + 1 + col if col < n else 'padding'} of request {r}; "
                                  "expected oldest first then -1"))
        else:
            t.n_checked += 1
    for tok in range(b.num_tokens, min(len(slots), b.capacity)):
        t.expect("window_slots", (tok,), slots[tok], -1, note="padding row")
        t.expect("window_lens", (tok,), lens[tok], 0, note="padding row")
        t.expect("window_indices", (tok,), idx[tok], [-1] * b.window, note="padding row")
    return t.result()


def check_compressed_slots(meta, inputs: dict) -> CheckResult:
    """compressed/index slot = row p//ratio only where (p+1) % ratio == 0, else -1; -1 for inactive state
    blocks (ratio 2); index slots equal compressed slots. Spec: §3 (MD-06, MD-09)."""
    b, t = _batch(inputs), Tally("check_compressed_slots", SPEC)
    for src, ratio in b.ratios.items():
        cs, xs = _get(meta, "compressed_slots", src), _get(meta, "index_slots", src)
        if not _lengths(t, {f"compressed_slots[{src}]": (cs, b.capacity), f"index_slots[{src}]": (xs, b.capacity)}):
            continue
        for tok, r, p in b.tokens():
            want = -1
            if (p + 1) % ratio == 0 and not (src in b.states and b.states[src][r] < 0):
                want = b.slot(b.tables[src][r], p // ratio)
            t.expect(f"compressed_slots[{src}]", (tok,), cs[tok], want, note=f"position {p}, request {r}")
            t.expect(f"index_slots[{src}]", (tok,), xs[tok], want, note=f"position {p}, request {r}")
        for tok in range(b.num_tokens, min(len(cs), b.capacity)):
            t.expect(f"compressed_slots[{src}]", (tok,), cs[tok], -1, note="padding row")
            t.expect(f"index_slots[{src}]", (tok,), xs[tok], -1, note="padding row")
    return t.result()


def check_compressed_lens(meta, inputs: dict) -> CheckResult:
    """Causal compressed_lens = (p+1)//ratio; compressed_seq_lens = new_kv//ratio; remainders new_kv%ratio.
    Spec: §3."""
    b, t = _batch(inputs), Tally("check_compressed_lens", SPEC)
    for src, ratio in b.ratios.items():
        lens = _get(meta, "compressed_lens", src)
        seq, rem = _get(meta, "compressed_seq_lens", src), _get(meta, "compressed_seq_remainders", src)
        if not _lengths(t, {f"compressed_lens[{src}]": (lens, b.capacity), f"compressed_seq_lens[{src}]": (seq, b.batch),
                            f"compressed_seq_remainders[{src}]": (rem, b.batch)}):
            continue
        for tok, _r, p in b.tokens():
            t.expect(f"compressed_lens[{src}]", (tok,), lens[tok], (p + 1) // ratio, note=f"position {p}")
        for tok in range(b.num_tokens, min(len(lens), b.capacity)):
            t.expect(f"compressed_lens[{src}]", (tok,), lens[tok], 0, note="padding row")
        for r, _f, n in b.requests():
            t.expect(f"compressed_seq_lens[{src}]", (r,), seq[r], (b.kv[r] + n) // ratio)
            t.expect(f"compressed_seq_remainders[{src}]", (r,), rem[r], (b.kv[r] + n) % ratio)
    return t.result()


def check_compressor_outputs(meta, inputs: dict) -> CheckResult:
    """compressor_output_start_loc = cumsum(new_kv//r - kv//r); each output's source token completes its
    group and compressor_position_ids is the group's first position. Spec: §3 (MD-14)."""
    b, t = _batch(inputs), Tally("check_compressor_outputs", SPEC)
    for src, ratio in b.ratios.items():
        starts = _get(meta, "compressor_output_start_loc", src)
        rows = _get(meta, "compressor_source_token_indices", src)
        gpos = _get(meta, "compressor_position_ids", src)
        want_starts, want_rows, want_pos = [0], [], []
        for r, first, n in b.requests():
            old, new = b.kv[r] // ratio, (b.kv[r] + n) // ratio
            want_starts.append(want_starts[-1] + new - old)
            for g in range(old, new):
                want_rows.append(first + (g + 1) * ratio - 1 - b.kv[r])
                want_pos.append(g * ratio)
        for name, got, want in ((f"compressor_output_start_loc[{src}]", starts, want_starts),
                                (f"compressor_source_token_indices[{src}]", rows, want_rows),
                                (f"compressor_position_ids[{src}]", gpos, want_pos)):
            t.expect(f"{name}.len", (), len(got), len(want))
            for i, (g, w) in enumerate(zip(got, want, strict=False)):
                t.expect(name, (i,), g, w)
    return t.result()


def check_compressed_rope_positions(meta, inputs: dict) -> CheckResult:
    """compressed_rope_position_ids = p+1-ratio where the group completes at p, else -1. Spec: §3 (MD-10)."""
    b, t = _batch(inputs), Tally("check_compressed_rope_positions", SPEC)
    for src, ratio in b.ratios.items():
        got = _get(meta, "compressed_rope_position_ids", src)
        if not _lengths(t, {f"compressed_rope_position_ids[{src}]": (got, b.capacity)}):
            continue
        for tok, _r, p in b.tokens():
            t.expect(f"compressed_rope_position_ids[{src}]", (tok,), got[tok],
                     p + 1 - ratio if (p + 1) % ratio == 0 else -1, note=f"position {p}")
        for tok in range(b.num_tokens, min(len(got), b.capacity)):
            t.expect(f"compressed_rope_position_ids[{src}]", (tok,), got[tok], -1, note="padding row")
    return t.result()


def check_live_slots(meta, inputs: dict) -> CheckResult:
    """Live write slots are unique (one writer per physical row) and fall inside the request's own
    allocated pages; every window index lies in the request's pages. Spec: §3, §2.1."""
    b, t = _batch(inputs), Tally("check_live_slots", SPEC)

    def owned(table_row: list[int]) -> set[int]:
        return {p for p in table_row if p >= 0}

    def unique_and_owned(name: str, slots: list[int], table: list[list[int]], req_of: dict[int, int]):
        seen: dict[int, int] = {}
        for tok, slot in enumerate(slots):
            if slot < 0 or tok not in req_of:
                continue
            r = req_of[tok]
            t.n_checked += 1
            if slot in seen:
                t.fail(Violation(name, (tok,), slot, "a slot no other token writes",
                                 note=f"token {seen[slot]} writes the same physical row"))
            seen[slot] = tok
            if slot // b.block not in owned(table[r]):
                t.fail(Violation(name, (tok,), slot, f"a row of request {r}'s pages {sorted(owned(table[r]))}",
                                 note=f"page {slot // b.block}"))

    req_of = {tok: r for tok, r, _p in b.tokens()}
    idx = _get(meta, "window_indices")
    if not _lengths(t, {"window_indices": (idx, b.capacity)}):
        return t.result()
    unique_and_owned("window_slots", _get(meta, "window_slots"), b.window_table, req_of)
    for src in b.ratios:
        unique_and_owned(f"compressed_slots[{src}]", _get(meta, "compressed_slots", src), b.tables[src], req_of)
    for tok, r, _p in b.tokens():
        pages = owned(b.window_table[r])
        for col, slot in enumerate(idx[tok]):
            if slot >= 0:
                t.n_checked += 1
                if slot // b.block not in pages:
                    t.fail(Violation("window_indices", (tok, col), slot, f"a row of request {r}'s pages",
                                     note=f"page {slot // b.block}"))
    return t.result()


def check_logit_rows(meta, inputs: dict) -> CheckResult:
    """logit_row_indices[r] = qsl[r+1]-1, or -1 for an empty request. Spec: §3 (MD-12)."""
    b, t = _batch(inputs), Tally("check_logit_rows", SPEC)
    got = _get(meta, "logit_row_indices")
    t.expect("logit_row_indices.len", (), len(got), b.batch)
    for r, first, n in b.requests():
        if r < len(got):
            t.expect("logit_row_indices", (r,), got[r], first + n - 1 if n else -1)
    return t.result()


def check_moe_owners(meta, inputs: dict) -> CheckResult:
    """moe_token_owners = arange(T) % TP over the capacity. Spec: §3 (MD-13)."""
    b, t = _batch(inputs), Tally("check_moe_owners", SPEC)
    got = _get(meta, "moe_token_owners")
    t.expect("moe_token_owners.len", (), len(got), b.capacity)
    for tok, owner in enumerate(got):
        t.expect("moe_token_owners", (tok,), owner, tok % b.tp)
    return t.result()


def check_state_tables(meta, inputs: dict) -> CheckResult:
    """State block tables pass through unchanged (engine-owned, never derived from the batch row), for
    exactly the ratio-2 sources. Spec: §3 (MD-07)."""
    b, t = _batch(inputs), Tally("check_state_tables", SPEC)
    got = meta.state_block_tables
    t.expect("state_block_tables.keys", (), sorted(got), sorted(b.states))
    for src, col in b.states.items():
        if src in got:
            t.expect(f"state_block_tables[{src}].dtype", (), got[src].dtype, torch.int32)
            rows = [row[0] for row in _lst(got[src])]
            for r, (g, w) in enumerate(zip(rows, col, strict=False)):
                t.expect(f"state_block_tables[{src}]", (r, 0), g, w)
    return t.result()


_TOKEN_FIELDS = {"token_to_req_indices": torch.int32, "moe_token_owners": torch.int32,
                 "position_ids": torch.int32, "window_slots": torch.int64, "window_lens": torch.int32}
_SOURCE_TOKEN_FIELDS = {"compressed_slots": torch.int64, "index_slots": torch.int64,
                        "compressed_lens": torch.int32, "compressed_rope_position_ids": torch.int32}
_REQUEST_FIELDS = {"query_lens": torch.int32, "logit_row_indices": torch.int32, "kv_seq_lens": torch.int32,
                   "new_kv_seq_lens": torch.int32}


def check_field_layout(meta, inputs: dict) -> CheckResult:
    """Every field has the spec's dtype and shape ([T], [B], [B+1], [T, W], [compressor outputs]). Spec: §3 field
    table."""
    b, t = _batch(inputs), Tally("check_field_layout", SPEC)

    def expect(name: str, value: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]):
        t.expect(f"{name}.dtype", (), value.dtype, dtype)
        t.expect(f"{name}.shape", (), tuple(value.shape), shape)

    for name, dtype in _TOKEN_FIELDS.items():
        expect(name, getattr(meta, name), dtype, (b.capacity,))
    expect("window_indices", meta.window_indices, torch.int32, (b.capacity, b.window))
    for name, dtype in _REQUEST_FIELDS.items():
        expect(name, getattr(meta, name), dtype, (b.batch,))
    expect("query_start_loc", meta.query_start_loc, torch.int32, (b.batch + 1,))
    for src in b.ratios:
        for name, dtype in _SOURCE_TOKEN_FIELDS.items():
            expect(f"{name}[{src}]", getattr(meta, name)[src], dtype, (b.capacity,))
        for name in ("compressed_seq_lens", "compressed_seq_remainders"):
            expect(f"{name}[{src}]", getattr(meta, name)[src], torch.int32, (b.batch,))
        expect(f"compressor_output_start_loc[{src}]", meta.compressor_output_start_loc[src], torch.int32,
               (b.batch + 1,))
        ratio = b.ratios[src]
        outputs = sum((b.kv[r] + n) // ratio - b.kv[r] // ratio for r, _f, n in b.requests())
        for name in ("compressor_source_token_indices", "compressor_position_ids"):
            expect(f"{name}[{src}]", getattr(meta, name)[src], torch.int32, (outputs,))
    return t.result()


ALL_CHECKS = (check_query_layout, check_token_requests, check_positions, check_window, check_compressed_slots,
              check_compressed_lens, check_compressor_outputs, check_compressed_rope_positions, check_live_slots,
              check_logit_rows, check_moe_owners, check_state_tables, check_field_layout)
