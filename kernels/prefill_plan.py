"""The CED prefill plan (Causal Encoder, then Decoder) and the decoder replay selection, host-side.

* ``prefill_layer_plan``: layers before the candidate source (0-19 at FLASH) run as the **encoder** over every
  packed prompt row -- prefill SWA, C2A FULL or C2A REUSE, ratio 0 or 2 only; layers from the candidate source
  on (20-39) run as the **decoder** -- C1A FULL (layer 20, "seeded": the only layer that publishes the global
  compressed and index caches), REINDEX or REUSE, ratio 1 only. Anything else is an error naming the layer.
* ``causal_encoder_layer``: the causal encoder takes layer ids 0..19 only ("causal encoder layer_id").
* ``decoder_replay``: the decoder re-runs at most the last ``window`` (128) encoded rows of each fresh
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
from kernels.errors import ContractInputError, is_int
from kernels.metadata import paged_slots
from kernels.operators import operator

SPEC = "§1"
ENCODER_KINDS = {LayerKind.SWA: "prefill_swa", LayerKind.C2A_FULL: "prefill_c2a_full",
                 LayerKind.C2A_REUSE: "prefill_c2a_reuse"}
DECODER_KINDS = {LayerKind.C1A_FULL: "prefill_c1a_seeded", LayerKind.C1A_REINDEX: "prefill_c1a_reindex",
                 LayerKind.C1A_REUSE: "prefill_c1a_reuse"}
# The upstream module each entry family lives in, its device entry and its host entry (what upstream's lazy
# loaders import), and the decoder's global publisher.
ENTRY_MODULES = {
    "prefill_swa": ("prefill_swa", "prefill_swa", "make_hc_program"),
    "prefill_c2a_full": ("prefill_c2a_full", "prefill_c2a_full", "make_hc_program"),
    "prefill_c2a_reuse": ("prefill_c2a_reuse", "prefill_c2a_reuse", "make_hc_program"),
    "prefill_c1a_seeded": ("prefill_c1a_full", "prefill_c1a_seeded", "l3_prefill_c1a_seeded"),
    "prefill_c1a_reindex": ("prefill_c1a_reindex", "prefill_c1a_reindex", "l3_prefill_c1a_reindex_test"),
    "prefill_c1a_reuse": ("prefill_c1a_reuse", "prefill_c1a_reuse", "l3_prefill_c1a_reuse_test"),
}
GLOBAL_PUBLISHER = ("prefill_decoder_kv", "publish_decoder_global_from_encoder_rank")


@dataclass(frozen=True)
class PlannedLayer:
    layer_id: int
    stage: str  # "encoder" | "decoder"
    entry: str  # the prefill entry family that runs it
    publishes_global: bool  # publishes the global compressed and index caches (layer 20 only)

    @property
    def module(self) -> tuple[str, str, str]:
        """(upstream module, device entry, host entry) the layer's attention loads."""
        return ENTRY_MODULES[self.entry]

    @property
    def publisher(self) -> tuple[str, str] | None:
        """(upstream module, function) of the global publisher the layer loads, if any."""
        return GLOBAL_PUBLISHER if self.publishes_global else None


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
    source_rows: torch.Tensor  # [R] int64 rows of (cached tails ++ new encoder rows) replayed, request order
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


@dataclass(frozen=True)
class EncoderReplay:
    """The encoder's rows when some requests resume a cached prefix: each such request's last ``window`` cached
    input rows replayed before its new rows. Only ``is_new`` rows may publish global / index caches or write
    compressor state. Spec: MD-19."""

    source_rows: torch.Tensor  # [R] int64 rows of (cached input tails ++ new input rows), request order
    query_start_loc: torch.Tensor  # [B+1] int32
    position_ids: torch.Tensor  # [R] int32
    token_to_req_indices: torch.Tensor  # [R] int32
    replay_starts: torch.Tensor  # [B] int32
    is_new: torch.Tensor  # [R] bool
    window_slots: torch.Tensor  # [R] int64
    window_indices: torch.Tensor  # [R, window] int32
    window_lens: torch.Tensor  # [R] int32

    @property
    def new_rows(self) -> torch.Tensor:
        return self.is_new.nonzero().flatten()

    @property
    def cached_rows(self) -> torch.Tensor:
        return (~self.is_new).nonzero().flatten()


