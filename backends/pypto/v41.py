"""V4.1-Flash entries of the ``pypto`` backend, where a checkout has ``models/deepseek_v4_1_flash`` (not on
upstream main): each bound operator of ``backends.pypto.table`` runs this project's wrapper program
(``backends.pypto.programs``, a ``@pl.jit`` around one upstream ``@pl.jit.inline`` entry, parameters named as
this project names them) through upstream's ``golden.run_jit`` in the worker; the adapters below check the
caller's side of the ABI and lay the call out for it. Spec: §4.2, §5.2, §7.3."""

from __future__ import annotations

from pathlib import Path

import torch

FOLDER = "deepseek_v4_1_flash"
PROGRAMS = "backends.pypto.programs"


class Launcher:
    """Runs one wrapper program of ``backends.pypto.programs`` on the backend's device."""

    def __init__(self, binding, device):
        self.binding, self.device = binding, device
        self.outputs = tuple(a.name for a in binding.args if a.direction in ("out", "inout"))

    def __call__(self, values: dict, *, golden_data: Path | None = None) -> dict[str, torch.Tensor]:
        """Run on ``values`` ({argument name: tensor or int}); with ``golden_data``, upstream loads the inputs
        and expected outputs from that directory instead. Returns {output: tensor}."""
        out = self.device.run("", PROGRAMS, self.binding.program, values, golden_data=golden_data)
        return {o: out[o] for o in self.outputs}

    def compiled(self, *names: str) -> dict:
        """Constants the V4.1 kernels are compiled with (``models.deepseek_v4_1_flash.config``), by dotted name,
        read in the worker (upstream code never runs in the test process)."""
        from backends.upstream.client import worker

        return worker(self.device.root).values(f"models.{FOLDER}.config", list(names))


def _rope_rows(launch: Launcher):
    def materialize_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos, rope_sin):
        """The caller's side of the device ABI (§4.2: the kernel trusts it), checked before launching."""
        from kernels.errors import ContractInputError
        from kernels.reference.rope import check_rope_rows

        check_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos, rope_sin, dtype=torch.float32)
        if position_ids.dtype == torch.int64:  # the device takes INT32: narrow only what fits
            if position_ids.numel() and (int(position_ids.max()) >= 2**31 or int(position_ids.min()) < -2**31):
                raise ContractInputError("position_ids", None, "values that fit the device's INT32",
                                         f"range [{int(position_ids.min())}, {int(position_ids.max())}]", "§4.2")
            position_ids = position_ids.to(torch.int32)
        out = launch({"freqs_cos": freqs_cos, "freqs_sin": freqs_sin, "position_ids": position_ids,
                      "num_tokens": num_tokens, "rope_cos": rope_cos, "rope_sin": rope_sin})
        rope_cos.copy_(out["rope_cos"])
        rope_sin.copy_(out["rope_sin"])

    materialize_rope_rows.may_be_unsupported = True  # a call off the compiled geometry (the tables' width)
    return materialize_rope_rows


def _candidate_blocks(launch: Launcher):
    def candidate_blocks(scores, compressed_lens, *, block, topk_blocks, width=None):
        """The hierarchical indexer's level-1 selection (§5.2) on the device; the constants it was compiled
        with must be the ones asked for."""
        from contracts.operators import Unsupported
        from kernels.errors import ContractInputError

        got = launch.compiled("FLASH.candidate_block_size", "FLASH.candidate_topk_blocks")
        compiled = (got["FLASH.candidate_block_size"], got["FLASH.candidate_topk_blocks"])
        if (block, topk_blocks) != compiled:
            raise Unsupported(f"the device is compiled for block={compiled[0]}, topk_blocks={compiled[1]}; this "
                              f"call asks for block={block}, topk_blocks={topk_blocks}")
        if scores.ndim != 2 or compressed_lens.shape != (scores.shape[0],):
            raise ContractInputError("scores/compressed_lens", None, "[T, L] scores and [T] lengths",
                                     f"{list(scores.shape)} / {list(compressed_lens.shape)}", "§5.2")
        tokens, length = scores.shape
        width = length if width is None else width
        span = max(width, length, 1)
        padded = torch.full((tokens, span), float("-inf"), dtype=torch.float32)
        padded[:, :length] = scores.float()
        out = launch({"scores": padded, "compressed_lens": compressed_lens.to(torch.int32),
                      "candidate_mask": torch.zeros((tokens, span), dtype=torch.uint8)})
        return out["candidate_mask"][:, :width].contiguous()

    candidate_blocks.may_be_unsupported = True
    return candidate_blocks


ADAPTERS = {"materialize_rope_rows": _rope_rows, "candidate_blocks": _candidate_blocks}  # operator -> how its Python signature feeds the launcher
