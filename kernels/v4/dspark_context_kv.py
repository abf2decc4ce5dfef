"""V4-Flash dspark's drafter context KV (spec §8; upstream models/deepseek_v4_flash_dspark/dspark_context_kv.py):
one drafter stage projects the target model's rows of the step into its own paged sliding-window cache.

``main_x`` [T, D] BF16 are the step's rows (the verify width on decode, the prompt chunk on prefill), ``wkv``
[D, head_dim] / ``gamma_ckv`` [head_dim] the stage's KV projection and norm weight, ``freqs_cos`` / ``freqs_sin``
[max_pos, rope] BF16 the RoPE tables indexed by ``position_ids`` [T], ``slot_mapping`` [T] INT64 each row's flat
cache row (-1: the row writes nothing), ``kv_cache`` [blocks, block_size, (1,) head_dim] BF16 the stage's cache.

kv[t] = v4_qkv_proj_rope's KV path of main_x[t] with the RoPE row of position_ids[t] (FP32 x · wkv, RMSNorm times
gamma_ckv, the rope dims rotated, each part rounded to BF16; ``kernels.v4.qkv_proj.kv_branch``), written at flat row
slot_mapping[t] in token order (two rows of one slot: the later token's stays, as upstream's sequential scatter
leaves it). Every other cache row is returned unchanged; the input cache is not modified.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, dspark_only, generator, is_tiny, replaced

SPEC = "§8"


def check_dspark_context_kv(main_x: torch.Tensor, wkv: torch.Tensor, gamma_ckv: torch.Tensor,
                            freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, position_ids: torch.Tensor,
                            slot_mapping: torch.Tensor, kv_cache: torch.Tensor, *, config) -> None:
    """The caller's side: shapes and dtypes against the preset, positions inside the tables, slots inside the cache
    (or -1)."""
    hidden, dim, rope = config.hidden_size, config.head_dim, config.qk_rope_head_dim
    if main_x.ndim != 2 or main_x.shape[1] != hidden or main_x.dtype != torch.bfloat16:
        raise ContractInputError("main_x", None, f"BF16 [T, {hidden}]", f"{main_x.dtype}{list(main_x.shape)}", SPEC)
    tokens = main_x.shape[0]
    for name, t, shape in (("wkv", wkv, (hidden, dim)), ("gamma_ckv", gamma_ckv, (dim,))):
        if tuple(t.shape) != shape or t.dtype != torch.bfloat16:
            raise ContractInputError(name, None, f"BF16 {list(shape)}", f"{t.dtype}{list(t.shape)}", SPEC)
    for name, table in (("freqs_cos", freqs_cos), ("freqs_sin", freqs_sin)):
        if table.ndim != 2 or table.shape[1] < rope // 2 or table.shape[0] < 1:
            raise ContractInputError(name, None, f"[max_pos, {rope}]", list(table.shape), SPEC)
    for name, ids in (("position_ids", position_ids), ("slot_mapping", slot_mapping)):
        if ids.ndim != 1 or ids.shape[0] != tokens or ids.is_floating_point():
            raise ContractInputError(name, None, f"integer [{tokens}]", f"{ids.dtype}{list(ids.shape)}", SPEC)
    if kv_cache.ndim not in (3, 4) or kv_cache.shape[-1] != dim or kv_cache.dtype != torch.bfloat16 or (
            kv_cache.ndim == 4 and kv_cache.shape[2] != 1):
        raise ContractInputError("kv_cache", None, f"BF16 [blocks, block_size, (1,) {dim}]",
                                 f"{kv_cache.dtype}{list(kv_cache.shape)}", SPEC)
    bad = (position_ids < 0) | (position_ids >= freqs_cos.shape[0])
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ContractInputError("position_ids", (t,), f"a position in [0, {freqs_cos.shape[0]})",
                                 int(position_ids[t]), SPEC)
    rows = kv_cache.numel() // dim
    bad = (slot_mapping < -1) | (slot_mapping >= rows)
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ContractInputError("slot_mapping", (t,), f"-1 or a cache row in [0, {rows})", int(slot_mapping[t]),
                                 SPEC)


@operator(returns="kv_cache (the stage's cache with each row's KV -- v4_qkv_proj_rope's KV path -- at its slot; "
                  "-1 writes nothing, a later token wins a shared slot)", spec=SPEC)
def dspark_context_kv(main_x: torch.Tensor, wkv: torch.Tensor, gamma_ckv: torch.Tensor, freqs_cos: torch.Tensor,
                      freqs_sin: torch.Tensor, position_ids: torch.Tensor, slot_mapping: torch.Tensor,
                      kv_cache: torch.Tensor, *, config) -> torch.Tensor:
    """The drafter's context KV (module docstring) -> the new cache, of kv_cache's shape."""
    from kernels.v4.qkv_proj import kv_branch

    check_dspark_context_kv(main_x, wkv, gamma_ckv, freqs_cos, freqs_sin, position_ids, slot_mapping, kv_cache,
                            config=config)
    pos = position_ids.to(torch.int64)
    return written(kv_cache, kv_branch(main_x, wkv, gamma_ckv, freqs_cos[pos], freqs_sin[pos], config=config),
                   slot_mapping)


def written(kv_cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """A copy of ``kv_cache`` with rows[t] at flat row slot_mapping[t], in token order (-1: no write; a later token
    wins a shared slot). Slots are checked by the caller. Shared with dspark_attention's commit."""
    cache = kv_cache.clone()
    flat = cache.view(-1, cache.shape[-1])
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            flat[slot] = rows[t]
    return cache


