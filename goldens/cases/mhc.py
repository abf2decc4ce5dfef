"""Golden cases of mHC around one sublayer: the mixes, the collapse, the expansion and the head. Spec: §1."""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors
from kernels.config import FLASH_TINY


def _mhc_build(seed: int, wiring: str) -> Tensors:
    g = torch.Generator().manual_seed(seed)
    hc, dim = FLASH_TINY.hc_mult, FLASH_TINY.hidden_size
    mix = (2 + hc) * hc
    tokens = 7
    x = torch.randn(tokens, hc, dim, generator=g)
    x[1] *= 40.0  # a large row: the inverse RMS, not the magnitude, sets the logits
    x[2, :, ::2] = 0.0  # a sparse row
    return {"x_hc": x, "function": torch.randn(mix, hc * dim, generator=g) / (hc * dim) ** 0.5,
            "scale": torch.randn(3, generator=g), "base": torch.randn(mix, generator=g),
            "sublayer": torch.randn(tokens, dim, generator=g).to(torch.bfloat16),
            "num_tokens": torch.tensor(5, dtype=torch.int32)}


def _mhc_call(ops, inputs: Tensors) -> Tensors:
    m = ops("hc_mixes")(inputs["x_hc"], inputs["function"], inputs["scale"], inputs["base"],
                        num_tokens=int(inputs["num_tokens"]), config=FLASH_TINY)
    x = inputs["x_hc"]
    return {"pre": m.pre, "post": m.post, "residual": m.residual, "collapsed": ops("hc_pre")(x, m.pre),
            "expanded": ops("hc_post")(inputs["sublayer"], x, m.post, m.residual), "head": ops("hc_head")(x, m.pre)}



CASES = [
    Case("mhc_sublayer", "hc_mixes+hc_pre+hc_post+hc_head",
         "mHC around one sublayer: coefficients with a 2-row zero tail, a large and a sparse row, the "
         "collapsed input, the expanded streams and the head", build_inputs=_mhc_build,
         run=lambda b, i, w: _mhc_call(b.get, i),
         comparators=lambda w: {"pre": "hc_mix", "post": "hc_mix", "residual": "hc_mix", "collapsed": "bf16_stage",
         "expanded": "hc_out", "head": "hc_out"}),
]
