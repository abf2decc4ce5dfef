"""Tree records: what a replay tree is (case, operator, preset, wiring, seed, ordered argument spec,
comparators, versions, reference fingerprint), stored as the tree group's attributes.

Spec: §7.3 (ScalarSpec / in / out / inout directions), §7.2 (wirings).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from goldens.errors import GoldenStoreError

WIRINGS = ("replicated", "sharded")
DIRECTIONS = ("in", "out", "inout")
SCHEMA = 2  # 2: the record is checksummed and lists every array's digest


def record_checksum(attrs: dict) -> str:
    """Digest of a tree record's attributes (everything but the checksum itself), in canonical JSON."""
    body = {k: v for k, v in attrs.items() if k != "checksum"}
    return hashlib.blake2b(json.dumps(body, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class ArgSpec:
    """One argument: ``in`` (input), ``out`` (pure output), ``inout`` (initialized output); scalars are
    0-dim tensors stored under in/."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    direction: str
    scalar: bool = False

    @property
    def is_input(self) -> bool:
        return self.direction in ("in", "inout")

    @property
    def is_output(self) -> bool:
        return self.direction in ("out", "inout")


@dataclass(frozen=True)
class TreeRecord:
    case: str
    operator: str
    preset: str
    wiring: str
    seed: int
    args: tuple[ArgSpec, ...]
    comparators: dict[str, str]
    params: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    fingerprint: str = ""
    rounding: dict = field(default_factory=dict)
    source: str = "record"
    tolerances: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)  # "in/<name>" / "out/<name>" -> content digest
    fingerprint_parts: dict = field(default_factory=dict)  # what the reference reaches -> its digest
    base_case: str = ""  # a counterexample tree: the case whose operator, call and comparators it uses
    # a tree recorded from upstream's goldens (goldens record --from upstream): repository, commit, the golden
    # functions, the named variants it is judged by; its expected outputs are upstream's numbers
    upstream: dict = field(default_factory=dict)

    def to_attrs(self) -> dict:
        d = asdict(self)
        d["args"] = [{**a, "shape": list(a["shape"])} for a in d["args"]]
        d["schema"] = SCHEMA
        d["checksum"] = record_checksum(d)
        return d

    @property
    def outputs(self) -> list[str]:
        return [a.name for a in self.args if a.is_output]

    @classmethod
    def from_attrs(cls, attrs: dict, *, where: str) -> TreeRecord:
        def need(key, kind):
            if key not in attrs:
                raise GoldenStoreError(f"{where}: tree attribute {key!r} is missing")
            value = attrs[key]
            if not isinstance(value, kind):
                raise GoldenStoreError(f"{where}: attribute {key!r}: expected {kind.__name__}, got {value!r}")
            return value

        if attrs.get("schema") != SCHEMA:
            raise GoldenStoreError(f"{where}: tree schema {attrs.get('schema')!r}, expected {SCHEMA} (a tree from an "
                                   "older store: record it again)")
        if attrs.get("checksum") != record_checksum(attrs):
            raise GoldenStoreError(f"{where}: the tree record fails its checksum (its attributes were changed or "
                                   "damaged); refusing to judge it: record the tree again")
        wiring = need("wiring", str)
        if wiring not in WIRINGS:
            raise GoldenStoreError(f"{where}: attribute 'wiring': expected one of {WIRINGS}, got {wiring!r}")
        args = []
        for i, a in enumerate(need("args", list)):
            try:
                spec = ArgSpec(a["name"], tuple(int(s) for s in a["shape"]), a["dtype"], a["direction"],
                               bool(a.get("scalar", False)))
            except (KeyError, TypeError, ValueError) as exc:
                raise GoldenStoreError(f"{where}: args[{i}] is malformed: {a!r}") from exc
            if spec.direction not in DIRECTIONS:
                raise GoldenStoreError(f"{where}: args[{i}].direction: expected {DIRECTIONS}, got {spec.direction!r}")
            args.append(spec)
        record = cls(case=need("case", str), operator=need("operator", str), preset=need("preset", str),
                   wiring=wiring, seed=need("seed", int), args=tuple(args), comparators=need("comparators", dict),
                   params=attrs.get("params", {}), versions=attrs.get("versions", {}),
                   fingerprint=need("fingerprint", str), rounding=attrs.get("rounding", {}),
                   source=attrs.get("source", "record"), tolerances=attrs.get("tolerances", {}),
                   arrays=need("arrays", dict), fingerprint_parts=attrs.get("fingerprint_parts", {}),
                   base_case=attrs.get("base_case", ""), upstream=attrs.get("upstream", {}))
        outputs = set(record.outputs)
        if set(record.comparators) != outputs:
            missing, extra = sorted(outputs - set(record.comparators)), sorted(set(record.comparators) - outputs)
            raise GoldenStoreError(f"{where}: the comparator map does not cover the outputs (unjudged {missing}, "
                                   f"unknown {extra}); refusing a tree that would pass without judging them")
        listed = {f"in/{a.name}" for a in record.args if a.is_input} | \
                 {f"out/{a.name}" for a in record.args if a.is_output}
        if set(record.arrays) != listed:
            raise GoldenStoreError(f"{where}: the record lists arrays {sorted(record.arrays)}, its arguments need "
                                   f"{sorted(listed)}")
        return record


ACTUAL_ROOT = "actual"  # goldens replay --keep-actual: actual/<source>/<case>/<wiring>/<output>


def tree_path(case: str, wiring: str) -> str:
    if wiring not in WIRINGS:
        raise GoldenStoreError(f"wiring: expected one of {WIRINGS} (one ABI per tree; 'both' is not a tree), "
                               f"got {wiring!r}")
    return f"{case}/{wiring}"


def select_wirings(option: str) -> tuple[str, ...]:
    """``both`` -> (replicated, sharded) in that order; a single name -> itself. Spec: §7.2."""
    if option == "both":
        return WIRINGS
    if option in WIRINGS:
        return (option,)
    raise GoldenStoreError(f"--wiring: expected both, replicated or sharded, got {option!r}")
