"""Seeded defects of the V4 rules (spec §8): realistic one-bug ports, each a backend built from the reference
with one operator replaced."""

from __future__ import annotations

import dataclasses

import torch

from backends import torch_backend
from kernels.v4 import decode_metadata as v4md

_base = torch_backend()


def _seq_major(starts, ori_table, cmp_tables, state_tables, *, config, commit_tokens=None):
    """Wrong: the MTP rows are interleaved seq-major (row s·B + b) instead of request-major (b·seq + s)."""
    md = v4md.v4_decode_metadata(starts, ori_table, cmp_tables, state_tables, config=config,
                                 commit_tokens=commit_tokens)
    batch, seq = md.kv_seq_lens.numel(), config.decode_seq
    order = torch.arange(batch * seq).reshape(batch, seq).T.reshape(-1)
    return dataclasses.replace(md, position_ids=md.position_ids[order])


def _hca_last(position_ids, kv_seq_lens, *, seq, limit, ratio=128):
    """Wrong: when more compressed positions are visible than the limit, HCA keeps the last ones."""
    out = v4md.hca_topk(position_ids, kv_seq_lens, seq=seq, limit=limit, ratio=ratio)
    pos = position_ids.to(torch.int64)
    visible = torch.minimum((pos + 1) // ratio, kv_seq_lens.to(torch.int64).repeat_interleave(seq) // ratio)
    shift = (visible - limit).clamp(min=0)
    return torch.where(out >= 0, out + shift[:, None].to(out.dtype), out)


MTP_ROWS_SEQ_MAJOR = _base.derive("defect:v4-mtp-rows-seq-major", v4_decode_metadata=_seq_major)
HCA_TOPK_LAST = _base.derive("defect:v4-hca-topk-last", hca_topk=_hca_last)


def _overlap_by_two(x, position_ids, token_to_req, state_block_table, state_pool, weights, *, ratio, overlap,
                    eps=1e-6):
    """Wrong: the ratio-4 window overlaps the previous window by 2 rows instead of a whole window of 4."""
    from kernels.v4 import compressor

    if not overlap:
        return compressor.v4_compressor(x, position_ids, token_to_req, state_block_table, state_pool, weights,
                                        ratio=ratio, overlap=overlap, eps=eps)
    out, closes, pool = compressor.v4_compressor(x, position_ids, token_to_req, state_block_table, state_pool,
                                                 weights, ratio=ratio, overlap=True, eps=eps)
    pages, page, width = pool.shape
    flat = pool.reshape(pages * page, width)
    d = weights.norm.shape[0]
    for t in closes.nonzero().flatten().tolist():
        p, b = int(position_ids[t]), int(token_to_req[t])
        rows = []
        for q in range(p - ratio - 1, p + 1):  # two previous rows, then the current window
            if q < 0:
                continue
            row = flat[int(state_block_table[b, q // page]) * page + q % page]
            lo = 0 if q <= p - ratio else d
            rows.append((row[lo:lo + d], row[2 * d + lo:2 * d + lo + d]))
        weight = torch.stack([s for _, s in rows]).softmax(0)
        pooled = (torch.stack([k for k, _ in rows]) * weight).sum(0)
        out[t] = pooled * torch.rsqrt(pooled.pow(2).mean() + eps) * weights.norm.float()
    return out, closes, pool


def _inner_to_main(x, position_ids, token_to_req, main_table, main_pool, main, inner_table, inner_pool, inner,
                   *, ratio=4, eps=1e-6, ops=None):
    """Wrong: CSA writes the indexer's inner state rows into the main pool (at the main compressor's slots)."""
    from kernels.v4 import compressor

    res = compressor.csa_compressors(x, position_ids, token_to_req, main_table, main_pool, main, inner_table,
                                     inner_pool, inner, ratio=ratio, eps=eps)
    pool = res["main_pool"].clone()
    pages, page, width = pool.shape
    flat = pool.reshape(pages * page, width)
    inner_rows = res["inner_pool"].reshape(-1, res["inner_pool"].shape[2])
    ipage = res["inner_pool"].shape[1]
    for t in range(x.shape[0]):
        p, b = int(position_ids[t]), int(token_to_req[t])
        src = inner_rows[int(inner_table[b, p // ipage]) * ipage + p % ipage]
        flat[int(main_table[b, p // page]) * page + p % page, :src.numel()] = src
    return {**res, "main_pool": pool}


_inner_to_main.composes_operators = True
def _ape_off_by_one(x, position_ids, token_to_req, state_block_table, state_pool, weights, **kw):
    """Wrong: the position bias row of pos + 1 (ape[(pos + 1) % ratio]) added to the score, not of pos."""
    from dataclasses import replace

    from kernels.v4 import compressor

    return compressor.v4_compressor(x, position_ids, token_to_req, state_block_table, state_pool,
                                    replace(weights, ape=torch.roll(weights.ape, -1, dims=0)), **kw)


OVERLAP_BY_TWO = _base.derive("defect:v4-ratio4-overlap-by-two", v4_compressor=_overlap_by_two)
APE_OFF_BY_ONE = _base.derive("defect:v4-compressor-ape-off-by-one", v4_compressor=_ape_off_by_one)
INNER_TO_MAIN = _base.derive("defect:v4-csa-inner-state-in-main", csa_compressors=_inner_to_main)


def _e_on_stream_zero(hidden, prev, enorm, hnorm, e_proj, e_scale, e_smooth, h_proj, h_scale, h_smooth, *, config):
    """Wrong: the embedding half is added to the first stream only."""
    from kernels.v4 import mtp

    out = mtp.mtp_projection(hidden, prev, enorm, hnorm, e_proj, e_scale, e_smooth, h_proj, h_scale, h_smooth,
                             config=config)
    only_h = mtp.mtp_projection(hidden, prev, enorm, hnorm, torch.zeros_like(e_proj), e_scale, e_smooth, h_proj,
                                h_scale, h_smooth, config=config)
    out[:, 1:] = only_h[:, 1:]
    return out


E_ON_STREAM_ZERO = _base.derive("defect:v4-mtp-embedding-on-stream-0", mtp_projection=_e_on_stream_zero)


def _reduced_across_dp(rank_inputs, *, kind, config, ops=None):
    """Wrong: the attention outputs are all-reduced across the DP ranks as if the ranks were a TP group."""
    from kernels.v4 import dp_attention

    outs = dp_attention.dp_attention(rank_inputs, kind=kind, config=config, ops=ops)
    key = "attn_out" if "attn_out" in outs[0] else "output"
    rows = min(o[key].shape[-2] for o in outs)
    total = sum(o[key][..., :rows, :].float() for o in outs).to(outs[0][key].dtype)
    for o in outs:
        o[key] = o[key].clone()
        o[key][..., :rows, :] = total
    return outs


_reduced_across_dp.composes_operators = True
REDUCED_ACROSS_DP = _base.derive("defect:v4-attention-reduced-across-dp", dp_attention=_reduced_across_dp)


def _rope_at_close(compressed, closes, position_ids, cmp_slot_mapping, cmp_pool, rope_cos, rope_sin, *, ratio):
    """Wrong: the compressed row is rotated at the closing position instead of the window's first position."""
    from kernels.v4 import compressor

    return compressor.v4_publish_compressed(compressed, closes, position_ids + ratio - 1, cmp_slot_mapping,
                                            cmp_pool, rope_cos, rope_sin, ratio=ratio)


ROPE_AT_CLOSE = _base.derive("defect:v4-compressed-rope-at-close", v4_publish_compressed=_rope_at_close)


def _scale_rounded_down(x):
    """Wrong: the power-of-two scale is rounded down (the row's largest element then passes 448)."""
    values = x.to(torch.bfloat16).float()
    amax = values.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, torch.exp2(torch.floor(torch.log2(amax.double() / 448.0))), 0.0).float()
    payload = torch.where(scale > 0, values / torch.where(scale > 0, scale, 1.0), values)
    return payload.to(torch.float8_e4m3fn), scale


SCALE_ROUNDED_DOWN = _base.derive("defect:v4-index-cache-scale-down", v4_index_cache_quant=_scale_rounded_down)


def _csa_bound_inclusive(path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed, position_ids,
                         attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, *, config, ops=None, **prefill):
    """Wrong: CSA keeps a raw slot up to and including (position + 1) // 4 (a row not yet written)."""
    from kernels.v4 import sparse_attention as sa

    if path == "CSA":
        raw = compressed[:, : config.index_topk].to(torch.int64)
        bound = ((position_ids.reshape(-1).to(torch.int64) + 1) // 4).unsqueeze(1)
        compressed, path = torch.where((raw >= 0) & (raw <= bound), raw, -1).to(torch.int32), "HCA"
    return sa.v4_attention(path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed, position_ids,
                           attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, config=config, **prefill)


CSA_BOUND_INCLUSIVE = _base.derive("defect:v4-csa-bound-inclusive", v4_attention=_csa_bound_inclusive)


def _slots_as_physical(q, ori_kv, window_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, *, seq,
                       key_tiles="columns"):
    """Wrong: the compressed slots are read as physical rows of the cmp pool (the request's table ignored)."""
    from kernels.v4 import sparse_attention as sa

    identity = torch.arange(cmp_block_table.shape[1], dtype=torch.int32).expand_as(cmp_block_table).contiguous()
    return sa.v4_sparse_attention(q, ori_kv, window_indices, cmp_kv, identity, cmp_indices, attn_sink, seq=seq,
                                  key_tiles=key_tiles)


CMP_SLOTS_PHYSICAL = _base.derive("defect:v4-cmp-slots-physical", v4_sparse_attention=_slots_as_physical)


def _one_pass(q, ori_kv, window_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, *, seq,
              key_tiles="columns"):
    """Wrong: V4.1's one-pass attention (no 128-key tiles, probabilities not rounded to BF16 for PV; any
    ``key_tiles``)."""
    from kernels.reference.attention import sparse_attention
    from kernels.v4 import sparse_attention as sa

    dim = q.shape[-1]
    rows = sa.paged_compressed_rows(cmp_indices, cmp_block_table, seq=seq, block_size=cmp_kv.shape[1])
    return sparse_attention(q.float(), ori_kv.reshape(-1, dim), window_indices, cmp_kv.reshape(-1, dim), rows,
                            attn_sink.float())


PROBS_UNROUNDED = _base.derive("defect:v4-attention-one-pass", v4_sparse_attention=_one_pass)


def _projection_variant(*, bf16_latent=False, per_token=False, forward=False):
    from kernels.reference.rope import rope_interleave
    from kernels.v4.mtp import quantize_rows_int8

    def project(o, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, *, config):
        t, h, d = o.shape
        g_n, lora, half = config.o_groups, config.o_lora_rank, config.qk_rope_head_dim // 2
        cos, sin = freqs_cos[:, :half].float().unsqueeze(1), freqs_sin[:, :half].float().unsqueeze(1)
        x = rope_interleave(o.float(), cos, sin, inverse=not forward).to(torch.bfloat16)
        lat = torch.einsum("tgk,gnk->tgn", x.reshape(t, g_n, -1).double(), wo_a.double()).float()
        if bf16_latent:
            lat = lat.to(torch.bfloat16).float()
        if per_token:
            codes, f = quantize_rows_int8(lat.reshape(t, -1), scale_max=127.0, amax_eps=1e-4)
            codes, f = codes.reshape(t, g_n, lora), f.unsqueeze(1).expand(t, g_n, 1)
        else:
            codes, f = quantize_rows_int8(lat, scale_max=127.0, amax_eps=1e-4)
        w = wo_b.to(torch.int64).reshape(-1, g_n, lora)
        out = torch.zeros(t, w.shape[0])
        for g in range(g_n):
            out = out + (codes[:, g].to(torch.int64) @ w[:, g].T).float() * f[:, g]
        return (out * wo_b_scale.float()).to(torch.bfloat16)

    return project


LATENT_ROUNDED_BF16 = _base.derive("defect:v4-latent-bf16", v4_output_projection=_projection_variant(bf16_latent=True))
ACT_SCALE_PER_TOKEN = _base.derive("defect:v4-int8-scale-per-token",
                                   v4_output_projection=_projection_variant(per_token=True))
FORWARD_ROPE = _base.derive("defect:v4-oproj-forward-rope", v4_output_projection=_projection_variant(forward=True))


def _indexer_variant(*, relu_after_sum=False, bound_from_position=False, offset_dropped=False, tail_nan=False,
                     by_position=False, hadamard_first=False):
    """A port of v4_indexer with one rule changed (see each defect below)."""
    from kernels.reference.rope import rope_interleave
    from kernels.v4 import indexer as ix
    from kernels.v4.mtp import quantize_rows_int8

    def run(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos, sin, hadamard, idx_kv_cache, idx_kv_scale,
            idx_block_table, position_ids, kv_seq_lens, *, offset, config):
        heads, dim, seq, bs = config.index_n_heads, config.index_head_dim, config.decode_seq, config.block_size
        t_n, width = qr.shape[0], ix.score_len(config)
        q = ((qr.long() @ wq_b.long()).float() * qr_scale.float()) * wq_b_scale.float()
        q = q.reshape(t_n, heads, dim)
        req = torch.arange(t_n) // seq
        if hadamard_first:
            q = (q.double() @ hadamard.double()).float()
        q = rope_interleave(q, cos.float()[req].unsqueeze(1), sin.float()[req].unsqueeze(1)).to(torch.bfloat16)
        q = q.float() if hadamard_first else (q.double() @ hadamard.double()).float()
        codes, q_scale = quantize_rows_int8(q, scale_max=127.0, amax_eps=1e-4)
        w = (x.double() @ weights_proj.double()).float().double() * dim**-0.5 * heads**-0.5
        pos = position_ids.long() + (0 if bound_from_position else 1)
        lens = kv_seq_lens.long().repeat_interleave(seq) // 4
        visible = torch.minimum(torch.minimum(lens, pos // 4), torch.tensor(width))
        keys, kscale = idx_kv_cache.reshape(-1, dim).long(), idx_kv_scale.reshape(-1).double()
        score = torch.full((t_n, width), float("nan") if tail_nan else ix.LOWEST)
        topk = torch.full((t_n, width), -1, dtype=torch.int32)
        for t in range(t_n):
            n = int(visible[t])
            if n <= 0:
                continue
            j = torch.arange(n)
            rows = idx_block_table[t // seq].long()[j // bs] * bs + j % bs
            d = (codes[t].long() @ keys[rows].T).double() * q_scale[t].double()
            per = (d * w[t].unsqueeze(1)).sum(0).clamp(min=0) if relu_after_sum else (d.clamp(min=0) * w[t].unsqueeze(1)).sum(0)
            score[t, :n] = (per * kscale[rows]).float()
            k = min(config.index_topk, n)
            pick = torch.sort(-score[t, :n].double(), stable=True).indices[:k]
            if by_position:
                pick = torch.sort(pick).values
            topk[t, :k] = (pick + (0 if offset_dropped else offset)).to(torch.int32)
        return {"score": score, "topk_idxs": topk}

    return run


RELU_AFTER_SUM = _base.derive("defect:v4-indexer-relu-after-sum", v4_indexer=_indexer_variant(relu_after_sum=True))
VISIBLE_FROM_POSITION = _base.derive("defect:v4-indexer-bound-pos-over-4",
                                     v4_indexer=_indexer_variant(bound_from_position=True))
OFFSET_DROPPED = _base.derive("defect:v4-indexer-no-offset", v4_indexer=_indexer_variant(offset_dropped=True))
# the row past the visible range left as an uninitialized device buffer may hold it (upstream's decode kernel does
# not write there; its comparator still wants every score finite)
TAIL_NAN = _base.derive("defect:v4-indexer-tail-nan", v4_indexer=_indexer_variant(tail_nan=True))
TOPK_BY_POSITION = _base.derive("defect:v4-indexer-topk-by-position", v4_indexer=_indexer_variant(by_position=True))
HADAMARD_BEFORE_ROPE = _base.derive("defect:v4-indexer-hadamard-first", v4_indexer=_indexer_variant(hadamard_first=True))


def _prefill_indexer_variant(*, rope_per_request=False, offset_added=False, padding_scored=False,
                             decode_width=False):
    """A port of v4_prefill_indexer with one rule changed (see each defect below)."""
    from kernels.v4 import indexer as ix
    from kernels.v4 import prefill_indexer as pix

    def run(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos, sin, hadamard, idx_kv_cache, idx_kv_scale,
            idx_block_table, position_ids, num_tokens, *, config, padding_rows="unscored"):
        t_n = qr.shape[0]
        width = ix.score_len(config) if decode_width else pix.score_cap(config)
        w = ix.head_weights(x, weights_proj, config=config)
        if rope_per_request:  # decode's rule: the request's row (its first position) for every row
            cos, sin = cos[:1].expand(t_n, -1), sin[:1].expand(t_n, -1)
        q_i8, q_scale = ix.index_query(qr, qr_scale, wq_b, wq_b_scale, cos, sin, hadamard, config=config)
        visible = torch.clamp((position_ids.long() + 1) // 4, max=width)
        if not padding_scored:
            visible[num_tokens:] = 0
        scores = ix.score_rows(q_i8, q_scale, w, idx_kv_cache, idx_kv_scale, [(idx_block_table, ())] * t_n,
                               visible, width=width, block_size=config.block_size)
        visible[num_tokens:] = 0
        topk = ix.v4_indexer_topk(scores, visible, topk=config.index_topk,
                                  offset=config.sliding_window if offset_added else 0)
        return {"score": scores, "topk_idxs": topk}

    return run


PREFILL_ROPE_PER_REQUEST = _base.derive("defect:v4-prefill-indexer-rope-per-request",
                                        v4_prefill_indexer=_prefill_indexer_variant(rope_per_request=True))
PREFILL_OFFSET_ADDED = _base.derive("defect:v4-prefill-indexer-offset-added",
                                    v4_prefill_indexer=_prefill_indexer_variant(offset_added=True))
PREFILL_PADDING_SCORED = _base.derive("defect:v4-prefill-indexer-padding-scored",
                                      v4_prefill_indexer=_prefill_indexer_variant(padding_scored=True))
PREFILL_DECODE_WIDTH = _base.derive("defect:v4-prefill-indexer-decode-width",
                                    v4_prefill_indexer=_prefill_indexer_variant(decode_width=True))


def _prefill_compressor_variant(*, padding_read=False, unpersisted_written=False, prev_zero_score=False,
                                rope_from_table=False, state_rule_ignored=False):
    """A port of v4_prefill_compressor with one rule changed (see each defect below)."""
    from kernels.v4 import compressor as c
    from kernels.v4 import prefill_compressor as pc

    def zero_score_compressor(x, position_ids, token_to_req, state_block_table, state_pool, weights, *, ratio,
                              overlap, eps=1e-6):
        """The decode compressor with the previous half before position 0 taken as kv 0, score 0."""
        d, w = weights.norm.shape[0], (2 if overlap else 1) * weights.norm.shape[0]
        pages, page, _ = state_pool.shape
        pool = state_pool.clone().reshape(pages * page, 2 * w)
        kv, score = c.project(x, weights.wkv), c.project(x, weights.wgate)
        out = torch.zeros(x.shape[0], d)
        closes = torch.zeros(x.shape[0], dtype=torch.bool)
        for t in range(x.shape[0]):
            p, b = int(position_ids[t]), int(token_to_req[t])
            pool[c._slot(state_block_table, b, p, page, pages)] = torch.cat((kv[t], score[t] + weights.ape[p % ratio]))
            if (p + 1) % ratio:
                continue
            rows_kv, rows_score = [], []
            for q in range(p - 2 * ratio + 1, p - ratio + 1):
                if not overlap:
                    break
                row = pool[c._slot(state_block_table, b, q, page, pages)] if q >= 0 else torch.zeros(2 * w)
                rows_kv.append(row[:d])
                rows_score.append(row[w:w + d])
            lo = d if overlap else 0
            for q in range(p - ratio + 1, p + 1):
                row = pool[c._slot(state_block_table, b, q, page, pages)]
                rows_kv.append(row[lo:lo + d])
                rows_score.append(row[w + lo:w + lo + d])
            pooled = (torch.stack(rows_kv) * torch.stack(rows_score).softmax(dim=0)).sum(dim=0)
            out[t] = pooled * torch.rsqrt(pooled.pow(2).mean() + eps) * weights.norm.float()
            closes[t] = True
        return out, closes, pool.reshape(pages, page, 2 * w)

    def run(x, position_ids, num_tokens, state_block_table, state_pool, weights, cmp_slot_mapping,
            state_slot_mapping, cmp_pool, rope_cos, rope_sin, *, ratio, rope_head_dim, eps=1e-6,
            unpersisted="pooled", ops=None):
        if state_rule_ignored:  # the named "state" rule taken as "pooled" (the chunk's projection pooled)
            unpersisted = "pooled"
        if padding_read:  # every row processed (num_tokens ignored)
            num_tokens = x.shape[0]
        if unpersisted_written:  # the decode rule: every row's state written at its home
            page = state_pool.shape[1]
            state_slot_mapping = torch.tensor([int(state_block_table[int(p) // page]) * page + int(p) % page
                                               for p in position_ids.tolist()])
        ops = {"v4_compressor": zero_score_compressor} if prev_zero_score else None
        if rope_from_table:  # the rotated width taken from the table (upstream's full-width freqs rotate 2x dims)
            rope_head_dim = 2 * rope_cos.shape[1]
        return pc.v4_prefill_compressor(x, position_ids, num_tokens, state_block_table, state_pool, weights,
                                        cmp_slot_mapping, state_slot_mapping, cmp_pool, rope_cos, rope_sin,
                                        ratio=ratio, rope_head_dim=rope_head_dim, eps=eps,
                                        unpersisted=unpersisted, ops=ops)

    return run


PREFILL_PADDING_COMPRESSED = _base.derive("defect:v4-prefill-compressor-padding-read",
                                          v4_prefill_compressor=_prefill_compressor_variant(padding_read=True))
PREFILL_UNPERSISTED_WRITTEN = _base.derive("defect:v4-prefill-compressor-unpersisted-written",
                                           v4_prefill_compressor=_prefill_compressor_variant(unpersisted_written=True))
PREV_HALF_ZERO_SCORE = _base.derive("defect:v4-prefill-compressor-prev-zero-score",
                                    v4_prefill_compressor=_prefill_compressor_variant(prev_zero_score=True))
PREFILL_STATE_RULE_IGNORED = _base.derive("defect:v4-prefill-compressor-state-rule-ignored",
                                          v4_prefill_compressor=_prefill_compressor_variant(state_rule_ignored=True))
PREFILL_ROPE_WIDTH_FROM_TABLE = _base.derive("defect:v4-prefill-rope-width-from-table",
                                             v4_prefill_compressor=_prefill_compressor_variant(rope_from_table=True))


def _txn_variant(*, epoch_ignored=False, range_ignored=False, no_overlay=False, commit_first=False):
    """A port of v4_compressor_txn with one rule changed (see each defect below)."""
    from kernels.reference.compressor import project
    from kernels.v4 import compressor_txn as ct

    def run(x, position_ids, state_page_ids, state_page_epochs, request_epochs, state_valid_ranges,
            state_slot_mapping, state_pool, weights, *, ratio, seq, eps=1e-6):
        overlap = ratio == 4
        d = weights.norm.shape[0]
        w = (2 if overlap else 1) * d
        pages, page, _ = state_pool.shape
        rows = ct.ring_rows(ratio)
        flat = state_pool.reshape(pages * page, 2 * w).clone()
        own = torch.cat((project(x, weights.wkv), project(x, weights.wgate) + weights.ape[position_ids.long() % ratio]), 1)
        if commit_first:  # the decode ring's order: write, then read
            for t in range(x.shape[0]):
                if int(state_slot_mapping[t]) >= 0:
                    flat[int(state_slot_mapping[t])] = own[t]

        def held(b, q):
            k = (q % rows) // page
            pid = int(state_page_ids[b, k])
            ok = pid >= 0 and (epoch_ignored or int(state_page_epochs[b, k]) == int(request_epochs[b]))
            if not ok or not (range_ignored or int(state_valid_ranges[b, 0]) <= q < int(state_valid_ranges[b, 1])):
                return None
            return flat[pid * page + (q % rows) % page]

        out = torch.zeros(x.shape[0], d)
        closes = torch.zeros(x.shape[0], dtype=torch.bool)
        for t in range(x.shape[0]):
            p, b = int(position_ids[t]), t // seq
            if (p + 1) % ratio:
                continue
            first = int(position_ids[b * seq])
            window = ([(q, 0) for q in range(p - 2 * ratio + 1, p - ratio + 1)] if overlap else []) + \
                [(q, d if overlap else 0) for q in range(p - ratio + 1, p + 1)]
            vals, scores = [], []
            for q, lo in window:
                if first <= q <= p and not (no_overlay or commit_first):
                    row = own[b * seq + q - first]
                else:
                    row = held(b, q) if q >= 0 else None
                    if row is None and first <= q <= p and commit_first:
                        row = own[b * seq + q - first]
                vals.append(row[lo:lo + d] if row is not None else torch.zeros(d))
                scores.append(row[w + lo:w + lo + d] if row is not None else torch.full((d,), float("-inf")))
            pooled = (torch.stack(vals) * torch.stack(scores).softmax(0)).sum(0)
            out[t] = pooled * torch.rsqrt(pooled.pow(2).mean() + eps) * weights.norm.float()
            closes[t] = True
        if not commit_first:
            for t in range(x.shape[0]):
                if int(state_slot_mapping[t]) >= 0:
                    flat[int(state_slot_mapping[t])] = own[t]
        return out, closes, flat.reshape(pages, page, 2 * w)

    return run


TXN_EPOCH_IGNORED = _base.derive("defect:v4-txn-epoch-ignored", v4_compressor_txn=_txn_variant(epoch_ignored=True))
TXN_RANGE_IGNORED = _base.derive("defect:v4-txn-range-ignored", v4_compressor_txn=_txn_variant(range_ignored=True))
TXN_NO_OVERLAY = _base.derive("defect:v4-txn-no-overlay", v4_compressor_txn=_txn_variant(no_overlay=True))
TXN_COMMIT_FIRST = _base.derive("defect:v4-txn-commit-first", v4_compressor_txn=_txn_variant(commit_first=True))


def _gate_variant(*, bias_in_weights=False, hash_by_score=False, scale_reciprocal=False, naive_softplus=False,
                  padding_routed=False):
    """A port of v4_gate with one rule changed (see each defect below)."""
    from kernels.v4 import gate as vg

    def run(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, *, config,
            dequant_factor="product"):  # the named rule of v4_gate a tree (upstream's) may be judged by
        vg._check(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, config)
        tokens, d = x_mixed.shape
        n = tokens if padding_routed else num_tokens
        k = config.num_experts_per_tok
        every = x_mixed.float() * norm_w.float()  # upstream codes every row of the tile
        amax_all = every.abs().amax(-1, keepdim=True).clamp_min(1e-4)
        codes_all = torch.clamp(torch.round(every * (torch.full_like(amax_all, 127.0) / amax_all)), -127, 127)
        x = x_mixed[:n].float()
        xg = x * norm_w.float()
        inv_rms = torch.rsqrt((x.double().pow(2).sum(-1, keepdim=True) / d).float() + config.rms_norm_eps)
        amax = xg.abs().amax(-1, keepdim=True).clamp_min(1e-4)
        quant = torch.full_like(amax, 127.0) / amax
        reciprocal = scale_reciprocal or dequant_factor == "reciprocal"
        factor = torch.reciprocal(quant) if reciprocal else amax * torch.tensor(1 / 127, dtype=torch.float32)
        logits = inv_rms * (xg.double() @ gate_w.double().T).float()
        if naive_softplus:
            scores = torch.log(1 + torch.exp(logits)).sqrt()
        else:
            scores = (logits.clamp(min=0) + torch.log1p(torch.exp(-logits.abs()))).sqrt()
        biased = scores + gate_bias.float()
        if layer_id < config.num_hash_layers and not hash_by_score:
            routes = tid2eid[input_ids[:n].long()].long()
        else:
            routes = torch.argsort(-biased, dim=-1, stable=True)[:, :k]
        picked = torch.gather(biased if bias_in_weights else scores, 1, routes)
        out = {"x_norm_i8": torch.zeros(tokens, d, dtype=torch.int8), "x_norm_scale": torch.zeros(tokens, 1),
               "indices": torch.zeros(tokens, k, dtype=torch.int32), "weights": torch.zeros(tokens, k)}
        out["x_norm_i8"][:] = codes_all.to(torch.int8)
        out["x_norm_scale"][:n] = factor * inv_rms
        out["indices"][:n] = routes.to(torch.int32)
        out["weights"][:n] = picked / picked.sum(-1, keepdim=True) * config.routed_scaling_factor
        return out

    return run


GATE_BIAS_IN_WEIGHTS = _base.derive("defect:v4-gate-bias-in-weights", v4_gate=_gate_variant(bias_in_weights=True))
GATE_HASH_BY_SCORE = _base.derive("defect:v4-gate-hash-by-score", v4_gate=_gate_variant(hash_by_score=True))
GATE_SCALE_RECIPROCAL = _base.derive("defect:v4-gate-scale-reciprocal", v4_gate=_gate_variant(scale_reciprocal=True))
GATE_NAIVE_SOFTPLUS = _base.derive("defect:v4-gate-naive-softplus", v4_gate=_gate_variant(naive_softplus=True))
def _gate_padding_codes_zero(*args, **kwargs):
    """Wrong (the rule before issue #23): the padding rows' x_norm_i8 zeroed inside the gate's active tile."""
    from kernels.v4.gate import v4_gate

    return v4_gate(*args, **{**kwargs, "padding_codes": "zero"})


GATE_PADDING_CODES_ZERO = _base.derive("defect:v4-gate-padding-codes-zero", v4_gate=_gate_padding_codes_zero)
GATE_PADDING_ROUTED = _base.derive("defect:v4-gate-padding-routed", v4_gate=_gate_variant(padding_routed=True))


def _expert_variant(*, up_open_below=False, no_route_weight=False, h_not_recoded=False):
    """A port of v4_expert with one rule changed (see each defect below)."""
    from kernels.v4.mtp import int8_matmul

    def run(x_i8, x_scale, route_weight, weights, *, config):
        lim = config.swiglu_limit
        gate = int8_matmul(x_i8, weights.w1) * x_scale.float() * weights.w1_scale.float()
        up = int8_matmul(x_i8, weights.w3) * x_scale.float() * weights.w3_scale.float()
        gate = gate.clamp(max=lim)
        up = up.clamp(max=lim) if up_open_below else up.clamp(-lim, lim)
        h = (gate * torch.reciprocal(torch.exp(-gate) + 1.0)) * up
        if h_not_recoded:
            codes, row = h, torch.ones(h.shape[0], 1)
        else:
            amax = h.abs().amax(-1, keepdim=True).clamp_min(1e-4)
            quant = torch.full_like(amax, 127.0) / amax
            codes, row = torch.round(h * quant), torch.reciprocal(quant)
        if route_weight is not None and not no_route_weight:
            row = row * route_weight.float().reshape(-1, 1)
        y = (codes.double() @ weights.w2.double().T).float() * row * weights.w2_scale.float()
        return y.to(torch.bfloat16)

    return run


def _combine_in_bf16(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, routed, shared, *,
                     config, ops=None):
    """Wrong: the combine accumulates in BF16 (each partial sum rounded)."""
    from kernels.v4 import gate as vg
    from kernels.v4 import moe as vm

    g = vg.v4_gate(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, config=config)
    out = torch.zeros_like(x_mixed)
    n = num_tokens
    if n:
        x_i8, xs = g["x_norm_i8"][:n], g["x_norm_scale"][:n]
        acc = vm.v4_expert(x_i8, xs, None, shared, config=config)
        for k in range(config.num_experts_per_tok):
            rows = torch.cat([vm.v4_expert(x_i8[t:t + 1], xs[t:t + 1], g["weights"][t:t + 1, k],
                                           routed[int(g["indices"][t, k])], config=config) for t in range(n)])
            acc = (acc.float() + rows.float()).to(torch.bfloat16)
        out[:n] = acc
    return {"ffn_out": out, "indices": g["indices"], "weights": g["weights"]}


EXPERT_UP_OPEN_BELOW = _base.derive("defect:v4-expert-up-open-below", v4_expert=_expert_variant(up_open_below=True))
EXPERT_NO_ROUTE_WEIGHT = _base.derive("defect:v4-expert-no-route-weight",
                                      v4_expert=_expert_variant(no_route_weight=True))
EXPERT_H_NOT_RECODED = _base.derive("defect:v4-expert-h-not-recoded", v4_expert=_expert_variant(h_not_recoded=True))
COMBINE_IN_BF16 = _base.derive("defect:v4-moe-combine-bf16", v4_moe=_combine_in_bf16)


def _stage_prenormed(x_hc, hc_fn, hc_scale, hc_base, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid,
                     input_ids, routed, shared, *, config, ops=None):
    """Wrong: the collapsed row is RMS-normalised before the router (the attention stage's pattern), which
    normalises it again."""
    from kernels.reference import lm_head, mhc
    from kernels.v4 import moe as vm

    mixes = mhc.hc_mixes(x_hc, hc_fn, hc_scale, hc_base, config=config)  # every row (padding rows' residual)
    x = lm_head.final_norm(mhc.hc_pre(x_hc, mixes.pre), norm_w, config=config)
    out = vm.v4_moe(x, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, routed, shared,
                    config=config)
    return {"x_out": mhc.hc_post(out["ffn_out"], x_hc, mixes.post, mixes.residual), **out}


MOE_STAGE_PRENORMED = _base.derive("defect:v4-moe-stage-prenormed", v4_moe_stage=_stage_prenormed)


def _stage_padding_zero(*args, **kwargs):
    """Wrong (this project's former rule): the stage's mixes are 0 from num_tokens on, so padding rows of x_out
    are 0 instead of their streams' residual mix."""
    from kernels.v4.moe import v4_moe_stage

    return v4_moe_stage(*args, **{**kwargs, "padding_rows": "zero"})


MOE_STAGE_PADDING_ZERO = _base.derive("defect:v4-moe-stage-padding-zero", v4_moe_stage=_stage_padding_zero)


def _head_mix_no_eps(x_hc, fn, scale, base, *, config):
    """Wrong: the head's weights without the + hc_eps."""
    from kernels.v4 import mtp_layer as ml

    return ml.v4_head_mix(x_hc, fn, scale, base, config=config) - config.hc_eps


def _mtp_layer_variant(*, next_from_attention=False, head_unnormed=False):
    """A port of v4_mtp_layer with one rule changed (see each defect below)."""
    from kernels.reference import lm_head, mhc
    from kernels.v4 import attention_stage as ast
    from kernels.v4 import moe as vm
    from kernels.v4 import mtp
    from kernels.v4 import mtp_layer as ml

    def run(hidden, prev, projection, attention, moe, head, *, config, ops=None):
        x = mtp.mtp_projection(hidden, prev, **projection, config=config)
        att = ast.v4_attention_stage("SWA", x, **attention, config=config)
        out = vm.v4_moe_stage(att["x_out"], **moe, layer_id=config.num_hidden_layers, config=config)
        pre = ml.v4_head_mix(out["x_out"], head["fn"], head["scale"], head["base"], config=config)
        y = mhc.hc_head(out["x_out"], pre)
        y = y if head_unnormed else lm_head.final_norm(y, head["norm_w"], config=config)
        nxt = att["x_out"] if next_from_attention else out["x_out"]
        return {"hidden_out": y, "next_pre_hc_hidden": nxt, "kv_cache": att["kv_cache"]}

    return run


HEAD_MIX_NO_EPS = _base.derive("defect:v4-head-mix-no-eps", v4_head_mix=_head_mix_no_eps)
MTP_NEXT_FROM_ATTENTION = _base.derive("defect:v4-mtp-next-from-attention",
                                       v4_mtp_layer=_mtp_layer_variant(next_from_attention=True))
MTP_HEAD_UNNORMED = _base.derive("defect:v4-mtp-head-unnormed", v4_mtp_layer=_mtp_layer_variant(head_unnormed=True))


def _mtp_head_mix_over_batch(hidden, prev, projection, attention, moe, head, *, config, ops=None):
    """Wrong: the head's collapse weights averaged over the batch's rows (one row's input moves every row)."""
    from kernels.v4 import mtp_layer as ml

    def mixed(x_hc, fn, scale, base, *, config):
        pre = ml.v4_head_mix(x_hc, fn, scale, base, config=config)
        return pre.mean(0, keepdim=True).expand_as(pre).contiguous()

    return ml.v4_mtp_layer(hidden, prev, projection, attention, moe, head, config=config,
                           ops={**(ops or {}), "v4_head_mix": mixed})


MTP_HEAD_MIX_OVER_BATCH = _base.derive("defect:v4-mtp-head-mix-over-batch", v4_mtp_layer=_mtp_head_mix_over_batch)


def _keys_padding_read(x, position_ids, num_tokens, state_block_table, state_pool, weights, idx_slot_mapping,
                       state_slot_mapping, idx_kv_cache, idx_kv_scale, rope_cos, rope_sin, hadamard, *, rope_head_dim,
                       eps=1e-6, ops=None):
    """Wrong: the index-key write processes every row of the chunk (num_tokens ignored)."""
    from kernels.v4 import prefill_compressor as pc

    return pc.v4_prefill_index_keys(x, position_ids, x.shape[0], state_block_table, state_pool, weights,
                                    idx_slot_mapping, state_slot_mapping, idx_kv_cache, idx_kv_scale, rope_cos, rope_sin,
                                    hadamard, rope_head_dim=rope_head_dim, eps=eps)


PREFILL_KEYS_PADDING_READ = _base.derive("defect:v4-prefill-keys-padding-read", v4_prefill_index_keys=_keys_padding_read)


def _ep_variant(*, token_major=False, route_shifted=False):
    """A port of v4_moe_ep with one rule changed (see each defect below)."""
    from kernels.v4 import moe as vm

    def run(gates, num_tokens, routed, shared, *, ep, config, ops=None):
        n_local, k = config.n_routed_experts // ep, config.num_experts_per_tok
        tokens, d = gates[0]["x_norm_i8"].shape
        sent = list(num_tokens)
        order = [(s, t) for t in range(tokens) for s in range(ep)] if token_major else \
            [(s, t) for s in range(ep) for t in range(tokens)]
        send = torch.zeros(ep, ep, n_local, dtype=torch.int32)
        lanes = [[[] for _ in range(n_local)] for _ in range(ep)]
        for s, t in order:
            if t >= sent[s]:
                continue
            for j in range(k):
                e = int(gates[s]["indices"][t, j])
                lanes[e // n_local][e % n_local].append((s, t, j))
                send[s, e // n_local, e % n_local] += 1
        back, rxs, rys, counts = {}, [], [], []
        for dst in range(ep):
            rx = torch.zeros(n_local, ep * tokens, d, dtype=torch.int8)
            ry = torch.zeros(n_local, ep * tokens, d, dtype=torch.bfloat16)
            for loc in range(n_local):
                slots = lanes[dst][loc]
                if slots:
                    rows = torch.stack([gates[s]["x_norm_i8"][t] for s, t, _ in slots])
                    y = vm.v4_expert(rows, torch.stack([gates[s]["x_norm_scale"][t] for s, t, _ in slots]),
                                     torch.stack([gates[s]["weights"][t, j] for s, t, j in slots]),
                                     routed[dst * n_local + loc], config=config)
                    rx[loc, :len(slots)], ry[loc, :len(slots)] = rows, y
                    back.update(zip(slots, y, strict=True))
            rxs.append(rx)
            rys.append(ry)
            counts.append(torch.tensor([len(x) for x in lanes[dst]], dtype=torch.int32))
        outs = []
        for src in range(ep):
            out = torch.zeros(tokens, d, dtype=torch.bfloat16)
            n = num_tokens[src]
            if n:
                acc = vm.v4_expert(gates[src]["x_norm_i8"][:n], gates[src]["x_norm_scale"][:n], None, shared,
                                   config=config).float()
                for j in range(k):  # route_shifted: each token takes the next token's route j
                    acc = acc + torch.stack([back[(src, (t + 1) % n if route_shifted else t, j)]
                                             for t in range(n)]).float()
                out[:n] = acc.to(torch.bfloat16)
            outs.append(out)
        return {"ffn_out": outs, "send_counts": send, "recv_counts": counts, "recv_x": rxs, "recv_y": rys}

    return run


EP_LANES_TOKEN_MAJOR = _base.derive("defect:v4-ep-lanes-token-major", v4_moe_ep=_ep_variant(token_major=True))
EP_COMBINE_ROUTE_SHIFTED = _base.derive("defect:v4-ep-combine-route-shifted", v4_moe_ep=_ep_variant(route_shifted=True))


def _padding_attended(path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed, position_ids, attn_sink,
                      freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, *, config, seq=None, num_tokens=None, ops=None):
    """Wrong: the padding rows of a prefill chunk are attended like real rows (num_tokens ignored)."""
    from kernels.v4 import sparse_attention as sa

    return sa.v4_attention(path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed, position_ids,
                           attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, config=config, seq=seq)


PADDING_ROWS_ATTENDED = _base.derive("defect:v4-prefill-padding-attended", v4_attention=_padding_attended)


def _bf16_before_rope(compressed, closes, position_ids, cmp_slot_mapping, cmp_pool, rope_cos, rope_sin, *, ratio):
    """Wrong: the compressed row is rounded to BF16 before its rotation (two roundings instead of one)."""
    from kernels.v4 import compressor

    return compressor.v4_publish_compressed(compressed.to(torch.bfloat16).float(), closes, position_ids,
                                            cmp_slot_mapping, cmp_pool, rope_cos, rope_sin, ratio=ratio)


BF16_BEFORE_ROPE = _base.derive("defect:v4-compressed-bf16-before-rope", v4_publish_compressed=_bf16_before_rope)


def _key_variant(*, divided=False, hadamard_first=False, unrounded=False):
    """A port of v4_publish_index_keys with one step changed (see each defect below)."""
    from kernels.reference.rope import rope_interleave

    def publish(index_key, closes, position_ids, idx_slot_mapping, idx_kv_cache, idx_kv_scale, rope_cos, rope_sin,
                hadamard, *, ratio=4):
        d = index_key.shape[1]
        cache, scale = idx_kv_cache.clone(), idx_kv_scale.clone()
        flat, flat_scale = cache.reshape(-1, d), scale.reshape(-1)
        for t in closes.nonzero().flatten().tolist():
            slot = int(idx_slot_mapping[t])
            if slot < 0:
                continue
            start = int(position_ids[t]) - ratio + 1
            row = index_key[t:t + 1]
            if hadamard_first:
                row = (row.double() @ hadamard.double()).float()
            row = rope_interleave(row, rope_cos[start:start + 1].float(), rope_sin[start:start + 1].float())
            if not hadamard_first:
                row = row if unrounded else row.to(torch.bfloat16).float()
                row = (row.double() @ hadamard.double()).float()
            row = row.to(torch.bfloat16).float()
            amax = row.abs().amax().clamp_min(1e-4)
            quant = torch.tensor(127.0) / amax
            flat[slot] = torch.round(row[0] * quant).to(torch.int8)
            flat_scale[slot] = amax / 127.0 if divided else 1.0 / quant
        return cache, scale

    return publish


KEY_SCALE_DIVIDED = _base.derive("defect:v4-index-key-scale-amax-over-127",
                                 v4_publish_index_keys=_key_variant(divided=True))
KEY_HADAMARD_BEFORE_ROPE = _base.derive("defect:v4-index-key-hadamard-first",
                                        v4_publish_index_keys=_key_variant(hadamard_first=True))
KEY_UNROUNDED_BEFORE_HADAMARD = _base.derive("defect:v4-index-key-no-bf16-before-hadamard",
                                             v4_publish_index_keys=_key_variant(unrounded=True))


def _qkv_variant(*, q_from_fp32=False, norm_across_heads=False, gamma_after_rope=False):
    """A port of v4_qkv_proj_rope with one rule changed (see each defect below)."""
    from kernels.v4 import qkv_proj as qp

    def run(x, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq, gamma_ckv, *, config):
        out = qp.v4_qkv_proj_rope(x, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq, gamma_ckv,
                                  config=config)
        h, d, rope, eps = config.num_attention_heads, config.head_dim, config.qk_rope_head_dim, config.rms_norm_eps
        cos, sin = rope_cos[:, : rope // 2].float(), rope_sin[:, : rope // 2].float()
        if q_from_fp32 or norm_across_heads:
            if q_from_fp32:
                qr = (x.double() @ wq_a.double()).float()
                normed = qr * qp._rsqrt_mean_sq(qr, eps) * gamma_cq.float()
                q = ((normed.double() @ wq_b.double()) * wq_b_scale.double()).float().reshape(-1, h, d)
                inv = qp._rsqrt_mean_sq(q, eps)
            else:
                q = ((out["qr"].long() @ wq_b.long()).float() * out["qr_scale"] * wq_b_scale.float()).reshape(-1, h, d)
                inv = qp._rsqrt_mean_sq(q.reshape(q.shape[0], 1, -1), eps)
            out["q"] = torch.cat(((q[..., : d - rope] * inv).to(torch.bfloat16),
                                  qp._rotate(q[..., d - rope:] * inv, cos[:, None], sin[:, None]).to(torch.bfloat16)),
                                 dim=-1)
        if gamma_after_rope:
            kv = (x.double() @ wkv.double()).float()
            n = kv * qp._rsqrt_mean_sq(kv, eps)
            g = gamma_ckv.float()
            out["kv"] = torch.cat(((n[:, : d - rope] * g[: d - rope]).to(torch.bfloat16),
                                   (qp._rotate(n[:, d - rope:], cos, sin) * g[d - rope:]).to(torch.bfloat16)), dim=-1)
        return out

    return run


Q_FROM_FP32_QR = _base.derive("defect:v4-q-from-fp32-qr", v4_qkv_proj_rope=_qkv_variant(q_from_fp32=True))
Q_NORM_ACROSS_HEADS = _base.derive("defect:v4-q-norm-across-heads", v4_qkv_proj_rope=_qkv_variant(norm_across_heads=True))
KV_GAMMA_AFTER_ROPE = _base.derive("defect:v4-kv-gamma-after-rope", v4_qkv_proj_rope=_qkv_variant(gamma_after_rope=True))


def _stage_variant(*, read_before_write=False, skip_norm=False):
    """A port of v4_attention_stage with one step changed (see each defect below)."""
    from kernels.v4 import attention_stage as st

    def run(path, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, *args, config, ops=None, **kw):
        ops = dict(ops or {})
        if skip_norm:
            ops["final_norm"] = lambda x, w, *, config: x
        if read_before_write:
            from kernels.v4.sparse_attention import v4_attention

            names = ("wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq", "gamma_ckv", "freqs_cos", "freqs_sin",
                     "kv_cache")
            kv_cache = dict(zip(names, args, strict=False)).get("kv_cache", kw.get("kv_cache"))
            original = kv_cache.clone()

            def stale(path_, q, cache, *rest, config, **chunk):  # chunk: the prefill form's seq and num_tokens
                return v4_attention(path_, q, original, *rest, config=config, **chunk)

            ops["v4_attention"] = stale
        return st.v4_attention_stage(path, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, *args, config=config,
                                     ops=ops, **kw)

    run.composes_operators = True
    return run


READ_BEFORE_WRITE = _base.derive("defect:v4-stage-read-before-write",
                                 v4_attention_stage=_stage_variant(read_before_write=True))
ATTN_NORM_SKIPPED = _base.derive("defect:v4-stage-no-attn-norm", v4_attention_stage=_stage_variant(skip_norm=True))


def _window_without_self(position_ids, block_table, num_tokens, *, config):
    """Wrong: the prefill window starts one position early and stops before the row's own position
    (key_start = pos - min(window, pos))."""
    out = v4md.v4_prefill_swa_indices(position_ids.clamp(min=1) - 1, block_table, num_tokens, config=config)
    out[:num_tokens][position_ids[:num_tokens] == 0] = -1  # position 0 sees nothing before it
    return out


def _prefill_stage_variant(*, padding_writes=False, no_zero_tail=False):
    """A port of v4_attention_stage's prefill form with one rule changed (see each defect below)."""
    from kernels.v4 import attention_stage as ast

    def run(path, x_hc, *args, num_tokens=None, config, ops=None, **kw):
        if num_tokens is None:
            return ast.v4_attention_stage(path, x_hc, *args, config=config, ops=ops, **kw)
        out = ast.v4_attention_stage(path, x_hc, *args, num_tokens=num_tokens, config=config, ops=ops, **kw)
        if padding_writes:  # every row's kv row written, the padding rows' too
            full = ast.v4_attention_stage(path, x_hc, *args, num_tokens=x_hc.shape[0], config=config, ops=ops, **kw)
            out = {**out, "kv_cache": full["kv_cache"]}
        if no_zero_tail:  # the padding rows keep hc_post's output (the residual streams)
            full = ast.v4_attention_stage(path, x_hc, *args, config=config, ops=ops, **kw)
            x_out = out["x_out"].clone()
            x_out[num_tokens:] = full["x_out"][num_tokens:]
            out = {**out, "x_out": x_out}
        return out

    run.composes_operators = True
    return run


PREFILL_WINDOW_WITHOUT_SELF = _base.derive("defect:v4-prefill-window-without-self",
                                           v4_prefill_swa_indices=_window_without_self)
PREFILL_PADDING_KV_WRITTEN = _base.derive("defect:v4-prefill-padding-kv-written",
                                          v4_attention_stage=_prefill_stage_variant(padding_writes=True))
PREFILL_STAGE_NO_ZERO_TAIL = _base.derive("defect:v4-prefill-stage-no-zero-tail",
                                          v4_attention_stage=_prefill_stage_variant(no_zero_tail=True))


def _prefill_mtp_variant(*, compressed_profile=False, all_rows_real=False):
    """A port of v4_prefill_mtp_layer with one rule changed (see each defect below)."""
    from kernels.v4 import attention_stage as ast
    from kernels.v4 import mtp_layer as ml

    def every_row_real(path, x_hc, *args, num_tokens=None, config, **kw):
        return ast.v4_attention_stage(path, x_hc, *args, num_tokens=x_hc.shape[0], config=config, **kw)

    def run(hidden, prev, projection, attention, moe, head, num_tokens, *, config, ops=None):
        a = dict(attention)
        if compressed_profile:  # the compressors' profile 1 in place of the sliding-window profile 0
            a["freqs_cos"], a["freqs_sin"] = a["freqs_cos"].flip(0), a["freqs_sin"].flip(0)
        # all_rows_real: the SWA stage is told every row is real (the MoE stage still gets num_tokens)
        return ml.v4_prefill_mtp_layer(hidden, prev, projection, a, moe, head, num_tokens, config=config,
                                       ops={"v4_attention_stage": every_row_real} if all_rows_real else None)

    return run


PREFILL_MTP_COMPRESSED_PROFILE = _base.derive("defect:v4-prefill-mtp-compressed-profile",
                                              v4_prefill_mtp_layer=_prefill_mtp_variant(compressed_profile=True))
PREFILL_MTP_ALL_ROWS_REAL = _base.derive("defect:v4-prefill-mtp-all-rows-real",
                                         v4_prefill_mtp_layer=_prefill_mtp_variant(all_rows_real=True))


def _events_variant(*, request_order=False, missing_unrotated=False):
    """A port of v4_publish_events with one rule changed (see each defect below)."""
    from kernels.v4 import compressor_txn as ct

    def run(compressed, closes, cmp_slot_mapping, cmp_pool, request_event_indices, event_cos, event_sin, *, seq,
            no_event="skip"):
        events = request_event_indices.clone()
        if request_order:  # the k-th closing request takes the k-th event, whatever it names
            closing = [b for b in range(events.numel()) if bool(closes[b * seq:(b + 1) * seq].any())]
            for k, b in enumerate(closing):
                events[b] = k
        pool = ct.v4_publish_events(compressed, closes, cmp_slot_mapping, cmp_pool, events, event_cos, event_sin,
                                    seq=seq, no_event=no_event)
        if missing_unrotated:  # a request without an event still writes its row, unrotated
            flat = pool.reshape(-1, compressed.shape[1])
            for b in (events < 0).nonzero().flatten().tolist():
                rows = closes[b * seq:(b + 1) * seq].nonzero().flatten().tolist()
                if rows and int(cmp_slot_mapping[b * seq + rows[0]]) >= 0:
                    flat[int(cmp_slot_mapping[b * seq + rows[0]])] = compressed[b * seq + rows[0]].to(pool.dtype)
        return pool

    return run


EVENTS_IN_REQUEST_ORDER = _base.derive("defect:v4-events-in-request-order",
                                       v4_publish_events=_events_variant(request_order=True))
EVENT_MISSING_WRITTEN = _base.derive("defect:v4-event-missing-written",
                                     v4_publish_events=_events_variant(missing_unrotated=True))