def _spans(starts: torch.Tensor, field: str, spec: str) -> torch.Tensor:
    """[B+1] packed spans starting at 0, nondecreasing -> int64 starts."""
    starts = torch.as_tensor(starts).to(torch.int64)
    if starts.ndim != 1 or starts.numel() < 2 or int(starts[0]) != 0:
        raise ContractInputError(field, None, "[B+1] starting at 0 with at least one request", starts.tolist(), spec)
    lengths = starts[1:] - starts[:-1]
    if bool((lengths < 0).any()):
        b = int((lengths < 0).nonzero()[0, 0])
        raise ContractInputError(field, (b + 1,), f">= {field}[{b}] (nondecreasing)", int(starts[b + 1]), spec)
    return starts


def _encoder_metadata(query_start_loc, position_ids, token_to_req_indices, kv_seq_lens, window_block_table,
                      cached_starts, window: int, spec: str):
    """The checks the encoder and decoder replays share; returns (starts, lengths, prefixes, cached starts)."""
    if window <= 0:
        raise ContractInputError("window", None, "> 0", window, spec)
    starts = _spans(query_start_loc, "query_start_loc", spec)
    lengths = starts[1:] - starts[:-1]
    total = int(starts[-1])
    for name, t in (("position_ids", position_ids), ("token_to_req_indices", token_to_req_indices)):
        if t.ndim != 1 or t.numel() != total:
            raise ContractInputError(name, None, f"[{total}] (the packed encoder rows)", list(t.shape), spec)
    prefixes = torch.as_tensor(kv_seq_lens).to(torch.int64)
    if prefixes.ndim != 1 or prefixes.numel() != lengths.numel():
        raise ContractInputError("kv_seq_lens", None, f"one cached prefix length per request ({lengths.numel()})",
                                 list(prefixes.shape), spec)
    if bool((prefixes < 0).any()):
        b = int((prefixes < 0).nonzero()[0, 0])
        raise ContractInputError("kv_seq_lens", (b,), ">= 0", int(prefixes[b]), spec)
    if window_block_table.ndim != 2 or window_block_table.shape[0] != lengths.numel():
        raise ContractInputError("window_block_table", None, f"one row per request ({lengths.numel()})",
                                 list(window_block_table.shape), spec)
    if cached_starts is None:
        cached = torch.zeros_like(starts)
    else:
        cached = _spans(cached_starts, "cached tail query_start_loc", spec)
        if cached.numel() != starts.numel():
            raise ContractInputError("cached tail query_start_loc", None, f"one span per request ({starts.numel()} "
                                     "starts)", cached.numel(), spec)
    for b, length in enumerate(lengths.tolist()):
        first, last, prefix = int(starts[b]), int(starts[b + 1]), int(prefixes[b])
        want = torch.arange(prefix, prefix + length)
        if not torch.equal(position_ids[first:last].to(torch.int64), want):
            raise ContractInputError("position_ids", (b,), f"{prefix}..{prefix + length - 1} (contiguous after the "
                                     f"cached prefix of {prefix})", position_ids[first:last].tolist()[:8], spec)
        if not bool((token_to_req_indices[first:last] == b).all()):
            raise ContractInputError("token_to_req_indices", (b,), f"request {b} on its rows",
                                     token_to_req_indices[first:last].tolist()[:8], spec)
    return starts, lengths, prefixes, cached


def _window_metadata(pos: torch.Tensor, req: torch.Tensor, replay_starts: torch.Tensor,
                     window_block_table: torch.Tensor, window: int, block_size: int):
    """Window lens truncated to the replay start (and to the window), visible rows oldest first then -1, and
    each row's own slot."""
    window_lens = torch.minimum(pos - replay_starts[req] + 1, torch.full_like(pos, window))
    offsets = torch.arange(window)
    visible = pos[:, None] - window_lens[:, None] + 1 + offsets
    valid = offsets[None] < window_lens[:, None]
    indices = torch.full(visible.shape, -1, dtype=torch.int64)
    if bool(valid.any()):
        indices[valid] = paged_slots(visible[valid], req[:, None].expand_as(visible)[valid], window_block_table,
                                     block_size=block_size, field="window_block_table")
    slots = paged_slots(pos, req, window_block_table, block_size=block_size, field="window_block_table")
    return slots, indices.to(torch.int32), window_lens.to(torch.int32)


