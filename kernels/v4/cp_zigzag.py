"""V4-Flash's context-parallel prefill: zigzag ownership of the sequence and the exchange of each segment's KV tail
(spec §7.1, §8; upstream models/deepseek_v4_flash_mtp/prefill_cp_zigzag.py, read by prefill_cp_{swa,hca,csa,layer}.py).

**Ownership** (``cp_zigzag_plan``). A prefill chunk of ``num_tokens`` tokens after ``prefix`` cached ones is cut into
``2 * cp`` logical segments of ``span`` positions each: segment s starts at ``prefix + s * span`` and holds
``clamp(num_tokens - s * span, 0, span)`` tokens. Rank r owns two of them, zigzag: segment r as its part 0 and
segment ``2 * cp - 1 - r`` as its part 1 (so segment s belongs to rank ``s`` if ``s < cp``, else to rank
``2 * cp - 1 - s``, as part 1). A causal prefill's work on a segment grows with its position; pairing the k-th
segment from the front with the k-th from the back gives every rank the same work when the segments are full.
``reverse_index[s]`` is segment s's place in the rank-major order the exchange uses: ``2 * owner + part``.

**The tail exchange** (``cp_zigzag_tail_exchange``). Each rank holds the last ``tail`` KV rows of its two segments,
``local_kv_tail [cp, 2 * tail, D]`` (part 0's rows, then part 1's; a segment shorter than ``tail`` fills the first
``len`` rows of its block). Every rank sends both blocks to every rank (rank-major: block ``2 * rank + part``), and
each rank then holds, identically:

* ``logical_tails [2 * cp * tail, D]``: the blocks back in logical segment order (block s is rank-major block
  ``reverse_index[s]``);
* ``decode_window [tail, D]``: the last ``tail`` positions of the whole chunk, what the first decode step's sliding
  window needs: row j is position ``prefix + num_tokens - tail + j``, read from the block of the segment holding it
  (at row ``pos - start - max(0, len - tail)``). A window row before the chunk starts (a chunk shorter than
  ``tail``) is never written: it stays 0. A window straddles segments, and ranks, whenever segments are shorter than
  ``tail``.

Nothing is computed: every output byte is some rank's input byte (BF16, copied). Upstream's exchange is a
``DistributedTensor`` window with ready / consumed epochs between ranks; this operator is its data movement.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, replaced

SPEC = "§7.1"
CP_SIZES = (2, 4, 8)  # the context-parallel worlds upstream compiles (CP_CHOICES)


def owner_rank(segment: int, cp: int) -> int:
    """The rank owning logical segment ``segment`` of ``2 * cp``."""
    return segment if segment < cp else 2 * cp - 1 - segment


def owner_part(segment: int, cp: int) -> int:
    """0 for the front half of the segments, 1 for the back half (a rank's second segment)."""
    return 0 if segment < cp else 1


def check_cp(cp: int) -> None:
    if not isinstance(cp, int) or isinstance(cp, bool) or cp not in CP_SIZES:
        raise ContractInputError("cp", None, f"one of {CP_SIZES}", cp, SPEC)


@operator(returns="{segment_starts, segment_lens, owner_rank, owner_part, reverse_index} [2cp] INT32: the zigzag "
                  "ownership of a prefill chunk cut into 2cp segments of span positions", spec=SPEC)
def cp_zigzag_plan(num_tokens: int, cp: int, span: int, *, prefix: int = 0) -> dict[str, torch.Tensor]:
    """The chunk's 2 * cp segments (module docstring): each one's first position, its token count, the rank and part
    owning it, and its rank-major place. ``num_tokens`` must fit: 0 < num_tokens <= 2 * cp * span."""
    check_cp(cp)
    for name, value, low in (("span", span, 1), ("num_tokens", num_tokens, 1), ("prefix", prefix, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ContractInputError(name, None, f"an integer >= {low}", value, SPEC)
    if num_tokens > 2 * cp * span:
        raise ContractInputError("num_tokens", None, f"<= 2 * cp * span = {2 * cp * span}", num_tokens, SPEC)
    segs = range(2 * cp)
    return {"segment_starts": torch.tensor([prefix + s * span for s in segs], dtype=torch.int32),
            "segment_lens": torch.tensor([min(max(num_tokens - s * span, 0), span) for s in segs], dtype=torch.int32),
            "owner_rank": torch.tensor([owner_rank(s, cp) for s in segs], dtype=torch.int32),
            "owner_part": torch.tensor([owner_part(s, cp) for s in segs], dtype=torch.int32),
            "reverse_index": torch.tensor([2 * owner_rank(s, cp) + owner_part(s, cp) for s in segs],
                                          dtype=torch.int32)}


def check_tail_exchange(local_kv_tail: torch.Tensor, segment_lens: torch.Tensor) -> None:
    """The caller's side: [cp, 2 * tail, D] BF16 tails for a compiled cp, one length in [0, tail] per segment, and no
    empty segment before a non-empty one (the chunk is one run of positions)."""
    if local_kv_tail.ndim != 3 or local_kv_tail.shape[1] % 2 or local_kv_tail.shape[1] == 0 \
            or local_kv_tail.shape[2] == 0:
        raise ContractInputError("local_kv_tail", None, "[cp, 2 * tail, D] with tail, D >= 1",
                                 list(local_kv_tail.shape), SPEC)
    if local_kv_tail.dtype != torch.bfloat16:
        raise ContractInputError("local_kv_tail", None, "BF16", local_kv_tail.dtype, SPEC)
    cp = local_kv_tail.shape[0]
    check_cp(cp)
    if segment_lens.ndim != 1 or segment_lens.numel() != 2 * cp or segment_lens.is_floating_point():
        raise ContractInputError("segment_lens", None, f"[{2 * cp}] integers (2 * cp segments)",
                                 f"{segment_lens.dtype}{list(segment_lens.shape)}", SPEC)
    lens = [int(v) for v in segment_lens]
    for s, n in enumerate(lens):
        if n < 0:
            raise ContractInputError("segment_lens", (s,), ">= 0", n, SPEC)
        if s and n and not lens[s - 1]:
            raise ContractInputError("segment_lens", (s,), "0 after an empty segment (one run of positions)", n,
                                     SPEC)
    if sum(lens) == 0:
        raise ContractInputError("segment_lens", None, "at least one token", lens, SPEC)


def window_sources(segment_lens: list[int], tail: int) -> list[tuple[int, int]]:
    """For each decode-window row j: (segment, row of its tail block) holding position total - tail + j (relative to
    the chunk's start), or (-1, -1) before the chunk. Segments are consecutive runs of their lengths."""
    total = sum(segment_lens)
    starts = [sum(segment_lens[:s]) for s in range(len(segment_lens))]
    out = []
    for j in range(tail):
        pos = total - tail + j
        src = (-1, -1)
        for s, (start, n) in enumerate(zip(starts, segment_lens, strict=True)):
            if start <= pos < start + n:
                src = (s, pos - start - max(0, n - tail))
                break
        out.append(src)
    return out


@operator(returns="{logical_tails [cp, 2cp*tail, D] BF16, decode_window [cp, tail, D] BF16}: every rank's copy of "
                  "the segments' tails in logical order and the chunk's last tail positions", spec=SPEC)
def cp_zigzag_tail_exchange(local_kv_tail: torch.Tensor, segment_lens: torch.Tensor) -> dict[str, torch.Tensor]:
    """local_kv_tail [cp, 2 * tail, D] BF16 (rank r: segment r's tail, then segment 2cp-1-r's), segment_lens [2cp]
    -> each rank's logical tails and decode window (module docstring)."""
    check_tail_exchange(local_kv_tail, segment_lens)
    cp, rows, dim = local_kv_tail.shape
    tail = rows // 2
    rank_major = local_kv_tail.reshape(2 * cp * tail, dim)  # block 2 * rank + part: what each rank's window holds
    blocks = [rank_major[(2 * owner_rank(s, cp) + owner_part(s, cp)) * tail:][:tail] for s in range(2 * cp)]
    logical = torch.cat(blocks, 0)
    window = torch.zeros(tail, dim, dtype=local_kv_tail.dtype)
    for j, (s, row) in enumerate(window_sources([int(v) for v in segment_lens], tail)):
        if s >= 0:
            window[j] = logical[s * tail + row]
    return {"logical_tails": logical.unsqueeze(0).expand(cp, -1, -1).contiguous(),
            "decode_window": window.unsqueeze(0).expand(cp, -1, -1).contiguous()}


def position_markers(cp: int, tail: int, dim: int) -> torch.Tensor:
    """The local tails of a chunk of 2cp full segments of ``tail`` rows whose rows carry their positions (column 1
    = pos // tail, column 2 = pos % tail, the rest 0), laid out as cp_zigzag_tail_exchange takes them: rank r holds
    segment r's tail, then segment 2cp - 1 - r's. Upstream's zigzag exchange fixture is this chunk (its golden's only domain)."""
    local = torch.zeros(cp, 2 * tail, dim, dtype=torch.bfloat16)
    for r in range(cp):
        for part, segment in enumerate((r, 2 * cp - 1 - r)):
            pos = segment * tail + torch.arange(tail)
            local[r, part * tail:(part + 1) * tail, 1] = (pos // tail).to(torch.bfloat16)
            local[r, part * tail:(part + 1) * tail, 2] = (pos % tail).to(torch.bfloat16)
    return local


# --- the records ---------------------------------------------------------------------------------------------

def _tails(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """CP 2, a tail of 8 rows (tiny) or 128 (V4-Flash's TAIL_ROWS), the head width of the preset: segments of
    (tail, tail, tail, 3) tokens at tiny (the decode window straddles segment 2, rank 1's, and segment 3, rank 0's,
    whose tail block is mostly unused), four full segments at V4-Flash (the fixture's layout); BF16 values of every
    finite kind."""
    g = torch.Generator().manual_seed(seed)
    small = config.hidden_size < 1024
    tail, cp = (8 if small else 128), 2
    lens = [tail, tail, tail, 3] if small else [tail] * 4
    raw = torch.randint(-(2**15), 2**15, (cp, 2 * tail, config.head_dim), generator=g, dtype=torch.int16)
    finite = raw.view(torch.bfloat16).nan_to_num(0.0, 1.0, -1.0)
    return {"local_kv_tail": finite, "segment_lens": torch.tensor(lens, dtype=torch.int32)}


def _exchange_call(fn, i: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    return dict(fn(i["local_kv_tail"], i["segment_lens"]))


TAIL_EXCHANGE_RECORD = Record(
    operator="cp_zigzag_tail_exchange",
    call=_exchange_call,
    outputs={"logical_tails": "exact", "decode_window": "exact"},
    cases=(CaseSpec("cp_zigzag_tail_exchange", "V4-Flash CP prefill tail exchange, CP 2: each rank's two segment "
                    "tails sent to every rank, put back in logical order, and the chunk's last tail positions "
                    "gathered as the decode window (tiny: a window straddling the two ranks, the last segment "
                    "short)", _tails, geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(
        BadCall("a CP world of 3", "cp_zigzag_tail_exchange",
                replaced(local_kv_tail=lambda i: torch.cat((i["local_kv_tail"], i["local_kv_tail"][:1])),
                         segment_lens=torch.tensor([1, 1, 1, 1, 1, 1], dtype=torch.int32)), "cp"),
        BadCall("FP32 tails", "cp_zigzag_tail_exchange",
                replaced(local_kv_tail=lambda i: i["local_kv_tail"].float()), "local_kv_tail"),
        BadCall("a length per rank, not per segment", "cp_zigzag_tail_exchange",
                replaced(segment_lens=torch.tensor([3, 3], dtype=torch.int32)), "segment_lens"),
        BadCall("a gap in the chunk", "cp_zigzag_tail_exchange",
                replaced(segment_lens=torch.tensor([3, 0, 3, 0], dtype=torch.int32)), "segment_lens"),
    ),
    bindings=(
        Upstream("deepseek_v4_pro", none="V4-Pro has no context-parallel prefill"),
        # its golden writes the exchange of its own fixture (position_markers) whatever it is handed: judged there
        Upstream("deepseek_v4_flash_mtp", golden="prefill_cp_zigzag.py::golden_prefill_cp_zigzag_kv_tail_exchange",
                 entry="prefill_cp_zigzag.py::prefill_cp_zigzag_kv_tail_exchange_test"),
        Upstream("deepseek_v4_flash_dspark", none="dspark has no context-parallel prefill"),
    ),
)
