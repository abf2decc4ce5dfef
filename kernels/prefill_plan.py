"""The CED prefill plan (Causal Encoder, then Decoder) and the decoder replay selection, host-side.

* ``prefill_layer_plan``: layers before the candidate source (0-19 at FLASH) run as the **encoder** over every
  packed prompt row -- prefill SWA, C2A FULL or C2A REUSE, ratio 0 or 2 only; layers from the candidate source
  on (20-39) run as the **decoder** -- C1A FULL (layer 20, "seeded": the only layer that publishes the global
  compressed and index caches), REINDEX or REUSE, ratio 1 only. Anything else is an error naming the layer.
* ``causal_encoder_layer``: the causal encoder takes layer ids 0..19 only ("causal encoder layer_id").
* ``select_decoder_replay``: the decoder re-runs at most the last ``window`` (128) encoded rows of each fresh
  request: replay length min(len, window), replay start len - replay length, positions the request-local tail,
  the packed replay stream's ``query_start_loc``, window lens truncated to the replay start (the SWA of a
  replayed row only sees replayed rows), window slots / indices from the window block table, compressed lens
  position + 1, and the logit row of each request (its last replay row; -1 for an empty request). Bad encoder
  metadata (not starting at 0, decreasing, not covering the packed rows, noncontiguous positions, wrong
  request ids, a cached prefix, a table without one row per request, a non-positive window) is an error.

Spec: §1 (schedule), §3 (paged slots, window metadata); upstream_checks SC-19, SC-20, SC-21, MD-15, MD-16,
MD-20.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.config import FLASH, LayerKind, V41Config
from kernels.errors import ContractInputError
from kernels.metadata import paged_slots

SPEC = "§1"
ENCODER_KINDS = {LayerKind.SWA: "prefill_swa", LayerKind.C2A_FULL: "prefill_c2a_full",
                 LayerKind.C2A_REUSE: "prefill_c2a_reuse"}
DECODER_KINDS = {LayerKind.C1A_FULL: "prefill_c1a_seeded", LayerKind.C1A_REINDEX: "prefill_c1a_reindex",
                 LayerKind.C1A_REUSE: "prefill_c1a_reuse"}


@dataclass(frozen=True)
class PlannedLayer:
    layer_id: int
    stage: str  # "encoder" | "decoder"
    entry: str  # the prefill entry family that runs it
    publishes_global: bool  # publishes the global compressed and index caches (layer 20 only)


def prefill_layer_plan(config: V41Config = FLASH) -> tuple[PlannedLayer, ...]:
    """Every layer's CED stage and entry. Spec: SC-19, SC-20."""
    split = config.candidate_source_layer_id
    plan = []
    for layer in config.schedule:
        encoder = layer.layer_id < split
        table = ENCODER_KINDS if encoder else DECODER_KINDS
        ratios = (0, 2) if encoder else (1,)
        if layer.kind not in table or layer.compress_ratio not in ratios:
            raise ContractInputError("layer_id", (layer.layer_id,),
                                     f"an {'encoder' if encoder else 'decoder'} layer ({'/'.join(k.value for k in table)}, "
                                     f"ratio {' or '.join(map(str, ratios))})",
                                     f"{layer.kind.value} at ratio {layer.compress_ratio}", "SC-19")
        plan.append(PlannedLayer(layer.layer_id, "encoder" if encoder else "decoder", table[layer.kind],
                                 layer.layer_id == split))
    return tuple(plan)


def causal_encoder_layer(layer_id: int, config: V41Config = FLASH) -> int:
    """A layer id the causal encoder accepts (0 .. candidate source - 1). Spec: SC-21."""
    if isinstance(layer_id, bool) or not 0 <= layer_id < config.candidate_source_layer_id:
        raise ContractInputError("causal encoder layer_id", None, f"0..{config.candidate_source_layer_id - 1}",
                                 layer_id, "SC-21")
    return layer_id


@dataclass(frozen=True)
class DecoderReplay:
    source_rows: torch.Tensor  # [R] int64 packed encoder rows replayed, request order
    query_start_loc: torch.Tensor  # [B+1] int32 of the replay stream
    query_lens: torch.Tensor  # [B] int32
    replay_starts: torch.Tensor  # [B] int32 request-local position of the first replayed row
    position_ids: torch.Tensor  # [R] int32
    token_to_req_indices: torch.Tensor  # [R] int32
    compressed_lens: torch.Tensor  # [R] int32 (ratio 1: position + 1)
    window_slots: torch.Tensor  # [R] int64
    window_indices: torch.Tensor  # [R, window] int32, -1 after the visible rows
    window_lens: torch.Tensor  # [R] int32

    @property
    def logit_row_indices(self) -> torch.Tensor:
        """The last replay row of each request, -1 for an empty request."""
        return torch.where(self.query_lens > 0, self.query_start_loc[1:] - 1, -1).to(torch.int32)


