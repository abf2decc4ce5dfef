"""One declarative record per operator, living with its reference (in the spirit of PyTorch's OpInfo).

A reference module declares its operator with ``@operator`` and, beside it, ``RECORD = Record(...)``: how the
operator is called on a dict of tensors, the comparator of each output (its bound lives once, in
``contracts.tolerances``), the cases it is recorded at (one input builder per case, built at every geometry it
names: no copy between the tiny twin and V4-Pro's own dims), the calls it must refuse, and its bindings per upstream
model folder (the golden a backend adapts, the kernel entry a device runs, or why there is none).

What is derived from the records, never written again: the golden cases (``goldens.cases.records``: names,
reference, run, comparators, fingerprint modules), docs/backends.md's cases, tolerances and bindings, the bad-call
contract (``contracts/test_records.py``) and the per-folder binding rows. Seeded defects stay beside the contracts
that catch them (``SEEDED_DEFECTS`` of the contract file, ``pto_pytest.defect``): they are test code, and a record
is product code. Spec: §7.2.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache

import torch

Tensors = dict[str, torch.Tensor]

# The geometries a case is built at: a config preset each (kernels.config), and the suffix of the case's name.
GEOMETRIES = {"tiny": ("V4_PRO_TINY", ""), "pro": ("V4_PRO", "_pro"), "flash-tiny": ("V4_FLASH_TINY", "_flash_tiny"),
              "v4-flash": ("V4_FLASH", "_v4_flash"), "dspark": ("V4_FLASH_DSPARK", "_dspark"),
              "v4-flash-ep2": ("V4_FLASH_EP2", "_v4_flash_ep2")}
# Upstream's model folders (pypto-lib main, and the V4.1-Flash tree read through the search tools).
FOLDERS = ("deepseek_v4_pro", "deepseek_v4_flash_mtp", "deepseek_v4_flash_dspark")
# --model: a folder, or a folder with one of its presets (V4-Pro's folder built for Flash, DEEPSEEK_V4_VARIANT=flash)
MODELS = (*FOLDERS, "deepseek_v4_pro:flash")


def folder_of(model: str) -> str:
    """The model folder of a --model value (``deepseek_v4_pro:flash`` -> ``deepseek_v4_pro``)."""
    return model.split(":", 1)[0]


def preset_of(model: str) -> str:
    """The folder preset a --model value selects ("" for the folder's default)."""
    return model.split(":", 1)[1] if ":" in model else ""


SMALL = ("tiny", "flash-tiny")  # the geometries of the sample store and of the contracts (the others: --geometry)


def geometry_config(geometry: str):
    """The kernel preset a case is built and called at."""
    from kernels import config

    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry {geometry!r}: expected one of {sorted(GEOMETRIES)}")
    return getattr(config, GEOMETRIES[geometry][0]).kernel_preset()


@dataclass(frozen=True)
class CaseSpec:
    """One recordable case: ``build(seed, wiring, config) -> inputs``, built at each of ``geometries``."""

    name: str
    description: str
    build: Callable[..., Tensors]
    geometries: tuple[str, ...] = ("tiny",)
    wirings: tuple[str, ...] = ("replicated",)
    params: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class BadCall:
    """A call the operator must refuse with ``ContractInputError`` naming ``field``: ``change`` turns the inputs
    of ``case`` (a case name of the record, built at its first geometry) into the bad ones."""

    name: str
    case: str
    change: Callable[[Tensors], Tensors]
    field: str


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def int8_codes(shape, g: torch.Generator) -> torch.Tensor:
    """Random INT8 codes in [-127, 127] (never -128: the symmetric code range)."""
    return torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)


def is_tiny(config) -> bool:
    """A tiny twin (the sample store's and the contracts' dims), not a model's own geometry."""
    return config.name.endswith("tiny")


def replaced(**changes) -> Callable[[Tensors], Tensors]:
    """A bad call's change: each named input replaced by a value, or by ``f(inputs)`` where a function is given."""
    return lambda i: {**i, **{k: v(i) if callable(v) else v for k, v in changes.items()}}


