"""V4-Flash dspark's split Q / KV projection (spec §7.1, §8; upstream
models/deepseek_v4_flash_dspark/qkv_proj_rope.py, ``q_kv_split_test``): in a context-parallel prefill each rank
projects the queries of its own rows and the KV rows of the whole chunk.

``x_local`` [T_local, D] BF16 are the rank's rows (with their RoPE rows ``rope_cos_local`` / ``rope_sin_local``),
``x_full`` [T_full, D] BF16 every row of the chunk (``rope_cos_full`` / ``rope_sin_full``). The result is
``v4_qkv_proj_rope``'s, branch by branch: q [T_local, H, hd], qr [T_local, Q_LORA] INT8 and qr_scale [T_local, 1]
from the local rows, kv [T_full, hd] from every row; nothing is computed twice in another way. The two branches
share the weights. Composed from the backend's ``v4_qkv_proj_rope``.
"""

from __future__ import annotations

from functools import partial

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, replaced

SPEC = "§8"
WEIGHTS = ("wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq", "gamma_ckv")


def check_q_kv_split(x_local: torch.Tensor, x_full: torch.Tensor, rope_cos_local: torch.Tensor,
                     rope_cos_full: torch.Tensor) -> None:
    """The caller's side beyond each branch's own: two row sets of one width, each with one RoPE row per row."""
    for name, x in (("x_local", x_local), ("x_full", x_full)):
        if x.ndim != 2 or x.shape[0] == 0:
            raise ContractInputError(name, None, "[T, D] with T >= 1", list(x.shape), SPEC)
    if x_local.shape[1] != x_full.shape[1]:
        raise ContractInputError("x_local", None, f"rows of x_full's width {x_full.shape[1]}", x_local.shape[1], SPEC)
    if x_local.shape[0] > x_full.shape[0]:
        raise ContractInputError("x_local", None, f"at most x_full's {x_full.shape[0]} rows (a rank's share)",
                                 x_local.shape[0], SPEC)
    for name, cos, x in (("rope_cos_local", rope_cos_local, x_local), ("rope_cos_full", rope_cos_full, x_full)):
        if cos.ndim != 2 or cos.shape[0] != x.shape[0]:
            raise ContractInputError(name, None, f"one RoPE row per row ([{x.shape[0]}, rope])", list(cos.shape),
                                     SPEC)


@operator(returns="{q [T_local,H,hd] BF16, qr [T_local,Q_LORA] INT8, qr_scale [T_local,1] FP32, kv [T_full,hd] BF16}: "
                  "v4_qkv_proj_rope's queries of the local rows and KV of every row -- composed from this backend's "
                  "operators", spec=SPEC)
def v4_q_kv_split(x_local: torch.Tensor, x_full: torch.Tensor, wq_a: torch.Tensor, wq_b: torch.Tensor,
                  wq_b_scale: torch.Tensor, wkv: torch.Tensor, rope_cos_local: torch.Tensor,
                  rope_sin_local: torch.Tensor, rope_cos_full: torch.Tensor, rope_sin_full: torch.Tensor,
                  gamma_cq: torch.Tensor, gamma_ckv: torch.Tensor, *, config, ops=None) -> dict[str, torch.Tensor]:
    """The split projection (module docstring)."""
    from kernels.v4.qkv_proj import v4_qkv_proj_rope

    check_q_kv_split(x_local, x_full, rope_cos_local, rope_cos_full)
    project = (ops or {}).get("v4_qkv_proj_rope", v4_qkv_proj_rope)
    if getattr(project, "composes_operators", False):
        project = partial(project, ops=ops)
    weights = dict(wq_a=wq_a, wq_b=wq_b, wq_b_scale=wq_b_scale, wkv=wkv, gamma_cq=gamma_cq, gamma_ckv=gamma_ckv)
    local = project(x_local, rope_cos=rope_cos_local, rope_sin=rope_sin_local, **weights, config=config)
    full = project(x_full, rope_cos=rope_cos_full, rope_sin=rope_sin_full, **weights, config=config)
    return {"q": local["q"], "qr": local["qr"], "qr_scale": local["qr_scale"], "kv": full["kv"]}


v4_q_kv_split.composes_operators = True


# --- the record ----------------------------------------------------------------------------------------------

def _split_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """A chunk of 8 rows whose first 2 are the rank's (upstream's fixture: the local rows are the full run's first
    quarter), RoPE angles up to 300 radians."""
    from kernels.v4.qkv_proj import _qkv_inputs

    i = _qkv_inputs(seed, wiring, config)
    x, cos, sin = i.pop("x"), i.pop("rope_cos"), i.pop("rope_sin")
    local = x.shape[0] // 4
    return {"x_local": x[:local].clone(), "x_full": x, "rope_cos_local": cos[:local].clone(),
            "rope_sin_local": sin[:local].clone(), "rope_cos_full": cos, "rope_sin_full": sin, **i}


RECORD = Record(
    operator="v4_q_kv_split",
    call=lambda fn, i, config: dict(fn(**i, config=config)),
    outputs={"q": "exact", "kv": "exact", "qr": "exact", "qr_scale": "fp32_ulps"},
    cases=(CaseSpec("v4_q_kv_split", "V4-Flash dspark split Q / KV projection: the rank's queries, the chunk's KV",
                    _split_inputs, geometries=("flash-tiny",)),),
    bad_calls=(
        BadCall("more local rows than the chunk", "v4_q_kv_split",
                replaced(x_local=lambda i: torch.cat((i["x_full"], i["x_full"][:1])),
                         rope_cos_local=lambda i: torch.cat((i["rope_cos_full"], i["rope_cos_full"][:1])),
                         rope_sin_local=lambda i: torch.cat((i["rope_sin_full"], i["rope_sin_full"][:1]))),
                "x_local"),
        BadCall("a RoPE row short", "v4_q_kv_split", replaced(rope_cos_full=lambda i: i["rope_cos_full"][:-1]),
                "rope_cos_full"),
        BadCall("local rows of another width", "v4_q_kv_split", replaced(x_local=lambda i: i["x_local"][:, :-1]),
                "x_local"),
    ),
    bindings=(
        Upstream("deepseek_v4_pro", none="V4-Pro projects one chunk (v4_qkv_proj_rope)"),
        Upstream("deepseek_v4_flash_mtp", none="Flash-MTP projects one chunk (v4_qkv_proj_rope)"),
        Upstream("deepseek_v4_flash_dspark", golden="qkv_proj_rope.py::golden_q_kv_split",
                 entry="qkv_proj_rope.py::q_kv_split_test"),
    ),
)