def select_decoder_replay(query_start_loc: torch.Tensor, position_ids: torch.Tensor,
                          token_to_req_indices: torch.Tensor, kv_seq_lens: torch.Tensor,
                          window_block_table: torch.Tensor, *, window: int = FLASH.sliding_window,
                          block_size: int = FLASH.block_size) -> DecoderReplay:
    """The decoder replay of fresh prompts. Spec: MD-15, MD-16."""
    if window <= 0:
        raise ContractInputError("window", None, "> 0", window, "MD-15")
    starts = torch.as_tensor(query_start_loc).to(torch.int64)
    if starts.ndim != 1 or starts.numel() < 2 or int(starts[0]) != 0:
        raise ContractInputError("query_start_loc", None, "[B+1] starting at 0 with at least one request",
                                 starts.tolist(), "MD-15")
    lengths = starts[1:] - starts[:-1]
    if bool((lengths < 0).any()):
        b = int((lengths < 0).nonzero()[0, 0])
        raise ContractInputError("query_start_loc", (b + 1,), f">= query_start_loc[{b}] (nondecreasing)",
                                 int(starts[b + 1]), "MD-15")
    total = int(starts[-1])
    for name, t in (("position_ids", position_ids), ("token_to_req_indices", token_to_req_indices)):
        if t.ndim != 1 or t.numel() != total:
            raise ContractInputError(name, None, f"[{total}] (the packed encoder rows)", list(t.shape), "MD-15")
    kv = torch.as_tensor(kv_seq_lens)
    if kv.numel() != lengths.numel() or bool((kv != 0).any()):
        raise ContractInputError("kv_seq_lens", None, f"{lengths.numel()} zeros (fresh prompts: no cached prefix)",
                                 kv.tolist(), "MD-15")
    if window_block_table.ndim != 2 or window_block_table.shape[0] != lengths.numel():
        raise ContractInputError("window_block_table", None, f"one row per request ({lengths.numel()})",
                                 list(window_block_table.shape), "MD-15")
    replay_lens = torch.clamp(lengths, max=window)
    replay_starts = lengths - replay_lens
    rows, positions, requests = [], [], []
    for b, length in enumerate(lengths.tolist()):
        first, last = int(starts[b]), int(starts[b + 1])
        if not torch.equal(position_ids[first:last].to(torch.int64), torch.arange(length)):
            raise ContractInputError("position_ids", (b,), f"0..{length - 1} (contiguous from 0)",
                                     position_ids[first:last].tolist()[:8], "MD-15")
        if not bool((token_to_req_indices[first:last] == b).all()):
            raise ContractInputError("token_to_req_indices", (b,), f"request {b} on its rows",
                                     token_to_req_indices[first:last].tolist()[:8], "MD-15")
        count = int(replay_lens[b])
        rows.append(torch.arange(last - count, last))
        positions.append(torch.arange(length - count, length))
        requests.append(torch.full((count,), b, dtype=torch.int64))
    source_rows, pos, req = torch.cat(rows), torch.cat(positions), torch.cat(requests)
    qsl = torch.cat((torch.zeros(1, dtype=torch.int64), replay_lens.cumsum(0))).to(torch.int32)
    window_lens = pos - replay_starts[req] + 1
    offsets = torch.arange(window)
    visible = pos[:, None] - window_lens[:, None] + 1 + offsets
    valid = offsets[None] < window_lens[:, None]
    indices = torch.full(visible.shape, -1, dtype=torch.int64)
    if bool(valid.any()):
        indices[valid] = paged_slots(visible[valid], req[:, None].expand_as(visible)[valid], window_block_table,
                                     block_size=block_size, field="window_block_table")
    slots = paged_slots(pos, req, window_block_table, block_size=block_size, field="window_block_table")
    return DecoderReplay(source_rows, qsl, replay_lens.to(torch.int32), replay_starts.to(torch.int32),
                         pos.to(torch.int32), req.to(torch.int32), (pos + 1).to(torch.int32), slots,
                         indices.to(torch.int32), window_lens.to(torch.int32))


PREFILL_MAX_TOKENS = 4096
PREFILL_MAX_PAGES = 32
PRECISIONS = ("fp32", "official")


