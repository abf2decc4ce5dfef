"""The caller contract of an attention half-layer entry, checked on the host before anything launches.

A decode entry takes at most ``decode_max_tokens`` rows (32 requests x 6 rows = 192 per DP group) and a
prefill entry at most ``prefill_max_tokens`` (4,096); the request count is between 1 and
min(32, active tokens). Every decode mode except C2A Reuse requires ``active == tokens``; C2A Reuse alone
publishes an active prefix and accepts an inactive suffix (upstream validates 32 tokens with 24 active).
The decode SWA leaf refuses TP8 (it would need head-tile padding). Each violation raises a
ContractInputError naming the field, the mode and phase, the expected range and the value.

Spec: §7.1 (decode caller contract), §1 (deployment); upstream_checks CH-03, CH-04, SC-22, MD-30, SP-13.
"""

from __future__ import annotations

from kernels.config import FLASH, SUPPORTED_TP, ConfigError, LayerKind, V41Config
from kernels.errors import ContractInputError, is_int
from kernels.operators import operator

SPEC = "§7.1"
PHASES = ("decode", "prefill")


def _int(name: str, value: object, where: str) -> int:
    if not is_int(value):
        raise ContractInputError(name, None, f"an int ({where})", repr(value), SPEC)
    return value


MAX_EPOCHS = 1000


@operator(returns='active token count; raises ValueError naming field, mode and phase (host-side '
                   'caller contract of an attention half-layer entry)',
          spec='§7.1')
def half_layer_call(kind: LayerKind | str, *, phase: str, tokens: int, active: int | None = None,
                          requests: int = 1, tp: int = 1, epoch: int = 1, pages: int | None = None,
                          dp: int = 1, layer: int | None = None, config: V41Config = FLASH) -> int:
    """Validate one half-layer call (``epoch``: the 1-based attention epoch the distributed output windows
    count, 1..1000); return the number of active tokens. A C1A call may also give the KV ``pages`` of its
    request (>= 1; then tokens <= min(capacity, pages · block_size)) and runs one DP group (``dp`` 1). A call
    that names its ``layer`` must be that layer's kind in the schedule (a C2A REUSE entry is not run for a
    C2A FULL layer). Spec: §7.1, CH-03, CH-09, SC-27."""
    try:
        kind = LayerKind(kind)
    except ValueError:
        raise ContractInputError("kind", None, f"one of {[k.value for k in LayerKind]}", repr(kind), SPEC) from None
    if layer is not None:
        try:
            actual = config.layer_config(layer).kind
        except ConfigError as exc:
            raise ContractInputError("layer", None, f"a layer id of the schedule (0..{config.num_hidden_layers - 1})",
                                     repr(layer), "SC-27") from exc
        if actual is not kind:
            raise ContractInputError("layer", None, f"a {kind.value} layer for the {kind.value} entry",
                                     f"layer {layer}, which resolves to {actual.value}", "SC-27")
    if phase not in PHASES:
        raise ContractInputError("phase", None, f"one of {PHASES}", repr(phase), SPEC)
    where = f"{kind.value} {phase}"
    tp = _int("tp", tp, where)
    allowed_tp = tuple(t for t in SUPPORTED_TP if not (kind is LayerKind.SWA and phase == "decode" and t == 8))
    if tp not in allowed_tp:
        note = " (the decode SWA leaf refuses TP8: it would need head-tile padding)" if tp == 8 else ""
        raise ContractInputError("tp", None, f"one of {allowed_tp} for {where}{note}", tp, SPEC)
    capacity = config.decode_max_tokens if phase == "decode" else config.prefill_max_tokens
    tokens = _int("tokens", tokens, where)
    if not 1 <= tokens <= capacity:
        raise ContractInputError("tokens", None, f"1..{capacity} rows per DP group for {where}", tokens, SPEC)
    active = tokens if active is None else _int("active_tokens", active, where)
    if not 1 <= active <= tokens:
        raise ContractInputError("active_tokens", None, f"1..tokens ({tokens}) for {where}", active, SPEC)
    if phase == "decode" and kind is not LayerKind.C2A_REUSE and active != tokens:
        raise ContractInputError("active_tokens", None, f"== tokens ({tokens}) for {where}: only C2A_REUSE "
                                 "decode accepts an inactive suffix", active, SPEC)
    if kind in (LayerKind.C1A_FULL, LayerKind.C1A_REINDEX, LayerKind.C1A_REUSE):
        if pages is not None:
            pages = _int("pages", pages, where)
            if pages < 1:
                raise ContractInputError("pages", None, f">= 1 for {where}", pages, "CH-09")
            most = min(capacity, pages * config.block_size)
            if tokens > most:
                raise ContractInputError("tokens", None, f"1..min({capacity}, pages·{config.block_size}) = 1..{most} "
                                         f"for {where}", tokens, "CH-09")
        if _int("dp", dp, where) != 1:
            raise ContractInputError("dp", None, f"1 for {where} (one DP group per C1A call)", dp, "CH-09")
    epoch = _int("attention_epoch", epoch, where)
    if not 1 <= epoch <= MAX_EPOCHS:
        raise ContractInputError("attention_epoch", None, f"1..{MAX_EPOCHS} (1-based, consecutive) for {where}",
                                 epoch, SPEC)
    requests = _int("requests", requests, where)
    most = min(config.max_batch_per_dp, active)
    if not 1 <= requests <= most:
        raise ContractInputError("requests", None, f"1..min({config.max_batch_per_dp}, active tokens) = 1..{most} "
                                 f"for {where}", requests, SPEC)
    return active
