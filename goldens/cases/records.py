"""The golden cases of the operator records (``kernels.record``): one ``Case`` per record case and geometry, its
name the case's (with the geometry's suffix: ``v4_gate_hash``, ``v4_gate_hash_pro``), its reference the record's
call on the reference function (whose code the tree's fingerprint walks), its run the same call on a backend's
operator, its comparators the record's. Nothing here is written per operator. Spec: §7.2.
"""

from __future__ import annotations

from goldens.cases import Case
from kernels.record import GEOMETRIES, SMALL, Record, geometry_config, records


def record_case(record: Record, spec, geometry: str) -> Case:
    """The golden case of one record case at one geometry."""
    from contracts.operators import OPERATORS

    config = geometry_config(geometry)
    fn = OPERATORS[record.operator].function
    call, build, outputs = record.call, spec.build, record.comparators(geometry)
    return Case(name=spec.name + GEOMETRIES[geometry][1], operator=record.operator, description=spec.description,
                wirings=tuple(spec.wirings), modules=(OPERATORS[record.operator].module, *record.modules),
                build_inputs=lambda seed, wiring: build(seed, wiring, config),
                reference=lambda i, w: call(fn, i, config),
                run=lambda b, i, w: call(b.get(record.operator), i, config),
                comparators=lambda w: dict(outputs), preset=config.name,
                params={**spec.params, **({} if geometry in SMALL else {"preset": config.name})})


def cases_at(geometry: str) -> list[Case]:
    """Every record case built at ``geometry``, in operator order."""
    return [record_case(r, spec, geometry) for r in records().values() for spec in r.cases
            if geometry in spec.geometries]


CASES = [c for geometry in SMALL for c in cases_at(geometry)]