@dataclass(frozen=True)
class PrefillContext:
    """One CED prefill call's requests: prompt ``lengths`` (positive ints, bools refused), the row ``capacity``
    (default: the packed token count; num_tokens <= capacity <= 4096), the pages they need (requests ·
    ceil(longest / 128) <= 32, plus one zeroed sentinel page per cache) and the activation ``precision``
    (``fp32`` or ``official``). Spec: MD-21."""

    lengths: tuple[int, ...]
    capacity: int | None = None
    precision: str = "fp32"
    block_size: int = FLASH.block_size

    def __post_init__(self) -> None:
        lengths = tuple(self.lengths)
        if not lengths:
            raise ContractInputError("lengths", None, "at least one prompt length", lengths, "MD-21")
        for i, n in enumerate(lengths):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ContractInputError("lengths", (i,), "a positive int (bool refused)", repr(n), "MD-21")
        object.__setattr__(self, "lengths", lengths)
        capacity = self.num_tokens if self.capacity is None else self.capacity
        if isinstance(capacity, bool) or not isinstance(capacity, int) or \
                not self.num_tokens <= capacity <= PREFILL_MAX_TOKENS:
            raise ContractInputError("capacity", None, f"an int in [{self.num_tokens} (num_tokens), "
                                     f"{PREFILL_MAX_TOKENS}]", repr(capacity), "MD-21")
        object.__setattr__(self, "capacity", capacity)
        pages = len(lengths) * -(-max(lengths) // self.block_size)
        if pages > PREFILL_MAX_PAGES:
            raise ContractInputError("lengths", None, f"requests · ceil(longest / {self.block_size}) <= "
                                     f"{PREFILL_MAX_PAGES} pages", pages, "MD-21")
        if self.precision not in PRECISIONS:
            raise ContractInputError("precision", None, f"one of {PRECISIONS}", self.precision, "MD-21")

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def pages_per_cache(self) -> int:
        """The request pages plus one sentinel page (kept zero) per cache."""
        return len(self.lengths) * -(-max(self.lengths) // self.block_size) + 1


@dataclass(frozen=True)
class PrefillState:
    """The residual streams and their delayed mix between CED layers: ``x_hc`` [T, hc, D] or [B, T, hc, D] and
    ``pre_mix`` one rank lower with the same leading shape, both FP32, last dims (hc, hidden). Spec: MD-22."""

    x_hc: torch.Tensor
    pre_mix: torch.Tensor
    config: V41Config = FLASH

    def __post_init__(self) -> None:
        x, m, c = self.x_hc, self.pre_mix, self.config
        if x.ndim not in (3, 4) or tuple(x.shape[-2:]) != (c.hc_mult, c.hidden_size):
            raise ContractInputError("x_hc", None, f"[T, {c.hc_mult}, {c.hidden_size}] or [B, T, {c.hc_mult}, "
                                     f"{c.hidden_size}]", list(x.shape), "MD-22")
        if m.ndim != x.ndim - 1 or tuple(m.shape) != tuple(x.shape[:-1]):
            raise ContractInputError("pre_mix", None, f"{list(x.shape[:-1])} (x_hc's shape without D)",
                                     list(m.shape), "MD-22")
        for name, t in (("x_hc", x), ("pre_mix", m)):
            if t.dtype != torch.float32:
                raise ContractInputError(name, None, "float32", t.dtype, "MD-22")


def check_engram_inputs(layer_id: int, hash_ids: torch.Tensor | None, tokens: int, *,
                        config: V41Config = FLASH) -> bool:
    """Engram runs before its own layers only (FLASH: 1 and 14): such a layer needs Engram hash ids for every
    token row; any other layer refuses them ("does not own an Engram block"). Returns whether Engram runs.
    Spec: upstream_checks HC-13, MD-23 (hash ids for every token)."""
    owns = layer_id in config.engram_layer_ids
    if hash_ids is not None and not owns:
        raise ContractInputError("engram", (layer_id,), f"no Engram inputs: layer {layer_id} does not own an Engram "
                                 f"block (Engram layers {config.engram_layer_ids})", "hash ids", "HC-13")
    if owns and (hash_ids is None or hash_ids.ndim < 1 or hash_ids.shape[0] != tokens):
        got = None if hash_ids is None else list(hash_ids.shape)
        raise ContractInputError("engram", (layer_id,), f"hash ids for every one of the {tokens} token rows", got,
                                 "MD-23")
    return owns