def _cat(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat(parts).to(dtype) if parts else torch.zeros(0, dtype=dtype)


@operator(returns='DecoderReplay (kernels.prefill_plan): the last min(prefix + len, window) '
                   'encoded rows per request (cached tail rows first), their positions, window '
                   'metadata truncated to the replay, logit rows',
          spec='§3')
def decoder_replay(query_start_loc: torch.Tensor, position_ids: torch.Tensor,
                          token_to_req_indices: torch.Tensor, kv_seq_lens: torch.Tensor,
                          window_block_table: torch.Tensor, *, window: int = FLASH.sliding_window,
                          block_size: int = FLASH.block_size,
                          cached_tail_starts: torch.Tensor | None = None) -> DecoderReplay:
    """The decoder replay: per request with new rows, the last min(prefix + len, window) encoded rows -- the
    missing ones taken from its cached encoder tail (``cached_tail_starts``: [B+1] spans of the final encoder
    rows of each cached prefix, request order; source rows index cached tails then new rows). A request
    without new rows replays nothing. A tail longer than min(prefix, window) or shorter than the rows needed is
    an error naming the request. Spec: MD-15, MD-16, MD-17, MD-18."""
    starts, lengths, prefixes, cached = _encoder_metadata(query_start_loc, position_ids, token_to_req_indices,
                                                          kv_seq_lens, window_block_table, cached_tail_starts,
                                                          window, "MD-15")
    cached_total = int(cached[-1])
    rows, positions, requests, counts, replay_starts = [], [], [], [], []
    for b, length in enumerate(lengths.tolist()):
        prefix = int(prefixes[b])
        available = int(cached[b + 1] - cached[b])
        if available > min(prefix, window):
            raise ContractInputError("cached encoder tail", (b,), f"at most min(kv_seq_len {prefix}, window "
                                     f"{window}) rows", available, "MD-17")
        count = min(prefix + length, window) if length else 0
        from_cache = count - min(length, count)
        if available < from_cache:
            raise ContractInputError("cached encoder tail", (b,), f"{from_cache} rows: the request needs encoder "
                                     "replay rows from its cached prefix", available, "MD-17")
        rows.append(torch.cat((torch.arange(int(cached[b + 1]) - from_cache, int(cached[b + 1])),
                               cached_total + torch.arange(int(starts[b + 1]) - (count - from_cache),
                                                           int(starts[b + 1])))))
        positions.append(torch.arange(prefix + length - count, prefix + length))
        requests.append(torch.full((count,), b, dtype=torch.int64))
        counts.append(count)
        replay_starts.append(prefix + length - count)
    pos, req = _cat(positions, torch.int64), _cat(requests, torch.int64)
    lens = torch.tensor(counts, dtype=torch.int64)
    rstarts = torch.tensor(replay_starts, dtype=torch.int64)
    slots, indices, window_lens = _window_metadata(pos, req, rstarts, window_block_table, window, block_size)
    qsl = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0))).to(torch.int32)
    return DecoderReplay(_cat(rows, torch.int64), qsl, lens.to(torch.int32), rstarts.to(torch.int32),
                         pos.to(torch.int32), req.to(torch.int32), (pos + 1).to(torch.int32), slots, indices,
                         window_lens)


@operator(returns="EncoderReplay (kernels.prefill_plan): each resumed request's last min(prefix, "
                   'window) cached input rows then its new rows, is_new marking the rows that may '
                   'publish',
          spec='§3')
