"""Reading the released V4.1-Flash checkpoint on the host (upstream_checks CQ-20, CQ-21, CQ-23).

A checkpoint directory holds ``config.json``, ``model.safetensors.index.json`` (tensor name -> shard file) and
safetensors shards (an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
byte range in the body, then the body).

``CheckpointReader`` (CQ-20) refuses, each with one error naming what and where:

* a quantization other than ``quant_method: fp8`` with ``weight_block_size: [32, 32]``;
* a ``text_config`` whose hidden size, layer count, head count, head dim, sliding window, KV source layers or
  index source layers differ from the model config it is read for;
* a shard path that leaves the checkpoint root; a header longer than 64 MiB; a dtype it does not know; a byte
  range whose length is not the shape's or that runs past the file;
* table row ids that are not integers or fall outside the table.

``mx_linear`` (CQ-21) turns a stored MXFP8 linear -- E4M3 weight [N, K] output-major, one E8M0 code per 32 x 32
block [N/32, K/32] -- into what the device's MX matmul reads: the E4M3 bytes input-major [K, N] and the scale
per 32 inputs and output column [K/32, N] (each block's code repeated over its 32 output columns) in the
MX_B_NN order of ``pack_mx_b_scale``. An output or input slice must cover whole 32-blocks.

``resident_plan`` and ``resident_fp8_blocks`` / ``resident_fp4_blocks`` (CQ-23) lay the weights out for the
resident CED: per layer, the FP8 projections as 32 x 32 blocks and the dense (F32/BF16) tensors as values,
each given an offset into its bank; the routed experts of four EP ranks as MXFP4 blocks. An FP8 projection
must be E4M3 with N and K multiples of 32, a dense tensor F32 or BF16, an expert packed INT8 with rows % 32 and
packed columns % 16, the scale count the block count, every offset below 2^31 (the INT32 metadata), and a
rank one of 0..3. Blocks are ordered output block first, then input block.

Spec: upstream_checks CQ-20, CQ-21, CQ-23 (prefill_fwd.py PrefillCheckpoint, ResidentPrefillWeights).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.config import FLASH, V41Config
from kernels.errors import ContractInputError
from kernels.reference.quant_linear import pack_mx_b_scale

ROUNDING_VERSION = "checkpoint-reader-1"
HEADER_LIMIT = 64 * 1024 * 1024
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn,
          "F8_E8M0": torch.float8_e8m0fnu, "I8": torch.int8}
BLOCK = 32
RESIDENT_RANKS = 4
OFFSET_LIMIT = 2**31
FP8_NAMES = ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a", "attn.wo_b", "attn.indexer.wq_b",
             "ffn.shared_experts.w1", "ffn.shared_experts.w3", "ffn.shared_experts.w2", "engram.wkv")
DENSE_NAMES = ("hc_attn_fn", "hc_attn_scale", "hc_attn_base", "attn_norm.weight", "attn.q_norm.weight",
               "attn.kv_norm.weight", "attn.attn_sink", "hc_ffn_fn", "hc_ffn_scale", "hc_ffn_base", "ffn_norm.weight",
               "ffn.gate.weight", "ffn.gate.bias", "attn.compressor.wkv.weight", "attn.compressor.wgate.weight",
               "attn.compressor.norm.weight", "attn.indexer.wk.weight", "attn.indexer.k_norm.weight",
               "attn.indexer.weights_proj.weight", "engram.q_weight")


def _refuse(field: str, expected: object, got: object, spec: str = "CQ-20", index=None) -> ContractInputError:
    return ContractInputError(field, index, expected, got, spec)


def required_text_config(config: V41Config = FLASH) -> dict[str, object]:
    """The text_config fields a checkpoint must agree on with the model config. Spec: CQ-20."""
    return {"hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads, "head_dim": config.head_dim,
            "sliding_window": config.sliding_window, "kv_source_layer_ids": list(config.kv_source_layer_ids),
            "index_source_layer_ids": list(config.index_source_layer_ids)}


class CheckpointReader:
    """Tensors of a checkpoint directory read on demand, one byte range at a time. Spec: CQ-20."""

    def __init__(self, root: str | Path, *, config: V41Config = FLASH):
        self.root = Path(root).resolve()
        self.config = config
        try:
            meta = json.loads((self.root / "config.json").read_text())
            index = json.loads((self.root / "model.safetensors.index.json").read_text())
        except (OSError, ValueError) as e:
            raise _refuse("checkpoint", "a readable config.json and model.safetensors.index.json", str(e)) from None
        quant = meta.get("quantization_config") or {}
        if quant.get("quant_method") != "fp8" or quant.get("weight_block_size") != [BLOCK, BLOCK]:
            raise _refuse("quantization_config", "quant_method fp8 with weight_block_size [32, 32]",
                          {k: quant.get(k) for k in ("quant_method", "weight_block_size")})
        text = meta.get("text_config") or {}
        for name, want in required_text_config(config).items():
            if text.get(name) != want:
                raise _refuse(f"text_config.{name}", want, text.get(name))
        self.weight_map: dict[str, str] = dict(index.get("weight_map") or {})
        self._headers: dict[str, tuple[int, dict]] = {}

    def _shard(self, name: str) -> Path:
        if name not in self.weight_map:
            raise _refuse("tensor", "a name of the index's weight_map", name)
        path = (self.root / self.weight_map[name]).resolve()
        if not path.is_relative_to(self.root):
            raise _refuse("weight_map", f"a shard inside {self.root}", self.weight_map[name], index=None)
        return path

    def header(self, name: str) -> tuple[Path, int, dict]:
        """(shard path, header length, the tensor's header entry) without reading any payload."""
        path = self._shard(name)
        key = str(path)
        if key not in self._headers:
            try:
                with path.open("rb") as f:
                    head = f.read(8)
                    if len(head) != 8:
                        raise _refuse(f"{path.name} header", "an 8-byte header length", f"{len(head)} bytes")
                    (size,) = struct.unpack("<Q", head)
                    if size > HEADER_LIMIT:
                        raise _refuse(f"{path.name} header", f"<= {HEADER_LIMIT} bytes", size)
                    self._headers[key] = (size, json.loads(f.read(size)))
            except OSError as e:
                raise _refuse("weight_map", f"a readable shard for {name}", f"{path} ({e.strerror})") from None
            except ValueError as e:
                if isinstance(e, ContractInputError):
                    raise
                raise _refuse(f"{path.name} header", "a JSON header", str(e)[:80]) from None
        size, entries = self._headers[key]
        if name not in entries:
            raise _refuse(f"{path.name} header", f"an entry for {name}", "none")
        entry = entries[name]
        if entry.get("dtype") not in DTYPES:
            raise _refuse(f"{name}.dtype", f"one of {sorted(DTYPES)}", entry.get("dtype"))
        return path, size, entry

    def _range(self, name: str, path: Path, size: int, entry: dict) -> tuple[torch.dtype, list[int], int]:
        dtype, shape = DTYPES[entry["dtype"]], list(entry["shape"])
        start, end = entry["data_offsets"]
        want = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if start < 0 or end - start != want or 8 + size + end > path.stat().st_size:
            raise _refuse(f"{name}.data_offsets", f"{want} bytes ({entry['dtype']}{shape}) inside the file",
                          [start, end])
        return dtype, shape, 8 + size + start

    def tensor(self, name: str) -> torch.Tensor:
        """The whole tensor, as stored."""
        path, size, entry = self.header(name)
        dtype, shape, at = self._range(name, path, size, entry)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        with path.open("rb") as f:
            f.seek(at)
            payload = bytearray(f.read(nbytes))
        return torch.frombuffer(payload, dtype=torch.uint8).view(dtype).reshape(shape) if nbytes else \
            torch.empty(shape, dtype=dtype)

    def rows(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape, integer) of a 2-D table -> [*ids.shape, width], reading only those rows."""
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise _refuse("ids", "integer row ids", str(ids.dtype))
        path, size, entry = self.header(name)
        dtype, shape, at = self._range(name, path, size, entry)
        if len(shape) != 2:
            raise _refuse(f"{name}.shape", "a 2-D table", shape)
        flat = ids.reshape(-1).long()
        bad = (flat < 0) | (flat >= shape[0])
        if bool(bad.any()):
            k = int(bad.nonzero()[0, 0])
            raise _refuse("ids", f"row ids in [0, {shape[0]}) of {name}", int(flat[k]), index=(k,))
        width = shape[1] * torch.empty((), dtype=dtype).element_size()
        unique, inverse = torch.unique(flat, return_inverse=True)
        table = torch.empty(unique.numel(), width, dtype=torch.uint8)
        with path.open("rb") as f:
            for i, row in enumerate(unique.tolist()):
                f.seek(at + row * width)
                table[i] = torch.frombuffer(bytearray(f.read(width)), dtype=torch.uint8)
        return table[inverse].view(dtype).reshape(*ids.shape, shape[1])

    def mx_linear(self, stem: str, *, output_range: tuple[int, int] | None = None,
                  input_range: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``stem``.weight / .scale -> (E4M3 [K, N] input-major, E8M0 [K/32, N] in MX_B_NN order). Spec: CQ-21."""
        return to_mx_b(self.tensor(stem + ".weight"), self.tensor(stem + ".scale"), output_range=output_range,
                       input_range=input_range, name=stem)


def _slice(rng: tuple[int, int] | None, extent: int, field: str) -> slice:
    if rng is None:
        return slice(0, extent)
    first, last = rng
    if first % BLOCK or last % BLOCK or not 0 <= first < last <= extent:
        raise _refuse(field, f"whole 32-blocks inside [0, {extent}]", [first, last], "CQ-21")
    return slice(first, last)


def to_mx_b(weight: torch.Tensor, scale: torch.Tensor, *, output_range: tuple[int, int] | None = None,
            input_range: tuple[int, int] | None = None, name: str = "weight") -> tuple[torch.Tensor, torch.Tensor]:
    """A stored MXFP8 linear (E4M3 [N, K], E8M0 [N/32, K/32]) -> (E4M3 [K, N], E8M0 [K/32, N] MX_B_NN), optionally
    sliced to an output and input range of whole blocks. Spec: CQ-21."""
    if weight.dtype != torch.float8_e4m3fn or scale.dtype != torch.float8_e8m0fnu:
        raise _refuse(name, "an E4M3 weight with E8M0 block scales", f"{weight.dtype} / {scale.dtype}", "CQ-21")
    if weight.ndim != 2 or scale.ndim != 2 or tuple(weight.shape) != (scale.shape[0] * BLOCK, scale.shape[1] * BLOCK):
        raise _refuse(name, "weight [N, K] with scale [N/32, K/32]", [list(weight.shape), list(scale.shape)], "CQ-21")
    rows = _slice(output_range, weight.shape[0], "output_range")
    cols = _slice(input_range, weight.shape[1], "input_range")
    w = weight.view(torch.uint8)[rows, cols]
    s = scale.view(torch.uint8)[rows.start // BLOCK:rows.stop // BLOCK, cols.start // BLOCK:cols.stop // BLOCK]
    logical = s.t().repeat_interleave(BLOCK, dim=1)  # [K/32, N]: a block's code over its 32 output columns
    return w.t().contiguous().view(torch.float8_e4m3fn), pack_mx_b_scale(logical).view(torch.float8_e8m0fnu)


@dataclass(frozen=True)
class ResidentPlan:
    """Offsets of every resident weight in its bank (CQ-23): ``fp8_offsets`` [layers, len(FP8_NAMES)] in 32 x 32
    blocks, ``dense_offsets`` [layers, len(DENSE_NAMES)] in values, ``expert_offsets`` [layers, local experts,
    3] in FP4 blocks (w1, w3, w2), and the bank sizes."""

    fp8_offsets: torch.Tensor
    dense_offsets: torch.Tensor
    expert_offsets: torch.Tensor
    fp8_blocks: int
    dense_values: int
    fp4_blocks: int
    local_experts: int

    def experts_of(self, rank: int) -> list[int]:
        """The routed experts rank ``rank`` holds (contiguous). Spec: CQ-23."""
        if rank not in range(RESIDENT_RANKS):
            raise _refuse("rank", f"one of 0..{RESIDENT_RANKS - 1} (four contiguous expert shards)", rank, "CQ-23")
        return list(range(rank * self.local_experts, (rank + 1) * self.local_experts))


def resident_plan(reader: CheckpointReader) -> ResidentPlan:
    """Lay out the resident banks from the checkpoint's headers alone (no payload read). Spec: CQ-23."""
    c = reader.config
    layers = c.num_hidden_layers
    fp8 = torch.zeros(layers, len(FP8_NAMES), dtype=torch.int32)
    dense = torch.zeros(layers, len(DENSE_NAMES), dtype=torch.int32)
    fp8_blocks = dense_values = 0
    for layer in range(layers):
        for column, suffix in enumerate(FP8_NAMES):
            name = f"layers.{layer}.{suffix}.weight"
            if name not in reader.weight_map:
                continue
            entry = reader.header(name)[2]
            n, k = entry["shape"]
            if entry["dtype"] != "F8_E4M3" or n % BLOCK or k % BLOCK:
                raise _refuse(name, "an E4M3 [N, K] projection with N % 32 == K % 32 == 0",
                              f"{entry['dtype']}{entry['shape']}", "CQ-23")
            fp8[layer, column] = min(fp8_blocks, OFFSET_LIMIT - 1)
            fp8_blocks += n * k // (BLOCK * BLOCK)
        for column, suffix in enumerate(DENSE_NAMES):
            name = f"layers.{layer}.{suffix}"
            if name not in reader.weight_map:
                continue
            entry = reader.header(name)[2]
            if entry["dtype"] not in ("F32", "BF16"):
                raise _refuse(name, "a dense F32 or BF16 tensor", entry["dtype"], "CQ-23")
            dense[layer, column] = min(dense_values, OFFSET_LIMIT - 1)
            dense_values += math.prod(entry["shape"])
    local = c.n_routed_experts // RESIDENT_RANKS
    per_expert = c.hidden_size * c.moe_intermediate_size // (BLOCK * BLOCK)
    fp4_blocks = layers * local * 3 * per_expert
    for field, value in (("fp8 bank", fp8_blocks), ("dense bank", dense_values), ("fp4 bank", fp4_blocks)):
        if value >= OFFSET_LIMIT:
            raise _refuse(field, "< 2^31 entries (INT32 offsets)", value, "CQ-23")
    experts = torch.arange(layers * local * 3, dtype=torch.int64).reshape(layers, local, 3) * per_expert
    return ResidentPlan(fp8, dense, experts.to(torch.int32), fp8_blocks, dense_values, fp4_blocks, local)


def resident_fp8_blocks(weight: torch.Tensor, scale: torch.Tensor, *, name: str = "weight"):
    """E4M3 [N, K] + E8M0 [N/32, K/32] -> (blocks [N/32 · K/32, 1024] bytes, output block then input block, each
    block row-major; scales [N/32 · K/32] in the same order). Spec: CQ-23."""
    if weight.dtype != torch.float8_e4m3fn or weight.ndim != 2 or weight.shape[0] % BLOCK or weight.shape[1] % BLOCK:
        raise _refuse(name, "an E4M3 [N, K] projection with N % 32 == K % 32 == 0",
                      f"{weight.dtype}{list(weight.shape)}", "CQ-23")
    n, k = weight.shape
    blocks = (n // BLOCK) * (k // BLOCK)
    if scale.numel() != blocks:
        raise _refuse(f"{name} scale", f"{blocks} codes (one per 32 x 32 block)", scale.numel(), "CQ-23")
    raw = weight.view(torch.uint8).reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK).permute(0, 2, 1, 3)
    return raw.reshape(blocks, BLOCK * BLOCK).contiguous(), scale.reshape(-1).view(torch.uint8).contiguous()


def resident_fp4_blocks(weight: torch.Tensor, scale: torch.Tensor, *, name: str = "expert"):
    """A packed MXFP4 expert (INT8 [N, K/2], E8M0 [N, K/32]) -> (blocks [N/32 · K/32, 512] bytes: 32 rows x 16
    packed bytes, output block then input block; scales [N/32 · K/32, 32]: the block's 32 row codes). Spec:
    CQ-23."""
    if weight.dtype != torch.int8 or weight.ndim != 2 or weight.shape[0] % BLOCK or weight.shape[1] % 16:
        raise _refuse(name, "INT8 packed FP4 [N, K/2] with N % 32 == 0 and K/2 % 16 == 0",
                      f"{weight.dtype}{list(weight.shape)}", "CQ-23")
    n, packed = weight.shape
    groups = packed // 16
    if tuple(scale.shape) != (n, groups):
        raise _refuse(f"{name} scale", f"[{n}, {groups}] (one code per row and 32 inputs)", list(scale.shape), "CQ-23")
    raw = weight.view(torch.uint8).reshape(n // BLOCK, BLOCK, groups, 16).permute(0, 2, 1, 3)
    codes = scale.view(torch.uint8).reshape(n // BLOCK, BLOCK, groups).permute(0, 2, 1)
    count = (n // BLOCK) * groups
    return raw.reshape(count, BLOCK * 16).contiguous(), codes.reshape(count, BLOCK).contiguous()