@dataclass(frozen=True)
class Upstream:
    """How one upstream model folder provides the operator: ``golden`` (``file.py::function``, the Torch golden an
    upstream backend adapts), ``entry`` (``file.py::function``, the kernel a device backend runs), and ``none``:
    why a missing one is missing (fused into another golden, an inline helper, not in this folder)."""

    folder: str
    golden: str = ""
    entry: str = ""
    none: str = ""

    def __post_init__(self):
        if self.folder not in FOLDERS:
            raise ValueError(f"Upstream folder {self.folder!r}: expected one of {FOLDERS}")
        if not (self.golden and self.entry) and not self.none:
            raise ValueError(f"Upstream {self.folder}: say why the golden or the entry is missing (none=...)")


def in_all_folders(*, golden: str, entry: str) -> tuple[Upstream, ...]:
    """The same golden and entry (file::function) in each of upstream's V4 folders."""
    return tuple(Upstream(f, golden=golden, entry=entry) for f in FOLDERS)


def dspark_only(what: str, *, golden: str = "", entry: str = "", none: str = "") -> tuple[Upstream, ...]:
    """An operator of dspark's folder alone: ``what`` names it where the other folders say why they have none."""
    why = f"{what} is dspark's (no module of this folder)"
    return (Upstream("deepseek_v4_pro", none=why), Upstream("deepseek_v4_flash_mtp", none=why),
            Upstream("deepseek_v4_flash_dspark", golden=golden, entry=entry, none=none))


@dataclass(frozen=True)
class Record:
    operator: str
    call: Callable[..., Tensors]  # (fn, inputs, config) -> {output: tensor}
    outputs: Mapping[str, str]  # output -> comparator name (bound: contracts.tolerances)
    cases: tuple[CaseSpec, ...]
    modules: tuple[str, ...] = ()  # further modules whose arithmetic the expected outputs go through
    bad_calls: tuple[BadCall, ...] = ()
    bindings: tuple[Upstream, ...] = ()
    # per geometry, the outputs judged otherwise there (a 7168-term FP32 sum moves a scale past 4 ulps at Pro's dims);
    # None: not an output there (the kernel entry compiled at that geometry hands back only the others)
    outputs_at: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)

    def __post_init__(self):
        names = [c.name for c in self.cases]
        if len(set(names)) != len(names):
            raise ValueError(f"record {self.operator}: two cases named alike: {names}")
        unknown = [b.case for b in self.bad_calls if b.case not in names]
        if unknown:
            raise ValueError(f"record {self.operator}: bad calls name unknown cases {unknown}")
        folders = [b.folder for b in self.bindings]
        if len(set(folders)) != len(folders):
            raise ValueError(f"record {self.operator}: a folder bound twice: {folders}")

    def comparators(self, geometry: str) -> dict[str, str]:
        return {k: v for k, v in {**self.outputs, **self.outputs_at.get(geometry, {})}.items() if v is not None}

    def dropped(self, geometry: str) -> frozenset[str]:
        """The outputs ``outputs_at`` takes away at ``geometry`` (a call's result loses them there)."""
        return frozenset(k for k, v in self.outputs_at.get(geometry, {}).items() if v is None)

    def small_geometry(self, case: str) -> str | None:
        """The geometry a case is judged at in the contracts (its first small one; None: a model's own only)."""
        return next((g for g in self.case(case).geometries if g in SMALL), None)

    def case(self, name: str) -> CaseSpec:
        return next(c for c in self.cases if c.name == name)

    def upstream(self, folder: str) -> Upstream | None:
        return next((b for b in self.bindings if b.folder == folder), None)


@cache
def records() -> dict[str, Record]:
    """Every ``Record`` a module under ``kernels`` holds at module level (``RECORD``, or ``<NAME>_RECORD`` where a
    module declares several operators), by operator; one record per operator."""
    import kernels

    found: dict[str, Record] = {}
    for info in pkgutil.walk_packages(kernels.__path__, "kernels."):
        for record in vars(importlib.import_module(info.name)).values():
            if not isinstance(record, Record) or found.get(record.operator) is record:
                continue
            if record.operator in found:
                raise ValueError(f"operator {record.operator!r} has two records")
            found[record.operator] = record
    return dict(sorted(found.items()))
