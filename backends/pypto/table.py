"""Which upstream pypto-lib entry each operator of this project binds on the ``pypto`` backend -- the one
place that says so (``docs/backends.md`` is generated from it and a test keeps the two equal).

Every kernel operator of ``contracts.operators.KERNEL_OPERATORS`` has a row (derived when not written here):

* ``bound``: the backend runs the upstream entry through upstream's ``golden.run_jit`` in the upstream worker and
  returns the outputs it captured: a V4-Pro entry of ``PRO_ENTRIES`` directly (the call laid out by
  ``backends.upstream.adapters``; its arguments are read from the entry's declaration at run time), a V4.1 entry
  through the wrapper program of ``backends/pypto/programs.py`` named by ``program``;
* ``not bound``: upstream has an entry for it, but this version does not bind it yet; ``note`` says what is
  missing;
* ``not exposed``: upstream has no entry with this operator's inputs and outputs (the work is fused inside
  another entry, or is host Python); ``note`` names where it lives, so it cannot be bound as it stands;
* ``host``: host-side Python (metadata, schedule, slab arithmetic, caller checks), not a device kernel;
* ``composition``: built from other operators (runs on whatever this backend binds);
* ``not surveyed``: derived for a declared operator without a row here (no upstream entry named yet).

The rows are data (``backends/pypto/bindings.toml``: status, upstream, kind, program, note, args, per-mode
entries); the V4-Pro rows an adapter lays out are built here (``_pro_bound``), and an operator without a row gets
``not surveyed`` (``_unsurveyed``). Upstream paths are relative to the pypto-lib root. Argument rows: (name,
direction in/out/inout/scalar, dtype, shape with upstream's dynamic dims).
Facts: spec §2.3, §4.1, §4.2, §5, §7.1-§7.3 and the upstream entry files named.
"""

from __future__ import annotations

from dataclasses import dataclass

PRO = "models/deepseek_v4_pro"


@dataclass(frozen=True)
class Arg:
    name: str
    direction: str  # in | out | inout | scalar
    dtype: str
    shape: str


@dataclass(frozen=True)
class Binding:
    operator: str
    status: str  # bound | not bound | not exposed | host | composition | not surveyed
    upstream: str  # file::function (or files)
    kind: str = ""  # @pl.jit / @pl.jit.inline / host Python
    args: tuple[Arg, ...] = ()
    program: str | None = None  # backends.pypto.programs attribute when bound (V4.1)
    note: str = ""
    variants: tuple[tuple[str, tuple[Arg, ...]], ...] = ()  # (upstream entry, its arguments) per mode


def _args(rows: list) -> tuple[Arg, ...]:
    return tuple(Arg(*r) for r in rows)


def _rows() -> dict[str, Binding]:
    """The rows written down (``bindings.toml`` beside this module): one table per operator, its arguments and its
    per-mode entries' arguments as [name, direction, dtype, shape] rows."""
    import tomllib
    from pathlib import Path

    data = tomllib.loads(Path(__file__).with_name("bindings.toml").read_text())
    return {name: Binding(name, d["status"], d["upstream"], d.get("kind", ""), _args(d.get("args", [])),
                          d.get("program"), d.get("note", ""),
                          tuple((v["entry"], _args(v["args"])) for v in d.get("variants", ())))
            for name, d in data.items()}


# Operators added with the composition around attention (mHC, MoE, LM head): their upstream argument lists are
# transcribed when that work binds them; until then the row says so (tests/test_pypto_backend.py allows exactly
# these rows to lack arguments).
PENDING: tuple[str, ...] = ("v4_compressor",)  # operators whose upstream argument list is not transcribed yet

BINDINGS: dict[str, Binding] = _rows()


# V4-Pro kernel entries (upstream main): module of models/deepseek_v4_pro -> (the @pl.jit entry upstream's own
# __main__ hands to golden.run_jit, the number of devices it runs on). The adapters of backends.upstream.adapters
# lay each call out as that module's tensors dict; the entry's declaration says order, directions and which dims
# are compiled in.
# Dynamic dims an entry only takes in whole tiles, by the module constant that sizes the tile (the kernel spreads
# dim // tile blocks: a remainder is silently dropped, and fewer rows than one tile launch no block at all, which
# the runtime aborts on). Checked in the worker before any launch; an off-tile call is refused as unsupported.
DYN_TILES: dict[str, dict[str, str]] = {
    "hc_post": {"T_DYN": "T_TILE"},  # hc_post_test: pl.spmd((t_dim // T_TILE) * HC_MULT)
    "rmsnorm": {"T_DYN": "T_TILE"},  # rms_norm_test: row tiles of T_TILE
}

