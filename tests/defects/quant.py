"""Seeded codec and publisher defects."""

from dataclasses import replace

import torch

from backends import torch_backend
from kernels import cache, quant

QUANTIZE = quant.mx_quantize


def _swapped_nibbles(x, rule_name):
    """Wrong: odd element in the low nibble."""
    q = QUANTIZE(x, rule_name)
    if quant.rule(rule_name).fmt != "mxfp4":
        return q
    p = q.payload
    return quant.MXTensor(((p & 0xF) << 4) | (p >> 4), q.scale, q.rule)


def _recode(x, rule_name, *, scale_fn=None, code_fn=None, amax_shift=0):
    """Re-encode ``x`` with a modified scale or E2M1 code function (the defects' shared skeleton)."""
    r = quant.rule(rule_name)
    q = QUANTIZE(x.roll(amax_shift, -1) if amax_shift else x, r)
    if amax_shift == 0 and scale_fn is None and code_fn is None:
        return q
    s = quant.scale_values(q)
    if scale_fn is not None:
        s = scale_fn(s, x, r)
        code = (torch.frexp(s)[1] - 1 + 127).clamp(0, 254).to(torch.uint8)
        scale = code.view(torch.float8_e8m0fnu) if r.scale_format == "e8m0" else s.to(torch.float8_e4m3fn)
    else:
        scale = q.scale
    g = x.float().unflatten(-1, (-1, r.group)) / s.unsqueeze(-1)
    if r.fmt == "mxfp8":
        payload = g.clamp(-448, 448).to(torch.float8_e4m3fn).flatten(-2)
    else:
        codes = (code_fn or (lambda v: quant.e2m1_encode(v, r.tie)))(g)
        payload = quant.pack_fp4(codes.flatten(-2))
    return quant.MXTensor(payload.contiguous(), scale.contiguous(), r.name)


def _round_half_up(x, rule_name):
    """Wrong: exact E2M1 midpoints round away from zero."""
    def code(v):
        mids = torch.tensor(quant.FP4_MIDPOINTS)
        mag = v.abs().clamp(max=6)
        c = (mag.unsqueeze(-1) >= mids).sum(-1)
        return (c | (torch.signbit(v).to(c.dtype) << 3)).to(torch.uint8)
    if quant.rule(rule_name).fmt != "mxfp4":
        return QUANTIZE(x, rule_name)
    return _recode(x, rule_name, code_fn=code)


def _scale_floor(x, rule_name):
    """Wrong: E8M0 scale by floor(log2) instead of ceil."""
    r = quant.rule(rule_name)
    if r.scale_format != "e8m0":
        return QUANTIZE(x, rule_name)

    def floor_scale(s, x, r):
        amax = x.float().unflatten(-1, (-1, r.group)).abs().amax(-1).clamp_min(r.amax_floor)
        raw = torch.maximum(amax / r.qmax, torch.tensor(r.scale_floor))
        return torch.ldexp(torch.ones_like(raw), torch.floor(torch.log2(raw)).to(torch.int32))
    return _recode(x, rule_name, scale_fn=floor_scale)


def _off_by_one_group(x, rule_name):
    """Wrong: group amax taken over elements shifted by one (group boundary off by one)."""
    return _recode(x, rule_name, amax_shift=1)


def _e4m3_clamp_240(x, rule_name):
    """Wrong: E4M3 scale clamped at 240 instead of 448."""
    r = quant.rule(rule_name)
    if r.scale_format != "e4m3":
        return QUANTIZE(x, rule_name)
    return QUANTIZE(x, replace(r, e4m3_scale_max=240.0))


def _publish_unmapped(c, values, slots):
    """Wrong: the first row with slot -1 is written to a spare (unmapped) physical row instead of skipped."""
    slots = torch.as_tensor(slots).clone()
    holes = (slots < 0).nonzero().flatten()
    if holes.numel():
        used = set(slots[slots >= 0].tolist())
        spare = next((r for r in range(c.rows) if r not in used), None)
        if spare is not None:
            slots[int(holes[0])] = spare
    return cache.cache_publish(c, values, slots)


def _e8m0_bias_128(x, rule_name):
    """Wrong: E8M0 scale codes biased by 128 instead of 127."""
    q = QUANTIZE(x, rule_name)
    if quant.rule(rule_name).scale_format != "e8m0":
        return q
    codes = q.scale.view(torch.uint8)
    bumped = torch.where(codes < 254, codes + 1, codes).to(torch.uint8)
    return quant.MXTensor(q.payload, bumped.view(torch.float8_e8m0fnu), q.rule)


def _dequant_half_scale(q, *, dtype=torch.float32):
    """Wrong: decoded values use half the group scale."""
    return quant.mx_dequantize(q, dtype=dtype) * 0.5


def _nan_to_zero(x, rule_name):
    """Wrong: NaN/Inf are replaced by finite values before quantization."""
    return QUANTIZE(torch.nan_to_num(x.float(), 0.0, 0.0, 0.0).to(x.dtype), rule_name)