def encoder_replay(query_start_loc: torch.Tensor, position_ids: torch.Tensor,
                          token_to_req_indices: torch.Tensor, kv_seq_lens: torch.Tensor,
                          window_block_table: torch.Tensor, cached_input_starts: torch.Tensor, *,
                          window: int = FLASH.sliding_window, block_size: int = FLASH.block_size) -> EncoderReplay:
    """The encoder over resumed requests: per request with new rows, the last min(prefix, window) cached input
    rows (``cached_input_starts``: [B+1] spans of the cached input tails) then every new row; only the new rows
    are ``is_new``; window lens truncated to the replay start even when older window pages exist. Spec:
    MD-19 (and the MD-17 tail bounds)."""
    starts, lengths, prefixes, cached = _encoder_metadata(query_start_loc, position_ids, token_to_req_indices,
                                                          kv_seq_lens, window_block_table, cached_input_starts,
                                                          window, "MD-19")
    cached_total = int(cached[-1])
    rows, positions, requests, new, counts, replay_starts = [], [], [], [], [], []
    for b, length in enumerate(lengths.tolist()):
        prefix = int(prefixes[b])
        available = int(cached[b + 1] - cached[b])
        if available > min(prefix, window):
            raise ContractInputError("cached encoder input tail", (b,), f"at most min(kv_seq_len {prefix}, window "
                                     f"{window}) rows", available, "MD-19")
        replayed = min(prefix, window) if length else 0
        if available < replayed:
            raise ContractInputError("cached encoder input tail", (b,), f"{replayed} rows: the request needs the "
                                     "final cached encoder input window", available, "MD-19")
        rows.append(torch.cat((torch.arange(int(cached[b + 1]) - replayed, int(cached[b + 1])),
                               cached_total + torch.arange(int(starts[b]), int(starts[b + 1])))))
        positions.append(torch.arange(prefix - replayed, prefix + length))
        requests.append(torch.full((replayed + length,), b, dtype=torch.int64))
        new.append(torch.arange(replayed + length) >= replayed)
        counts.append(replayed + length)
        replay_starts.append(prefix - replayed)
    pos, req = _cat(positions, torch.int64), _cat(requests, torch.int64)
    rstarts = torch.tensor(replay_starts, dtype=torch.int64)
    slots, indices, window_lens = _window_metadata(pos, req, rstarts, window_block_table, window, block_size)
    qsl = torch.cat((torch.zeros(1, dtype=torch.int64), torch.tensor(counts).cumsum(0))).to(torch.int32)
    return EncoderReplay(_cat(rows, torch.int64), qsl, pos.to(torch.int32), req.to(torch.int32),
                         rstarts.to(torch.int32), _cat(new, torch.bool), slots, indices, window_lens)


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
            if not is_int(n) or n <= 0:
                raise ContractInputError("lengths", (i,), "a positive int (bool refused)", repr(n), "MD-21")
        object.__setattr__(self, "lengths", lengths)
        capacity = self.num_tokens if self.capacity is None else self.capacity
        if not is_int(capacity) or \
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

    @property
    def num_tokens(self) -> int:
        return self.x_hc.shape[-3]

    def take_rows(self, rows: torch.Tensor) -> PrefillState:
        """The same packed token rows of both streams."""
        return PrefillState(self.x_hc.index_select(-3, rows), self.pre_mix.index_select(-2, rows), self.config)

    def followed_by(self, other: PrefillState) -> PrefillState:
        """This state's rows followed by ``other``'s (cached tails, then new rows)."""
        if other.x_hc.ndim != self.x_hc.ndim:
            raise ContractInputError("x_hc", None, f"the same rank layout ({self.x_hc.ndim}-D) for cached and new "
                                     "rows", other.x_hc.ndim, "MD-18")
        return PrefillState(torch.cat((self.x_hc, other.x_hc), -3), torch.cat((self.pre_mix, other.pre_mix), -2),
                            self.config)


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


def _same_shape(stage: str, layer_id: int, before: PrefillState, after: object) -> PrefillState:
    if not isinstance(after, PrefillState) or after.x_hc.shape != before.x_hc.shape:
        got = type(after).__name__ if not isinstance(after, PrefillState) else list(after.x_hc.shape)
        raise ContractInputError(f"{stage} layer", (layer_id,), f"a PrefillState of the {stage} stream's shape "
                                 f"{list(before.x_hc.shape)}", got, "MD-20")
    return after


def run_prefill_encoder(state: PrefillState, query_start_loc: torch.Tensor, run_layer, *,
                        config: V41Config = FLASH) -> PrefillState:
    """The CED encoder: ``run_layer(planned_layer, state)`` for every encoder layer (0..19) in order, on every
    packed row; a layer must keep the stream's shape; at least one row. Spec: MD-20."""
    rows = int(torch.as_tensor(query_start_loc)[-1])
    if state.num_tokens != rows:
        raise ContractInputError("x_hc", None, f"{rows} rows (query_start_loc[-1])", state.num_tokens, "MD-20")
    if rows == 0:
        raise ContractInputError("x_hc", None, "at least one active row for the encoder", 0, "MD-20")
    for layer in prefill_layer_plan(config):
        if layer.stage == "encoder":
            state = _same_shape("encoder", layer.layer_id, state, run_layer(layer, state))
    return state