# --- the record ----------------------------------------------------------------------------------------------

def _context_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """A decode step of 2 requests x 4 rows at positions 5 .. 8 and 130 .. 133 (the second request's window has
    wrapped its first page), paged by a table of 2 pages of ``config.block_size`` (at a page of 128 the two requests write the two pages); one
    padding row (slot -1);
    RoPE tables of angles up to 300 radians, 256 positions (tiny) or the entry's compiled
    ``kernel_max_seq_len``; the cache filled with unit-RMS rows (upstream's
    fixture), so an unwritten row is never zero."""
    g = generator(seed)
    hidden, dim, rope, page = config.hidden_size, config.head_dim, config.qk_rope_head_dim, config.block_size
    pos = torch.tensor([5, 6, 7, 8, 130, 131, 132, 133], dtype=torch.int32)
    table = torch.tensor([[1, 1], [1, 0]])  # request r's logical page p -> physical page (2 pages in all)
    slots = torch.tensor([int(table[t // 4, (int(pos[t]) // page) % 2]) * page + int(pos[t]) % page
                          for t in range(8)], dtype=torch.int64)
    slots[3] = -1
    positions = 256 if is_tiny(config) else config.kernel_max_seq_len  # the entry's compiled table (16384)
    angle = torch.arange(positions, dtype=torch.float32)[:, None] * torch.rand(rope, generator=g) * 300 / 256
    cache = torch.randn(2, page, 1, dim, generator=g)
    cache = cache / cache.pow(2).mean(-1, keepdim=True).sqrt()
    return {"main_x": (torch.randn(8, hidden, generator=g) * 0.05).to(torch.bfloat16),
            "wkv": (torch.randn(hidden, dim, generator=g) / hidden**0.5).to(torch.bfloat16),
            "gamma_ckv": (torch.rand(dim, generator=g) + 0.5).to(torch.bfloat16),
            "freqs_cos": torch.cos(angle).to(torch.bfloat16), "freqs_sin": torch.sin(angle).to(torch.bfloat16),
            "position_ids": pos, "slot_mapping": slots, "kv_cache": cache.to(torch.bfloat16)}



RECORD = Record(
    operator="dspark_context_kv",
    call=lambda fn, i, config: {"kv_cache": fn(**i, config=config)},
    outputs={"kv_cache": "exact"},
    cases=(CaseSpec("dspark_context_kv", "dspark's drafter context KV: 2 requests x 4 rows (one padding row) "
                    "projected, normed, rotated and written at their paged slots of a unit-RMS cache",
                    _context_inputs, geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(
        BadCall("a slot past the cache", "dspark_context_kv",
                replaced(slot_mapping=lambda i: i["slot_mapping"] + i["kv_cache"].numel()), "slot_mapping"),
        BadCall("a position past the tables", "dspark_context_kv",
                replaced(position_ids=lambda i: i["position_ids"] + 1000), "position_ids"),
        BadCall("an FP32 cache", "dspark_context_kv", replaced(kv_cache=lambda i: i["kv_cache"].float()),
                "kv_cache"),
    ),
    bindings=dspark_only("the drafter's context KV", golden="dspark_context_kv.py::golden_dspark_context_kv",
                 entry="dspark_context_kv.py::dspark_context_kv_test"),
)