def _signless_zero(x, rule_name):
    """Wrong: -0.0 loses its sign bit."""
    return QUANTIZE(torch.where(x == 0, torch.zeros_like(x), x), rule_name)


def _dequant_saturates(q, *, dtype=torch.float32):
    """Wrong: decoded overflow is clamped to the largest finite FP32 instead of +-inf."""
    return torch.nan_to_num(quant.mx_dequantize(q, dtype=dtype), nan=float("nan"), posinf=3.4e38, neginf=-3.4e38)


def _pad_to_group(x, rule_name):
    """Wrong: a width that is not a multiple of the group is zero-padded instead of rejected; other
    bad inputs are coerced (integer input cast, unknown rule falls back to 'index')."""
    r = quant.RULES.get(rule_name, quant.RULES["index"])
    x = x.float()
    pad = (-x.shape[-1]) % r.group
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return QUANTIZE(x, r.name)


def _read_fp32(c, *, dtype=torch.bfloat16):
    """Wrong: read returns FP32 (the spec: the whole cache decoded to the query dtype, BF16)."""
    return cache.cache_read(c, dtype=torch.float32)


def _lenient_slots(c, values, slots):
    """Wrong: duplicate and out-of-range slots are dropped silently; wrong widths truncated."""
    slots = torch.as_tensor(slots).clone()
    seen = set()
    for i, s in enumerate(slots.tolist()):
        if s >= c.rows or s in seen:
            slots[i] = -1
        elif s >= 0:
            seen.add(s)
    values = torch.nn.functional.pad(values, (0, max(0, c.layout.logical_width - values.shape[1])))
    return cache.cache_publish(c, values[:, : c.layout.logical_width], slots)


# registrations: each defect is the torch backend with one operator replaced
_base = torch_backend()
def _publishing(quantize):
    """A cache publish whose mapped rows are quantized by ``quantize`` (a defective codec on the device's
    publish path, as a golden replay of a cache tree sees it)."""
    def publish(c, values, slots):
        out = cache.cache_publish(c, values, slots)
        s = torch.as_tensor(slots).to(torch.long)
        live = s >= 0
        if bool(live.any()):
            q = quantize(values[live], c.layout.rule)
            out.payload.view(torch.uint8).reshape(c.rows, -1)[s[live]] = q.payload.view(torch.uint8)
            out.scale.view(torch.uint8).reshape(c.rows, -1)[s[live]] = q.scale.view(torch.uint8)
        return out
    return publish


def _host_exact_ceiling(x, rule_name):
    """Wrong (the rule before issue #23): the host and index rules take the exact power-of-two ceiling, not
    upstream's FP32 ceil(log2)."""
    exact = {"window_host": "window_host_exact", "index": "index_exact"}
    q = QUANTIZE(x, exact.get(quant.rule(rule_name).name, rule_name))
    return quant.MXTensor(q.payload, q.scale, quant.rule(rule_name).name)


SWAPPED_NIBBLES = _base.derive("defect:swapped-nibbles", mx_quantize=_swapped_nibbles)
ROUND_HALF_UP = _base.derive("defect:round-half-up", mx_quantize=_round_half_up)
SCALE_FLOOR = _base.derive("defect:scale-floor", mx_quantize=_scale_floor)
OFF_BY_ONE_GROUP = _base.derive("defect:off-by-one-group", mx_quantize=_off_by_one_group)
E4M3_CLAMP_240 = _base.derive("defect:e4m3-clamp-240", mx_quantize=_e4m3_clamp_240)
PUBLISH_UNMAPPED = _base.derive("defect:publish-unmapped", cache_publish=_publish_unmapped)
E8M0_BIAS_128 = _base.derive("defect:e8m0-bias-128", mx_quantize=_e8m0_bias_128)
DEQUANT_HALF_SCALE = _base.derive("defect:dequant-half-scale", mx_dequantize=_dequant_half_scale)
HOST_EXACT_CEILING = _base.derive("defect:host-exact-ceiling", mx_quantize=_host_exact_ceiling)
NAN_TO_ZERO = _base.derive("defect:nan-to-zero", mx_quantize=_nan_to_zero)
SIGNLESS_ZERO = _base.derive("defect:signless-zero", mx_quantize=_signless_zero)
DEQUANT_SATURATES = _base.derive("defect:dequant-saturates", mx_dequantize=_dequant_saturates)
PAD_TO_GROUP = _base.derive("defect:pad-to-group", mx_quantize=_pad_to_group)
READ_FP32 = _base.derive("defect:read-fp32", cache_read=_read_fp32)
LENIENT_SLOTS = _base.derive("defect:lenient-slots", cache_publish=_lenient_slots)
PUBLISH_SWAPPED_NIBBLES = _base.derive("defect:publish-swapped-nibbles", cache_publish=_publishing(_swapped_nibbles))
PUBLISH_E8M0_BIAS_128 = _base.derive("defect:publish-e8m0-bias-128", cache_publish=_publishing(_e8m0_bias_128))