def run_prefill_decoder(encoder_state: PrefillState, query_start_loc: torch.Tensor, position_ids: torch.Tensor,
                        token_to_req_indices: torch.Tensor, kv_seq_lens: torch.Tensor,
                        window_block_table: torch.Tensor, publish_global, run_layer, *,
                        cached_tail: PrefillState | None = None, cached_tail_starts: torch.Tensor | None = None,
                        window: int = FLASH.sliding_window, block_size: int = FLASH.block_size,
                        config: V41Config = FLASH) -> tuple[PrefillState, DecoderReplay]:
    """The CED decoder: first ``publish_global(planned_layer, encoder_state)`` for the publishing layer (20)
    on every new encoder row, then ``run_layer(planned_layer, state, replay)`` for every decoder layer (20..39)
    in order on the replay rows only (cached tails ++ new rows gathered by the replay's source rows); a layer
    must keep the replay shape; the replay needs at least one row. Returns the final replay stream and the
    replay. Spec: MD-18, MD-20."""
    rows = int(torch.as_tensor(query_start_loc)[-1])
    if encoder_state.num_tokens != rows:
        raise ContractInputError("x_hc", None, f"{rows} rows (query_start_loc[-1])", encoder_state.num_tokens,
                                 "MD-20")
    if (cached_tail is None) != (cached_tail_starts is None):
        raise ContractInputError("cached_tail", None, "a cached tail state and its starts together", "one of them",
                                 "MD-18")
    if cached_tail is not None and cached_tail.num_tokens != int(torch.as_tensor(cached_tail_starts)[-1]):
        raise ContractInputError("cached_tail", None, f"{int(torch.as_tensor(cached_tail_starts)[-1])} rows "
                                 "(its starts cover the packed tails)", cached_tail.num_tokens, "MD-18")
    replay = decoder_replay(query_start_loc, position_ids, token_to_req_indices, kv_seq_lens,
                                   window_block_table, window=window, block_size=block_size,
                                   cached_tail_starts=cached_tail_starts)
    if replay.source_rows.numel() == 0:
        raise ContractInputError("decoder replay", None, "at least one active row for the decoder", 0, "MD-20")
    plan = [layer for layer in prefill_layer_plan(config) if layer.stage == "decoder"]
    for layer in plan:
        if layer.publishes_global:
            publish_global(layer, encoder_state)
    combined = encoder_state if cached_tail is None else cached_tail.followed_by(encoder_state)
    state = combined.take_rows(replay.source_rows)
    for layer in plan:
        state = _same_shape("decoder", layer.layer_id, state, run_layer(layer, state, replay))
    return state, replay


class CedProgress:
    """What a CED run has done so far, and the inputs its attention may take: the decoder's global and index
    caches must be published (by the publishing layer, both caches) before any decoder layer's attention;
    attention inputs are the stage's normalized FP32 rows [T, D]; in the ``fp32`` precision path every cache
    the attention reads stays FP32; Engram layers need hash ids for every row. Spec: MD-23, AP-16."""

    def __init__(self, context: PrefillContext, *, config: V41Config = FLASH) -> None:
        self.context, self.config = context, config
        self.published = False

    def publish(self, layer_id: int, compressed: torch.Tensor | None, index: torch.Tensor | None) -> None:
        if layer_id != self.config.candidate_source_layer_id:
            raise ContractInputError("publish layer_id", None, f"{self.config.candidate_source_layer_id} (the only "
                                     "global publisher)", layer_id, "MD-23")
        if compressed is None or index is None:
            raise ContractInputError("publish", (layer_id,), "both the global compressed and the index caches",
                                     "compressed" if index is None else "index" if compressed is not None else
                                     "neither", "MD-23")
        self.published = True

    def check_attention(self, layer_id: int, x: torch.Tensor, rows: int, *, caches: dict | None = None,
                        hash_ids: torch.Tensor | None = None) -> None:
        if layer_id >= self.config.candidate_source_layer_id and not self.published:
            raise ContractInputError("attention", (layer_id,), "publish final encoder rows before decoder "
                                     "attention", "no publication yet", "MD-23")
        d = self.config.hidden_size
        if tuple(x.shape) != (rows, d) or x.dtype != torch.float32:
            raise ContractInputError("attention input", (layer_id,), f"normalized FP32 rows [{rows}, {d}]",
                                     f"{list(x.shape)} {x.dtype}", "MD-23")
        if self.context.precision == "fp32":
            for name, cache in (caches or {}).items():
                if cache is not None and cache.dtype != torch.float32:
                    raise ContractInputError(f"{name} cache", (layer_id,), "float32 (the FP32 attention path keeps "
                                             "its cache state FP32)", cache.dtype, "AP-16")
        check_engram_inputs(layer_id, hash_ids, rows, config=self.config)


C1A_CASES = ("multi_1k", "causal", "mixed", "long")
C1A_CASE_MAX_TOKENS = 128


