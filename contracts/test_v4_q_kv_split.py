"""V4-Flash dspark's split Q / KV projection (``v4_q_kv_split``): a rank's queries and the chunk's KV, each the
fused projection (``v4_qkv_proj_rope``) of its own rows. Golden case and bad calls: the record in
``kernels/v4/q_kv_split.py``. Spec: §7.1, §8."""

from __future__ import annotations

import pytest
import torch

from contracts.compare import COMPARATORS, Context
from contracts.separation import separates
from kernels.config import V4_FLASH_TINY
from kernels.errors import ContractInputError
from kernels.v4.q_kv_split import _split_inputs
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

C = V4_FLASH_TINY
JUDGES = {"q": "exact", "qr": "exact", "qr_scale": "fp32_ulps", "kv": "exact"}


def _branches(backend, i):
    project = op(backend, "v4_qkv_proj_rope")
    weights = {k: i[k] for k in ("wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq", "gamma_ckv")}
    local = project(i["x_local"], rope_cos=i["rope_cos_local"], rope_sin=i["rope_sin_local"], **weights, config=C)
    full = project(i["x_full"], rope_cos=i["rope_cos_full"], rope_sin=i["rope_sin_full"], **weights, config=C)
    return {"q": local["q"], "qr": local["qr"], "qr_scale": local["qr_scale"], "kv": full["kv"]}


def _judge(i, got, want, what):
    ctx = Context(inputs=i, actual_outputs=got, expected_outputs=want, params={})
    for name, judge in JUDGES.items():
        assert tuple(got[name].shape) == tuple(want[name].shape) and got[name].dtype == want[name].dtype, \
            f"{what}: {name} is {got[name].dtype}{list(got[name].shape)}, the branch gives " \
            f"{want[name].dtype}{list(want[name].shape)}"
        verdict = COMPARATORS[judge](name, got[name], want[name], ctx)
        assert verdict.ok, f"{what}: {name} is not the fused projection of its branch's rows ({judge}): {verdict}"


@pytest.mark.operators("v4_q_kv_split", "v4_qkv_proj_rope")
def test_each_branch_is_the_fused_projection_of_its_rows(backend):
    """The rank's share as upstream's fixture lays it (the chunk's first quarter): q, qr and qr_scale are the fused
    projection of the local rows, kv of every row (the comparators of v4_qkv_proj_rope's own record)."""
    i = _split_inputs(5, "replicated", C)
    _judge(i, op(backend, "v4_q_kv_split")(**i, config=C), _branches(backend, i), "rank 0's share")


@pytest.mark.operators("v4_q_kv_split", "v4_qkv_proj_rope")
def test_a_later_ranks_queries_come_from_its_own_rows(backend):
    """Rank 1's share (rows 2..3 of 8, with their RoPE rows): its queries are its own rows' -- not the chunk's first
    rows' -- while kv stays every row's. On rank 0's layout the two readings agree, so this layout separates them."""
    i = _split_inputs(5, "replicated", C)
    for name, full in (("x_local", "x_full"), ("rope_cos_local", "rope_cos_full"), ("rope_sin_local", "rope_sin_full")):
        i[name] = i[full][2:4].clone()
    want = _branches(backend, i)
    first = op(backend, "v4_qkv_proj_rope")(i["x_full"][:2], rope_cos=i["rope_cos_full"][:2],
                                           rope_sin=i["rope_sin_full"][:2], config=C,
                                           **{k: i[k] for k in ("wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq",
                                                                "gamma_ckv")})
    separates("a rank's queries from its own rows", want["q"], chunks_first_rows=first["q"])
    _judge(i, op(backend, "v4_q_kv_split")(**i, config=C), want, "rank 1's share")


# --- seeded defects ------------------------------------------------------------------------------------------

def _kv_of_local_rows(*args, **kwargs):
    from kernels.v4.q_kv_split import v4_q_kv_split

    out = dict(v4_q_kv_split(*args, **kwargs))
    n = kwargs["x_local"].shape[0] if "x_local" in kwargs else args[0].shape[0]
    out["kv"] = out["kv"][:n].clone()
    return out


def _queries_of_first_rows(**kwargs):
    from kernels.v4.q_kv_split import v4_q_kv_split

    n = kwargs["x_local"].shape[0]
    kwargs = dict(kwargs, x_local=kwargs["x_full"][:n], rope_cos_local=kwargs["rope_cos_full"][:n],
                  rope_sin_local=kwargs["rope_sin_full"][:n])
    return v4_q_kv_split(**kwargs)


SEEDED_DEFECTS = [
    SeededDefect("q-kv-split:kv-of-local-rows", "v4_q_kv_split", _kv_of_local_rows,
                 "test_each_branch_is_the_fused_projection_of_its_rows", "kv is"),
    SeededDefect("q-kv-split:queries-of-first-rows", "v4_q_kv_split", _queries_of_first_rows,
                 "test_a_later_ranks_queries_come_from_its_own_rows", "q is not the fused projection"),
]


@pytest.mark.operators("v4_q_kv_split")
@pytest.mark.parametrize("case, field", [("local 1-D", "x_local"), ("no local row", "x_local"),
                                         ("no row", "x_full"), ("cos 1-D", "rope_cos_local"),
                                         ("one cos row short", "rope_cos_local"), ("more local rows", "x_local")])
def test_a_malformed_split_is_refused_and_its_edges_accepted(backend, case, field):
    """Row sets that are not [T >= 1, D], RoPE rows that are not one per row: refused naming the field. A share of
    one row and a share of every row (the bound itself) are well formed."""
    i = _split_inputs(5, "replicated", C)
    bad = dict(i)
    if case == "local 1-D":
        bad["x_local"] = i["x_local"][0]
    elif case == "no local row":
        bad.update(x_local=i["x_local"][:0], rope_cos_local=i["rope_cos_local"][:0],
                   rope_sin_local=i["rope_sin_local"][:0])
    elif case == "no row":
        bad.update(x_full=i["x_full"][:0], rope_cos_full=i["rope_cos_full"][:0], rope_sin_full=i["rope_sin_full"][:0])
    elif case == "cos 1-D":
        bad["rope_cos_local"] = i["rope_cos_local"].reshape(-1)
    elif case == "one cos row short":
        bad["rope_cos_local"] = i["rope_cos_local"][:-1]
    else:
        bad.update({f"{n}_local": torch.cat((i[f"{n}_full"], i[f"{n}_full"][:1])) for n in ("x", "rope_cos",
                                                                                              "rope_sin")})
    split = op(backend, "v4_q_kv_split")
    with pytest.raises(ContractInputError) as exc:
        split(**bad, config=C)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"
    for n in (1, i["x_full"].shape[0]):
        edge = dict(i, x_local=i["x_full"][:n], rope_cos_local=i["rope_cos_full"][:n],
                    rope_sin_local=i["rope_sin_full"][:n])
        assert split(**edge, config=C)["q"].shape[0] == n
