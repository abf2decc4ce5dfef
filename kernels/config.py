"""Model facts: the V4.1-Flash preset and layer schedule, the V4 Flash/Pro presets, deployment mapping.

Nothing here reads ``sys.argv``: deployments are explicit values. Every preset has a
``tiny`` twin with the same structure (schedule, sources, group sizes, ring capacity)
and small dimensions for CPU property tests.

Spec: §1 (V4.1 schedule, FLASH constants, deployment), §8 (V4 presets).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property

from kernels.errors import is_int
from kernels.operators import operator


class ConfigError(ValueError):
    """A preset, schedule or deployment that violates the spec; names field and value."""


class AttentionMode(StrEnum):
    SWA = "swa"
    FULL = "full"
    REINDEX = "reindex"
    REUSE = "reuse"


class LayerKind(StrEnum):
    """The six decode layer kinds of V4.1 (upstream DecodeLayerKind)."""

    SWA = "SWA"
    C2A_FULL = "C2A_FULL"
    C2A_REUSE = "C2A_REUSE"
    C1A_FULL = "C1A_FULL"
    C1A_REINDEX = "C1A_REINDEX"
    C1A_REUSE = "C1A_REUSE"


_KINDS = {
    (0, AttentionMode.SWA): LayerKind.SWA,
    (2, AttentionMode.FULL): LayerKind.C2A_FULL,
    (2, AttentionMode.REUSE): LayerKind.C2A_REUSE,
    (1, AttentionMode.FULL): LayerKind.C1A_FULL,
    (1, AttentionMode.REINDEX): LayerKind.C1A_REINDEX,
    (1, AttentionMode.REUSE): LayerKind.C1A_REUSE,
}

SUPPORTED_TP = (1, 2, 4, 8)
SUPPORTED_EP = (2, 4, 8)


@dataclass(frozen=True)
class LayerConfig:
    """Resolved mode and cache sources of one layer. Spec: §1."""

    layer_id: int
    compress_ratio: int
    mode: AttentionMode
    kind: LayerKind
    kv_source: int | None
    index_source: int | None
    is_candidate_source: bool


def resolve_layer_kind(ratio: int, mode: AttentionMode) -> LayerKind:
    """Map (ratio, mode) to one of the six kinds, as upstream's decode layer plan does: an SWA layer is SWA
    whatever its ratio (it has no compressor to read it); the other five need their exact ratio; anything else
    is rejected naming the pair. Spec: §1 (SC-15)."""
    try:
        if AttentionMode(mode) == AttentionMode.SWA:
            return LayerKind.SWA
        return _KINDS[(ratio, AttentionMode(mode))]
    except (KeyError, ValueError):
        raise ConfigError(
            f"layer kind: (ratio={ratio}, mode={mode}) is not one of the six V4.1 kinds "
            f"{sorted(k.value for k in LayerKind)} (§1)"
        ) from None


@dataclass(frozen=True, repr=False)
class V41Config:
    """DeepSeek-V4.1-Flash constants. Spec: §1."""

    name: str = "flash"
    hidden_size: int = 5120
    num_hidden_layers: int = 40
    num_attention_heads: int = 64
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1280
    o_lora_rank: int = 1024
    o_groups: int = 8
    sliding_window: int = 128
    rms_norm_eps: float = 1e-20
    max_position_embeddings: int = 1_048_576
    rope_theta: float = 1e4
    compress_rope_theta: float = 1.6e5
    rope_factor: float = 16.0
    beta_fast: int = 32
    beta_slow: int = 1
    original_max_position_embeddings: int = 65536
    vocab_size: int = 129_280
    n_routed_experts: int = 384
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    scoring_func: str = "sqrtsoftplus"
    gate_temperature: float = 1.0
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    moe_intermediate_size: int = 2304
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    weight_block_size: tuple[int, int] = (32, 32)
    expert_dtype: str = "fp4"
    scale_fmt: str = "ue8m0"
    engram_layer_ids: tuple[int, ...] = (1, 14)
    engram_max_ngram_size: int = 4  # hash columns = (max_ngram - 1) · n_heads = 24
    engram_n_heads: int = 8
    engram_head_dim: int = 256
    compress_ratios: tuple[int, ...] = (0, 0) + (2,) * 18 + (1,) * 20
    kv_source_layer_ids: tuple[int, ...] = (2, 8, 14, 20)
    index_source_layer_ids: tuple[int, ...] = (2, 8, 14, 20, 24, 28, 32, 36)
    candidate_source_layer_id: int = 20
    # capacity constants (§1 "Other constants")
    block_size: int = 128
    state_capacity: int = 4
    max_batch_per_dp: int = 32
    dspark_spec_tokens: int = 5
    prefill_max_tokens: int = 4096
    moe_tokens: int = 16
    window_cache_group: int = 32
    compressed_cache_group: int = 16
    index_cache_group: int = 32
    shrunk: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        self._validate_dimensions()
        self._validate_schedule()

    # ---- derived constants -------------------------------------------------
    @property
    def nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def o_group_in(self) -> int:
        return self.num_attention_heads * self.head_dim // self.o_groups

    @property
    def hc_dim(self) -> int:
        return self.hc_mult * self.hidden_size

    @property
    def mix_hc(self) -> int:
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def state_width(self) -> int:
        return 2 * self.head_dim

    @property
    def mx_group(self) -> int:
        return self.weight_block_size[1]

    @property
    def decode_rows_per_request(self) -> int:
        return self.dspark_spec_tokens + 1

    @property
    def decode_max_tokens(self) -> int:
        return self.max_batch_per_dp * self.decode_rows_per_request

    # ---- validation --------------------------------------------------------
    def _fail(self, fieldname: str, expected: str, actual: object) -> None:
        raise ConfigError(f"{self.name}.{fieldname}: expected {expected}, got {actual!r} (§1)")

    def _validate_dimensions(self) -> None:
        for name in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                     "block_size", "state_capacity", "sliding_window"):
            if getattr(self, name) <= 0:
                self._fail(name, "a positive value", getattr(self, name))
        if self.num_attention_heads % self.o_groups:
            self._fail("o_groups", f"a divisor of num_attention_heads={self.num_attention_heads}", self.o_groups)
        if not self.head_dim > self.qk_rope_head_dim:
            self._fail("qk_rope_head_dim", f"< head_dim={self.head_dim}", self.qk_rope_head_dim)
        if self.index_head_dim < self.qk_rope_head_dim:
            self._fail("index_head_dim", f">= qk_rope_head_dim={self.qk_rope_head_dim}", self.index_head_dim)
        if self.qk_rope_head_dim % 2:
            self._fail("qk_rope_head_dim", "an even value (adjacent-pair rotation)", self.qk_rope_head_dim)
        if self.n_routed_experts < self.num_experts_per_tok:
            self._fail("n_routed_experts", f">= num_experts_per_tok={self.num_experts_per_tok}",
                       self.n_routed_experts)
        for layer in self.engram_layer_ids:
            if not 0 <= layer < self.num_hidden_layers:
                self._fail("engram_layer_ids", f"ids in [0, {self.num_hidden_layers})", self.engram_layer_ids)
        for name, group, width in (("window_cache_group", self.window_cache_group, self.head_dim),
                                   ("compressed_cache_group", self.compressed_cache_group, self.head_dim),
                                   ("index_cache_group", self.index_cache_group, self.index_head_dim)):
            if group <= 0 or width % group:
                self._fail(name, f"a positive divisor of {width}", group)

    def _validate_schedule(self) -> None:
        ratios = self.compress_ratios
        if len(ratios) != self.num_hidden_layers:
            self._fail("compress_ratios", f"{self.num_hidden_layers} entries (one per layer)", len(ratios))
        for layer, ratio in enumerate(ratios):
            if ratio not in (0, 1, 2):
                raise ConfigError(
                    f"{self.name}.compress_ratios[{layer}]: expected a value in {{0, 1, 2}}, got {ratio!r} (§1)")
        for name in ("kv_source_layer_ids", "index_source_layer_ids"):
            for layer in getattr(self, name):
                if not 0 <= layer < self.num_hidden_layers:
                    self._fail(name, f"layer ids in [0, {self.num_hidden_layers})", layer)
                if ratios[layer] == 0:
                    raise ConfigError(
                        f"{self.name}.{name}: source layer {layer} has compress ratio 0; a source must compress (§1)")
        for layer, ratio in enumerate(ratios):
            if ratio == 0:
                continue
            if self._active_source(self.kv_source_layer_ids, layer) is None:
                raise ConfigError(f"{self.name}.kv_source_layer_ids: compressed layer {layer} (ratio {ratio}) "
                                  f"has no KV source of ratio {ratio} at or before it (§1)")
            if self._active_source(self.index_source_layer_ids, layer) is None:
                raise ConfigError(f"{self.name}.index_source_layer_ids: compressed layer {layer} (ratio {ratio}) "
                                  f"has no index source of ratio {ratio} at or before it (§1)")
        cand = self.candidate_source_layer_id
        if cand not in self.kv_source_layer_ids or cand not in self.index_source_layer_ids:
            self._fail("candidate_source_layer_id", "a layer that is both a KV source and an index source", cand)
        for layer in range(self.num_hidden_layers):
            resolve_layer_kind(ratios[layer], self._mode(layer))

    def _active_source(self, sources: tuple[int, ...], layer: int) -> int | None:
        ratio = self.compress_ratios[layer]
        matching = [s for s in sources if s <= layer and self.compress_ratios[s] == ratio]
        return matching[-1] if matching else None

    def _mode(self, layer: int) -> AttentionMode:
        if self.compress_ratios[layer] == 0:
            return AttentionMode.SWA
        if layer in self.kv_source_layer_ids:
            return AttentionMode.FULL
        if layer in self.index_source_layer_ids:
            return AttentionMode.REINDEX
        return AttentionMode.REUSE

    # ---- schedule ----------------------------------------------------------
    def layer_config(self, layer_id: int) -> LayerConfig:
        """Mode, kind and cache sources of ``layer_id``. Spec: §1."""
        if not is_int(layer_id) or not (
                0 <= layer_id < self.num_hidden_layers):
            raise ConfigError(f"layer_id must be in [0, {self.num_hidden_layers - 1}], got {layer_id!r} (§1)")
        ratio = self.compress_ratios[layer_id]
        mode = self._mode(layer_id)
        swa = ratio == 0
        return LayerConfig(
            layer_id=layer_id,
            compress_ratio=ratio,
            mode=mode,
            kind=resolve_layer_kind(ratio, mode),
            kv_source=None if swa else self._active_source(self.kv_source_layer_ids, layer_id),
            index_source=None if swa else self._active_source(self.index_source_layer_ids, layer_id),
            is_candidate_source=layer_id == self.candidate_source_layer_id,
        )

    @cached_property
    def schedule(self) -> tuple[LayerConfig, ...]:
        return tuple(self.layer_config(i) for i in range(self.num_hidden_layers))

    def kind_counts(self) -> dict[LayerKind, int]:
        counts = dict.fromkeys(LayerKind, 0)
        for layer in self.schedule:
            counts[layer.kind] += 1
        return counts

    def sources_of_ratio(self, ratio: int) -> tuple[int, ...]:
        return tuple(s for s in self.kv_source_layer_ids if self.compress_ratios[s] == ratio)

    def tiny(self) -> V41Config:
        """Same schedule, sources, ring capacity and MX group sizes; small dims.

        Shrunk: hidden 5120->64, heads 64->8, head_dim 512->64 (rope 64->16), q_lora 1280->32,
        o_lora 1024->16, index heads 32->4 and dim 128->32, index_topk 512->16, candidate blocks
        2048->4, vocab ->256, experts 384->16, moe_inter 2304->32, block_size 128->16 and
        sliding_window 128->16 (so page and window edges occur at small T), max_position ->4096, Engram
        heads 8->2 and head dim 256->8.
        """
        shrunk = dict(hidden_size=64, num_attention_heads=8, head_dim=64, qk_rope_head_dim=16, q_lora_rank=32,
                      o_lora_rank=16, o_groups=8, index_n_heads=4, index_head_dim=32, index_topk=16,
                      candidate_topk_blocks=4, vocab_size=256, n_routed_experts=16, moe_intermediate_size=32,
                      block_size=16, sliding_window=16, max_position_embeddings=4096,
                      original_max_position_embeddings=256, engram_n_heads=2, engram_head_dim=8)
        return replace(self, name=self.name + "-tiny", shrunk=tuple(shrunk), **shrunk)


FLASH = V41Config()
FLASH_TINY = FLASH.tiny()


@dataclass(frozen=True)
class Deployment:
    """Attention TP / expert EP placement of one rank. Spec: §1 "Deployment constants"."""

    config: V41Config = FLASH
    tp: int = 4
    ep: int = 8
    rank: int = 0
    dp: int | None = None  # when given explicitly, it must equal ep / tp (upstream_checks CH-11)

    def __post_init__(self) -> None:
        c = self.config
        for name in ("tp", "ep", "dp"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value <= 0):
                raise ConfigError(f"deployment.{name}: expected a positive int (bool refused), got {value!r} (CH-11)")
        if self.tp not in SUPPORTED_TP:
            raise ConfigError(f"deployment.tp: expected one of {SUPPORTED_TP}, got {self.tp!r} (§1)")
        if self.ep not in SUPPORTED_EP:
            raise ConfigError(f"deployment.ep: expected one of {SUPPORTED_EP}, got {self.ep!r} (§1)")
        if self.ep % self.tp:
            raise ConfigError(f"deployment.ep: expected a multiple of tp={self.tp}, got {self.ep} (§1)")
        if c.num_attention_heads % self.tp:
            raise ConfigError(f"deployment.tp: heads {c.num_attention_heads} not divisible by tp={self.tp} (§1)")
        if c.o_groups % self.tp:
            raise ConfigError(f"deployment.tp: o_groups {c.o_groups} not divisible by tp={self.tp} (§1)")
        if c.n_routed_experts % self.ep:
            raise ConfigError(f"deployment.ep: experts {c.n_routed_experts} not divisible by ep={self.ep} (§1)")
        if self.dp is not None and self.dp != self.ep // self.tp:
            raise ConfigError(f"deployment.dp: expected ep / tp = {self.ep // self.tp}, got {self.dp} (CH-11)")
        object.__setattr__(self, "dp", self.ep // self.tp)
        if isinstance(self.rank, bool) or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"deployment.rank: expected in [0, {self.world_size}), got {self.rank!r} (§1)")

    @property
    def world_size(self) -> int:
        """The cards of the deployment: ep = tp · dp (upstream_checks CH-11)."""
        return self.ep

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def group_base(self) -> int:
        return self.rank - self.tp_rank

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def local_heads(self) -> int:
        return self.config.num_attention_heads // self.tp

    @property
    def local_o_groups(self) -> int:
        return self.config.o_groups // self.tp

    @property
    def local_o_width(self) -> int:
        return self.local_o_groups * self.config.o_lora_rank

    @property
    def n_local_experts(self) -> int:
        return self.config.n_routed_experts // self.ep

    def check_devices(self, ids: list[int]) -> list[int]:
        """Exactly one distinct non-negative device id per card (ep = tp · dp of them): a multi-card entry
        (attention TP groups, the MoE's EP ranks) runs one rank per id. Spec: upstream_checks CH-02, MO-13."""
        if any(not is_int(i) or i < 0 for i in ids) or len(set(ids)) != len(ids):
            raise ConfigError(f"deployment devices: expected distinct non-negative ints, got {ids} (CH-02)")
        if len(ids) != self.world_size:
            raise ConfigError(f"deployment devices: expected exactly {self.world_size} ids (ep={self.ep} = "
                              f"tp={self.tp} x dp={self.dp}), got {len(ids)}: {ids} (MO-13)")
        return ids


# ---------------------------------------------------------------------------
# V4 (Flash / Pro) presets. Spec: §8.


def v4_pro_ratios() -> tuple[int, ...]:
    """62 entries: 128,128, then alternating 4,128 ..., ending 4, 0 (the MTP layer)."""
    return (128, 128) + (4, 128) * 29 + (4, 0)


def v4_flash_ratios() -> tuple[int, ...]:
    """44 entries: 0,0, then alternating 4,128 ..., ending 4, 0."""
    return (0, 0) + (4, 128) * 20 + (4, 0)


@dataclass(frozen=True, repr=False)
class V4Config:
    """DeepSeek-V4 Flash / Pro preset. Spec: §8."""

    name: str
    hidden_size: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    swiglu_limit: float
    rms_norm_eps: float
    num_hidden_layers: int
    num_mtp_layers: int
    num_hash_layers: int
    compress_ratios: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    max_position_embeddings: int
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    original_max_position_embeddings: int = 65536
    rope_theta: float = 10000.0
    beta_fast: int = 32
    beta_slow: int = 1
    vocab_size: int = 129_280
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    dtype: str = "fp8"
    scale_fmt: str = "ue8m0"
    expert_dtype: str = "fp4"
    scale_dtype: str = "fp8"
    kernel_max_seq_len: int = 16384
    block_size: int = 128
    decode_batch: int = 4
    decode_seq: int = 2
    decode_start_pos: int = 8192
    prefill_batch: int = 1
    prefill_seq: int = 128
    ep_world_size: int = 8
    lm_head_tp_size: int = 8
    sliding_window: int = 128
    c4a_state_block_size: int = 4  # ratio-4 compressor state page (tokens)
    c128_state_block_size: int = 8  # ratio-128 compressor state page (tokens)
    # physical pools of the decode cases (pages): ori (window) KV, compressed KV, index KV, and the compressor
    # states of HCA, CSA and CSA's inner (indexer) compressor
    ori_pool: int = 128
    cmp_pool: int = 32
    idx_pool: int = 64
    hca_state_pool: int = 64
    csa_state_pool: int = 65
    csa_inner_state_pool: int = 65
    int8_scale_max: float = 127.0  # the INT8 stand-in's per-row quantization (INT8_SCALE_MAX, INT8_AMAX_EPS)
    int8_amax_eps: float = 1e-4
    hc_mult: int = 4
    shrunk: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        total = self.num_hidden_layers + self.num_mtp_layers
        if len(self.compress_ratios) != total:
            raise ConfigError(f"{self.name}.compress_ratios: expected {total} entries "
                              f"(layers + MTP), got {len(self.compress_ratios)} (§8)")
        for layer, ratio in enumerate(self.compress_ratios):
            if ratio not in (0, 4, 128):
                raise ConfigError(f"{self.name}.compress_ratios[{layer}]: expected 0, 4 or 128, got {ratio} (§8)")
        if self.num_attention_heads % self.o_groups:
            raise ConfigError(f"{self.name}.o_groups: {self.o_groups} does not divide heads (§8)")
        if self.n_routed_experts % self.ep_world_size:
            raise ConfigError(f"{self.name}.n_routed_experts: not divisible by EP {self.ep_world_size} (§8)")

    @property
    def decode_tokens(self) -> int:
        return self.decode_batch * self.decode_seq

    @property
    def mtp_layer_id(self) -> int:
        """The MTP layer's entry in compress_ratios (after the model layers)."""
        return self.num_hidden_layers

    def path(self, layer_id: int) -> str:
        """The attention path of a layer: ``HCA`` (ratio 128: compressor, deterministic top-k), ``CSA`` (ratio
        4: compressor with main and inner state, learned indexer) or ``SWA`` (ratio 0: window only). Spec: §8."""
        if not is_int(layer_id) or \
                not 0 <= layer_id < len(self.compress_ratios):
            raise ConfigError(f"{self.name}.layer_id: expected an int in [0, {len(self.compress_ratios) - 1}] "
                              f"(layers + MTP), got {layer_id!r} (§8)")
        return {128: "HCA", 4: "CSA", 0: "SWA"}[self.compress_ratios[layer_id]]

    def path_counts(self, *, mtp: bool = True) -> dict[str, int]:
        ids = range(len(self.compress_ratios) if mtp else self.num_hidden_layers)
        counts = {"HCA": 0, "CSA": 0, "SWA": 0}
        for i in ids:
            counts[self.path(i)] += 1
        return counts

    def hash_routed(self, layer_id: int) -> bool:
        """The first ``num_hash_layers`` model layers route experts by token hash, not by the gate."""
        self.path(layer_id)
        return layer_id < self.num_hash_layers

    @property
    def moe_tokens(self) -> int:
        return self.decode_tokens

    def kernel_preset(self) -> V4Config:
        """KERNEL_PRESETS: max_position replaced by KERNEL_MAX_SEQ_LEN."""
        return replace(self, max_position_embeddings=self.kernel_max_seq_len)

    def experts_per_rank(self, ep: int) -> int:
        if ep not in SUPPORTED_EP:
            raise ConfigError(f"{self.name}: --ep expected one of {SUPPORTED_EP}, got {ep} (§8)")
        return self.n_routed_experts // ep

    def vocab_shard(self, tp: int, vocab_size: int) -> int:
        if tp not in (2, 4, 8):
            raise ConfigError(f"{self.name}: LM-head --tp expected one of (2, 4, 8), got {tp} (§8)")
        return vocab_size // tp

    def tiny(self) -> V4Config:
        """Same ratio schedule and layer count; small hidden/heads/experts/index dims."""
        shrunk = dict(hidden_size=64, num_attention_heads=8, head_dim=64, qk_rope_head_dim=16, q_lora_rank=32,
                      o_lora_rank=16, o_groups=8 if self.o_groups == 16 else 4, n_routed_experts=16,
                      moe_intermediate_size=32, index_n_heads=4, index_head_dim=32, index_topk=16,
                      kernel_max_seq_len=512)
        return replace(self, name=self.name + "-tiny", shrunk=tuple(shrunk), **shrunk)


V4_PRO = V4Config(
    name="v4-pro", hidden_size=7168, num_attention_heads=128, head_dim=512, qk_rope_head_dim=64,
    q_lora_rank=1536, o_lora_rank=1024, o_groups=16, n_routed_experts=384, n_shared_experts=1,
    num_experts_per_tok=6, moe_intermediate_size=3072, routed_scaling_factor=2.5, swiglu_limit=10.0,
    rms_norm_eps=1e-6, num_hidden_layers=61, num_mtp_layers=1, num_hash_layers=3,
    compress_ratios=v4_pro_ratios(), index_n_heads=64, index_head_dim=128, index_topk=1024,
    max_position_embeddings=1_048_576,
)
V4_FLASH = replace(  # what V4-Flash changes of V4-Pro (the heads' widths, the MoE's top-k and the RMS eps are shared)
    V4_PRO, name="v4-flash", hidden_size=4096, num_attention_heads=64, q_lora_rank=1024, o_groups=8,
    n_routed_experts=256, moe_intermediate_size=2048, routed_scaling_factor=1.5, num_hidden_layers=43,
    compress_ratios=v4_flash_ratios(), index_topk=512, max_position_embeddings=16384,
)
V4_PRO_TINY = V4_PRO.tiny()
V4_FLASH_TINY = V4_FLASH.tiny()
# main's Flash-MTP moe.py at its smallest EP world, 2 devices: it keeps n_routed_experts // 8 * EP = 64 experts (32 a
# device), the geometry its l3_moe is compiled for with --ep 2 (the EP-8 deployment's 256 do not fit a 2-device run)
V4_FLASH_EP2 = replace(V4_FLASH, name="v4-flash-ep2", n_routed_experts=64)
# dspark's deployment of V4-Flash (models/deepseek_v4_flash_dspark/config.py): 16 requests x 8 tokens a step (its
# MoE's 128 rows per rank), pages of 32, a ratio-4 state page of 2, and its pools; the model itself is V4-Flash
V4_FLASH_DSPARK = replace(V4_FLASH, name="v4-flash-dspark", decode_batch=16, decode_seq=8, block_size=32,
                          c4a_state_block_size=2, ori_pool=512, cmp_pool=256, idx_pool=256, hca_state_pool=256,
                          csa_state_pool=260, csa_inner_state_pool=260)

PRESETS: dict[str, V41Config | V4Config] = {
    "flash": FLASH,
    "flash-tiny": FLASH_TINY,
    "v4-pro": V4_PRO,
    "v4-pro-tiny": V4_PRO_TINY,
    "v4-flash": V4_FLASH,
    "v4-flash-tiny": V4_FLASH_TINY,
    "v4-flash-ep2": V4_FLASH_EP2,
    "v4-flash-dspark": V4_FLASH_DSPARK,
}


V4_VARIANTS = {"pro": "v4-pro", "flash": "v4-flash"}


def v4_variant(variant: str | None = None, *, kernel: bool = True) -> V4Config:
    """The V4 preset chosen as upstream chooses it: ``variant`` (``--variant``), else the DEEPSEEK_V4_VARIANT
    environment variable, else ``pro``; ``kernel`` gives the kernel preset (max position = KERNEL_MAX_SEQ_LEN).
    An unknown variant is an error listing the two. Spec: §8."""
    import os

    name = variant if variant is not None else os.environ.get("DEEPSEEK_V4_VARIANT", "pro")
    if name not in V4_VARIANTS:
        raise ConfigError(f"variant: expected one of {sorted(V4_VARIANTS)} (--variant or DEEPSEEK_V4_VARIANT), "
                          f"got {name!r} (§8)")
    config = PRESETS[V4_VARIANTS[name]]
    return config.kernel_preset() if kernel else config


def _compact_repr(config) -> str:
    """One line a failure can afford: the preset's name and the fields that differ from the preset of that name
    (at most six, each cut at 40 characters). The whole value is ``dataclasses.asdict(config)``."""
    import dataclasses

    base = PRESETS.get(config.name)
    if type(base) is not type(config):
        base = None
    shown = ("hidden_size", "num_attention_heads", "head_dim")
    diffs = [f"{f.name}={_cut(repr(getattr(config, f.name)))}" for f in dataclasses.fields(config)
             if f.name != "name" and (getattr(config, f.name) != getattr(base, f.name) if base is not None
                                      else f.name in shown)]
    more = f", +{len(diffs) - 6} more" if len(diffs) > 6 else ""
    return f"{type(config).__name__}({config.name!r}{''.join(', ' + d for d in diffs[:6])}{more})"


def _cut(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _pretty(config, printer, cycle) -> None:
    """The same one line for pretty printers (hypothesis' "Failing test case" uses this protocol)."""
    printer.text(_compact_repr(config))


for _cls in (V41Config, V4Config):
    _cls.__repr__ = _compact_repr
    _cls._repr_pretty_ = _pretty


def preset(name: str) -> V41Config | V4Config:
    """Look a preset up by name; unknown names list the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}") from None


@operator(returns="tuple[LayerConfig] (mode, kind, kv_source, index_source per layer)", spec="§1")
def resolve_schedule(config) -> tuple[LayerConfig, ...]:
    """The per-layer schedule of ``config``. A config built from another copy of this module (a mutant's) is
    re-built here field by field, so the schedule is this module's rule applied to the caller's numbers."""
    if not isinstance(config, V41Config):
        from dataclasses import fields

        config = V41Config(**{f.name: getattr(config, f.name) for f in fields(config) if f.init})
    return config.schedule