@dataclass(frozen=True)
class C1ACase:
    """One named prefill C1A case: per token row its request and visible length (compressed_lens = position + 1),
    the block table (request-major pages), each row's own slot, its window rows (the last min(visible, page)
    visible rows, oldest first, then -1), its compressed rows (the first min(visible, index_topk)) and its
    candidate mask (the visible rows)."""

    name: str
    request_ids: torch.Tensor  # [T] int32
    compressed_lens: torch.Tensor  # [T] int32
    block_table: torch.Tensor  # [B, P] int32
    slots: torch.Tensor  # [T] int64
    window_indices: torch.Tensor  # [T, page] int32
    compressed_indices: torch.Tensor  # [T, index_topk] int32
    candidate_mask: torch.Tensor  # [T, P * page] uint8


def c1a_case(name: str, tokens: int = 64, *, config: V41Config = FLASH) -> C1ACase:
    """Upstream's prefill C1A cases, selectable by name: ``multi_1k`` (3 requests, one row each at 1024 visible
    rows), ``causal`` (one request, ``tokens`` rows seeing 1..tokens, tokens in [1, 128]), ``mixed`` (lens 1, 2,
    3 | 127, 128 | 511, 512, 513 over 3 requests), ``long`` (1024, 4096, 8192). Any other name is an error
    listing them. Spec: upstream_checks MD-31."""
    if name == "multi_1k":
        requests, lens = [0, 1, 2], [1024] * 3
    elif name == "causal":
        if not is_int(tokens) or not 1 <= tokens <= C1A_CASE_MAX_TOKENS:
            raise ContractInputError("tokens", None, f"an int in [1, {C1A_CASE_MAX_TOKENS}] for case 'causal'",
                                     repr(tokens), "MD-31")
        requests, lens = [0] * tokens, list(range(1, tokens + 1))
    elif name == "mixed":
        requests, lens = [0, 0, 0, 1, 1, 2, 2, 2], [1, 2, 3, 127, 128, 511, 512, 513]
    elif name == "long":
        requests, lens = [0, 1, 2], [1024, 4096, 8192]
    else:
        raise ContractInputError("case", None, f"one of {C1A_CASES}", repr(name), "MD-31")
    page, topk = config.block_size, config.index_topk
    req = torch.tensor(requests, dtype=torch.int64)
    visible = torch.tensor(lens, dtype=torch.int64)
    pages = -(-max(lens) // page)
    table = torch.arange((max(requests) + 1) * pages, dtype=torch.int64).reshape(-1, pages)
    rows = visible.numel()
    window = torch.full((rows, page), -1, dtype=torch.int64)
    compressed = torch.full((rows, topk), -1, dtype=torch.int64)
    mask = torch.zeros(rows, pages * page, dtype=torch.uint8)
    for t in range(rows):
        n = int(visible[t])
        physical = paged_slots(torch.arange(n), req[t].expand(n), table, block_size=page, field="block_table")
        w, c = min(n, page), min(n, topk)
        window[t, :w] = physical[n - w:]
        compressed[t, :c] = physical[:c]
        mask[t, :n] = 1
    slots = paged_slots(visible - 1, req, table, block_size=page, field="block_table")
    return C1ACase(name, req.to(torch.int32), visible.to(torch.int32), table.to(torch.int32), slots,
                   window.to(torch.int32), compressed.to(torch.int32), mask)


def ced_state_slots(query_start_loc: torch.Tensor, position_ids: torch.Tensor, *,
                    state_capacity: int = FLASH.state_capacity) -> torch.Tensor:
    """The resident CED's compressor ring slots of the packed rows: only each request's last ``state_capacity``
    rows own a slot, request · capacity + position % capacity; every earlier row -1. Spec: upstream_checks
    CS-19."""
    starts = _spans(query_start_loc, "query_start_loc", "CS-19")
    if position_ids.ndim != 1 or position_ids.numel() != int(starts[-1]):
        raise ContractInputError("position_ids", None, f"[{int(starts[-1])}] (the packed rows)",
                                 list(position_ids.shape), "CS-19")
    slots = torch.full((position_ids.numel(),), -1, dtype=torch.int32)
    for b in range(starts.numel() - 1):
        first, last = max(int(starts[b]), int(starts[b + 1]) - state_capacity), int(starts[b + 1])
        slots[first:last] = (b * state_capacity + position_ids[first:last].to(torch.int64) % state_capacity).to(
            torch.int32)
    return slots