PRO_ENTRIES: dict[str, tuple[str, int]] = {
    "gate": ("gate_test", 1),
    "mtp_projection": ("mtp_projection_test", 1),
    "hc_post": ("hc_post_test", 1),
    "expert_routed": ("expert_routed_test", 1),
    "expert_shared": ("expert_shared_test", 1),
    "qkv_proj_rope": ("qkv_proj_rope_test", 1),
    "decode_compressor_ratio4": ("compressor_test", 1),
    "decode_compressor_ratio128": ("compressor_test", 1),
    "lm_head": ("l3_lm_head", 2),
    "decode_sparse_attn": ("sparse_attn_test", 1),
    "decode_sparse_attn_hca": ("sparse_attn_test", 1),
    "decode_sparse_attn_swa": ("sparse_attn_test", 1),
    "decode_indexer": ("indexer_test", 1),
    "rmsnorm": ("rms_norm_test", 1),
    "prefill_indexer": ("prefill_indexer_test", 1),
    "lookup_embedding": ("lookup_embedding_test", 1),  # the V4-Flash folders' (the entry names are shared)
    "hc_pre": ("hc_pre_test", 1),  # hc_pre_fused (hc_mixes then hc_pre, as the entry computes them)
    "hc_head": ("hc_head_test", 1),  # hc_head_fused (v4_head_mix then hc_head)
    "markov_head": ("markov_head_test", 1),  # dspark's
    "dspark_proj": ("dspark_proj_test", 1),  # dspark's drafter
    "dspark_context_kv": ("dspark_context_kv_test", 1),
    "dspark_attention": ("dspark_attention_test", 1),
    # dspark's device lowering (its golden_decode_metadata); V4-Pro's decode_metadata.py is a host lowering with no
    # golden, which no entry binds (adapters of a "(host lowering)" are skipped)
    "decode_metadata": ("decode_metadata", 1),
    # dspark's CP prefill KV all-gather: an L3 program over TP_SIZE (2, its default) simulated devices
    "prefill_kv_allgather": ("l3_prefill_kv_allgather_fixture", 2),
    # the MoE stage over EP 2 (moe.py's smallest world): dispatch and combine across 2 devices; compiled for the
    # v4-flash-ep2 geometry in the Flash folders (64 experts); V4-Pro's (96 experts at EP 2) outgrows 24 GiB on a5sim
    "moe": ("l3_moe", 2),
}
# A folder's own entry name where it differs from V4-Pro's: folder -> ((its module name, entry), ...)
FOLDER_ENTRIES: dict[str, tuple[tuple[str, str], ...]] = {
    "deepseek_v4_flash_dspark": (("decode_sparse_attn_csa", "sparse_attn_csa_test"),
                                 ("decode_sparse_attn_hca", "sparse_attn_hca_test"),
                                 ("decode_sparse_attn_swa", "sparse_attn_swa_test")),
}


def _pro_bound() -> dict[str, Binding]:
    """The bound rows: one per operator an adapter lays out for a V4-Pro entry of ``PRO_ENTRIES`` (its arguments,
    directions and compiled dims are read from the entry's declaration at run time, so no row lists them). Where
    the table has a V4.1 row for the same operator (``hc_post``, ``lm_head``, ``final_norm``: a V4.1 entry not
    bound), the bound row names it in its note."""
    from backends.upstream.adapters import ADAPTERS

    out = {}
    for name, a in ADAPTERS.items():
        if a.folder != "deepseek_v4_pro" or a.module not in PRO_ENTRIES or not a.function.startswith("golden_"):
            continue
        entry, ranks = PRO_ENTRIES[a.module]
        also = [f"{m}.py::{PRO_ENTRIES[m][0]}" for m in a.also if m in PRO_ENTRIES]
        v41 = BINDINGS.get(name)
        out[name] = Binding(name, "bound", f"{PRO}/{a.module}.py::{entry}" + (f" (also {', '.join(also)})" if also
                                                                              else ""),
                            "@pl.jit" + (f" on {ranks} devices (distributed_config)" if ranks > 1 else ""),
                            note="laid out by backends.upstream.adapters; arguments, directions and compiled dims read "
                                 "from the entry's declaration at run time (a call off the compiled geometry is "
                                 "unsupported, naming the dim)" + (f"; V4.1's {v41.upstream} is not bound" if v41
                                                                   else ""))
    return out


def _unsurveyed() -> dict[str, Binding]:
    """A row for every declared operator without one: ``not bound`` naming the kernel entries its record
    (``kernels.record``) names per upstream folder, else ``not surveyed`` (no entry named for it yet)."""
    from contracts.operators import KERNEL_OPERATORS
    from kernels.record import records

    unknown = sorted(set(BINDINGS) - set(KERNEL_OPERATORS))
    if unknown:
        raise ValueError(f"backends.pypto.table: rows for operators nobody declares: {unknown}")
    out = {}
    for name in KERNEL_OPERATORS:
        if name in BINDINGS:
            continue
        record = records().get(name)
        entries = [f"models/{u.folder}/{u.entry}" for u in (record.bindings if record else ()) if u.entry]
        out[name] = (Binding(name, "not bound", ", ".join(entries), "@pl.jit",
                             note="the entries its record names (kernels.record); no adapter lays the call out for "
                                  "them yet") if entries else
                     Binding(name, "not surveyed", "(none named yet)",
                             note="declared after the last survey of upstream's entries; no entry is named for it yet"))
    return out


BINDINGS.update(_pro_bound())
BINDINGS.update(_unsurveyed())


def bound() -> list[Binding]:
    return [b for b in BINDINGS.values() if b.status == "bound"]
