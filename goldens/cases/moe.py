"""Golden cases of the MoE with expert parallelism (EP2, EP4): the gate, MXFP4 routed experts and a shared
expert. Spec: §1."""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors
from kernels.config import FLASH_TINY


def _moe_build(ep: int):
    def build(seed: int, wiring: str) -> Tensors:
        from kernels import quant

        c = FLASH_TINY
        g = torch.Generator().manual_seed(seed)
        experts, inter, dim, rows = c.n_routed_experts, c.moe_intermediate_size, c.hidden_size, 10
        counts = ([10, 7] if ep == 2 else [10, 7, 0, 4])[:ep]

        def fp4(n_rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
            codes = torch.randint(0, 16, (experts, n_rows, cols), generator=g, dtype=torch.uint8)
            scales = torch.randint(122, 126, (experts, n_rows, cols // 32), generator=g, dtype=torch.uint8)
            return quant.pack_fp4(codes), scales

        w1, s1 = fp4(inter, dim)
        w3, s3 = fp4(inter, dim)
        w2, s2 = fp4(dim, inter)
        if ep == 4:  # upstream's fixture routing bias: +4 on 6 spread experts, -1 elsewhere (MO-10)
            bias = torch.full((experts,), -1.0)
            bias[torch.linspace(0, experts - 1, c.num_experts_per_tok).round().long()] = 4.0
        else:
            bias = torch.randn(experts, generator=g) * 0.05
        return {"xs": torch.randn(ep, rows, dim, generator=g).to(torch.bfloat16),
                "router": torch.randn(experts, dim, generator=g) / dim**0.5, "bias": bias,
                "w1": w1, "w1_scale": s1, "w3": w3, "w3_scale": s3, "w2": w2, "w2_scale": s2,
                "shared_w1": (torch.randn(inter, dim, generator=g) / dim**0.5).to(torch.bfloat16),
                "shared_w3": (torch.randn(inter, dim, generator=g) / dim**0.5).to(torch.bfloat16),
                "shared_w2": (torch.randn(dim, inter, generator=g) / inter**0.5).to(torch.bfloat16),
                "num_tokens": torch.tensor(counts, dtype=torch.int32)}
    return build


def _moe_call(get, inputs: Tensors) -> Tensors:
    from kernels.reference.moe import ExpertWeights, expert_weights

    c = FLASH_TINY
    ep = inputs["xs"].shape[0]
    experts = [expert_weights("mxfp4", inputs["w1"][e], inputs["w3"][e], inputs["w2"][e],
                              (inputs["w1_scale"][e], inputs["w3_scale"][e], inputs["w2_scale"][e]))
               for e in range(inputs["w1"].shape[0])]
    shared = ExpertWeights(inputs["shared_w1"], inputs["shared_w3"], inputs["shared_w2"])
    xs = list(inputs["xs"])
    gates = [get("moe_gate")(x, inputs["router"], inputs["bias"], config=c) for x in xs]
    res = get("moe_ep")(xs, gates, experts, shared, ep=ep, num_tokens=inputs["num_tokens"].tolist(), config=c)
    return {"weights": torch.stack([w for w, _i in gates]), "ids": torch.stack([i for _w, i in gates]),
            "output": torch.stack(res.outputs), "send_counts": res.send_counts,
            "recv_y": torch.stack(res.recv_y), "recv_expert_count": torch.stack(res.recv_expert_count)}




def _moe_case(ep: int) -> Case:
    return Case(f"moe_ep{ep}", "moe_gate+moe_ep",
                f"MoE on EP{ep}: MXFP4 routed experts (E8M0 scales), a shared expert, uneven token counts with "
                "an idle rank" + (" and upstream's fixture routing bias" if ep == 4 else ""),
                build_inputs=_moe_build(ep), run=lambda b, i, w: _moe_call(b.get, i),
                comparators=lambda w: {"weights": "gate_weights", "ids": "gate_ids", "output": "moe_out",
                "send_counts": "exact", "recv_y": "recv_y", "recv_expert_count": "exact"}, params={"ep": ep})


CASES = [_moe_case(2), _moe_case(4)]
