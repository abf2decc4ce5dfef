"""Every ``covered`` row of docs/coverage.md names an edit of the reference that its cited tests catch (#47 item 4).

    .venv/bin/python -m tests.mutation.rows                  # every row's edit, 2 workers (about 2 min)
    .venv/bin/python -m tests.mutation.rows --only 'SC-*' --verbose
    .venv/bin/python -m tests.mutation.rows --list           # each covered row and the edit it names

A row names its edit one of two ways:

- a **seeded defect** declared beside one of its cited tests (``SEEDED_DEFECTS`` of the contract file, run by
  tests/test_seeded_defects.py in every CI run): the defect is the edit, and its contract is shown to catch it;
- an entry of ``EDITS`` below (the rows whose tests check a configuration, a refusal or a harness function,
  which a backend operator cannot replace): one literal edit of a project source file -- the change a maintainer
  could make to the reference -- that this tool applies in a shadow copy of the tree before running the row's
  cited tests with ``-x``. The edit is caught when one of them fails.

``tests/test_coverage_doc.py::test_every_covered_row_names_an_edit_its_tests_catch`` holds the static half in CI
(every covered row names one, each ``EDITS`` text occurs exactly once where it says); this tool runs the edits.
Exit code 0 when every edit is caught, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Edit:
    path: str  # a project file, relative to the root
    old: str  # occurs exactly once in it
    new: str


# row -> the edit its cited tests must catch (rows whose cited tests carry no seeded defect)
EDITS: dict[str, Edit] = {
    # schedule / config (kernels/config.py)
    "SC-01": Edit("kernels/config.py", '        for name in ("hidden_size", "vocab_size", "num_hidden_layers",',
                  '        for name in ("num_hidden_layers",'),
    "SC-02": Edit("kernels/config.py", '        if self.num_attention_heads % self.o_groups:\n            self._fail("o_groups"',
                  '        if False:\n            self._fail("o_groups"'),
    "SC-03": Edit("kernels/config.py", "        if self.index_head_dim < self.qk_rope_head_dim:", "        if False:"),
    "SC-04": Edit("kernels/config.py", "        if self.n_routed_experts < self.num_experts_per_tok:", "        if False:"),
    "SC-06": Edit("kernels/config.py", "            if ratio not in (0, 1, 2):", "            if False:"),
    "SC-07": Edit("kernels/config.py", "                if ratios[layer] == 0:", "                if False:"),
    "SC-10": Edit("kernels/config.py", "                0 <= layer_id < self.num_hidden_layers):",
                  "                0 <= layer_id <= self.num_hidden_layers):"),
    "SC-12": Edit("kernels/config.py", "    index_source_layer_ids: tuple[int, ...] = (2, 8, 14, 20, 24, 28, 32, 36)",
                  "    index_source_layer_ids: tuple[int, ...] = (2, 8, 14, 20, 24, 28, 32)"),
    "SC-15": Edit("kernels/config.py", "        if AttentionMode(mode) == AttentionMode.SWA:",
                  "        if AttentionMode(mode) != AttentionMode.SWA:"),
    "SC-16": Edit("kernels/config.py", "        if self.tp not in SUPPORTED_TP:", "        if False:"),
    "SC-17": Edit("kernels/config.py", "    max_batch_per_dp: int = 32", "    max_batch_per_dp: int = 16"),
    "SC-18": Edit("kernels/config.py", "    rms_norm_eps: float = 1e-20", "    rms_norm_eps: float = 1e-6"),
    "SC-19": Edit("kernels/prefill_plan.py", "        if layer.kind not in table or layer.compress_ratio not in ratios:",
                  "        if False:"),
    "SC-20": Edit("kernels/prefill_plan.py", "        encoder = layer.layer_id < split",
                  "        encoder = layer.layer_id <= split"),
    "SC-21": Edit("kernels/prefill_plan.py", "    if isinstance(layer_id, bool) or not 0 <= layer_id < "
                  "config.candidate_source_layer_id:", "    if False:"),
    "SC-22": Edit("kernels/half_layer.py", "    allowed_tp = tuple(t for t in SUPPORTED_TP if not (kind is LayerKind.SWA "
                  'and phase == "decode" and t == 8))', "    allowed_tp = SUPPORTED_TP"),
    "SC-23": Edit("kernels/reference/lm_head.py", "    if dp % tp:", "    if False:"),
    "SC-27": Edit("kernels/half_layer.py", "        if actual is not kind:", "        if False:"),
    "V4-01": Edit("kernels/config.py", "        if ep not in SUPPORTED_EP:", "        if False:"),
    "V4-02": Edit("kernels/config.py", "        if tp not in (2, 4, 8):", "        if False:"),
    "V4-03": Edit("kernels/config.py", "        if tp not in (2, 4, 8):", "        if False:"),
    "V4-04": Edit("kernels/config.py", "        if ep not in SUPPORTED_EP:", "        if False:"),
    "V4-05": Edit("kernels/config.py", "        return layer_id < self.num_hash_layers",
                  "        return layer_id <= self.num_hash_layers"),
    "V4-19": Edit("kernels/config.py", "        if tp not in (2, 4, 8):", "        if False:"),
    # metadata / prefill plan / half-layer call
    "MD-17": Edit("kernels/prefill_plan.py", "        if available < from_cache:", "        if False:"),
    "MD-20": Edit("kernels/prefill_plan.py", "    if state.num_tokens != rows:", "    if False:"),
    "MD-21": Edit("kernels/prefill_plan.py", "        if not lengths:", "        if False:"),
    "MD-22": Edit("kernels/prefill_plan.py", "        if x.ndim not in (3, 4) or tuple(x.shape[-2:]) != (c.hc_mult, "
                  "c.hidden_size):", "        if False:"),
    "MD-23": Edit("kernels/prefill_plan.py", "        if layer_id >= self.config.candidate_source_layer_id and not "
                  "self.published:", "        if False:"),
    "AP-16": Edit("kernels/prefill_plan.py", "                if cache is not None and cache.dtype != torch.float32:",
                  "                if False:"),
    "MD-30": Edit("kernels/half_layer.py", "    if not 1 <= requests <= most:", "    if not 1 <= requests:"),
    "MD-31": Edit("kernels/prefill_plan.py", '    elif name == "causal":', "    elif False:"),
    "MD-32": Edit("kernels/reference/moe.py", "        if not 0 <= n <= min(MOE_TOKENS, rows[r]):",
                  "        if not 0 <= n <= rows[r]:"),
    "CH-02": Edit("kernels/config.py", "        if any(not is_int(i) or i < 0 for i in ids) or len(set(ids)) != len(ids):",
                  "        if False:"),
    "CH-03": Edit("kernels/half_layer.py", "    if not 1 <= tokens <= capacity:", "    if not 1 <= tokens:"),
    "CH-04": Edit("kernels/half_layer.py", '    if phase == "decode" and kind is not LayerKind.C2A_REUSE and active != '
                  "tokens:", "    if False:"),
    "CH-07": Edit("kernels/sequence_parallel.py", "    if len(counts) != dp:", "    if False:"),
    "CH-11": Edit("kernels/config.py", "        if self.dp is not None and self.dp != self.ep // self.tp:", "        if False:"),
    "MO-13": Edit("kernels/config.py", "        if len(ids) != self.world_size:", "        if False:"),
    # cache layout / quantization / checkpoint
    "CQ-01": Edit("kernels/config.py", "    window_cache_group: int = 32", "    window_cache_group: int = 64"),
    "CQ-15": Edit("kernels/reference/quant_linear.py", "    return blocks.permute(*range(d), d + 2, d, d + 3, d + 1)"
                  ".contiguous().reshape(*lead, groups, n)", "    return blocks.permute(*range(d), d, d + 2, d + 3, d + 1)"
                  ".contiguous().reshape(*lead, groups, n)"),
    "CQ-16": Edit("kernels/reference/quant_linear.py", "    return out if output_dtype == torch.float32 else "
                  "out.to(torch.bfloat16)", "    return out.to(torch.bfloat16).float() if output_dtype == torch.float32 "
                  "else out.to(torch.bfloat16)"),
    "CQ-18": Edit("kernels/reference/quant_linear.py", "    if bias is not None:", "    if False:"),
    "CQ-19": Edit("kernels/checkpoint.py", "    if weight.dtype in (torch.float32, torch.bfloat16):", "    if False:"),
    "CQ-20": Edit("kernels/checkpoint_reader.py", '        if quant.get("quant_method") != "fp8" or '
                  'quant.get("weight_block_size") != [BLOCK, BLOCK]:', "        if False:"),
    "CQ-21": Edit("kernels/checkpoint_reader.py", "    return w.t().contiguous().view(torch.float8_e4m3fn), ",
                  "    return w.contiguous().view(torch.float8_e4m3fn), "),
    "CQ-22": Edit("kernels/checkpoint.py", '    if stem.endswith(".attn.wo_a"):\n        return "bf16"',
                  '    if stem.endswith(".attn.wo_a"):\n        return "fp32"'),
    "CQ-23": Edit("kernels/checkpoint_reader.py", "        if value >= OFFSET_LIMIT:", "        if False:"),
    # compressor state / RoPE rows / mHC / indexer / attention
    "CS-18": Edit("goldens/cases/cache.py", '                                requests, inputs["state_block_table"], state, '
                  "weights)", '                                requests, inputs["state_block_table"], '
                  'inputs["state_cache"].clone(), weights)'),
    "CS-19": Edit("kernels/prefill_plan.py", "        first, last = max(int(starts[b]), int(starts[b + 1]) - "
                  "state_capacity), int(starts[b + 1])", "        first, last = int(starts[b]), int(starts[b + 1])"),
    "RR-01": Edit("kernels/reference/rope.py", "    if not is_int(length) or length <= 0:", "    if False:"),
    "RR-10": Edit("kernels/reference/compressor.py", "    value = rope_interleave(latent, rope_cos, rope_sin)",
                  "    value = rope_interleave(latent, rope_cos, -rope_sin)"),
    "RR-11": Edit("kernels/reference/compressor.py", "    key = rms_norm(project(latent, index_wk)",
                  "    key = rms_norm(project(value, index_wk)"),
    "RR-12": Edit("kernels/reference/o_proj.py", "rope_sin.unsqueeze(1), inverse=True)",
                  "rope_sin.unsqueeze(1), inverse=False)"),
    "HC-06": Edit("kernels/reference/mhc.py", "    mix[:, 0] = 1.0", "    mix[:, 1] = 1.0"),
    "IX-01": Edit("kernels/reference/indexer.py", "    if compressed_lens.ndim != 1 or compressed_lens.shape[0] != "
                  "q.shape[0]:", "    if False:"),
    "IX-02": Edit("kernels/reference/indexer.py", "    valid = pos < lens.unsqueeze(-1)",
                  "    valid = pos <= lens.unsqueeze(-1)"),
    "IX-12": Edit("contracts/checks/topk.py", "    if not validity.ok:", "    if False:"),
    "AP-07": Edit("kernels/reference/attention.py", "    probs = torch.softmax(logits, dim=-1)[..., :-1]",
                  "    probs = torch.softmax(logits[..., :-1], dim=-1)"),
    "AP-13": Edit("contracts/checks/precision.py", "    if bool(nonfinite.any()) or n_bad > max_error_ratio * n:",
                  "    if bool(nonfinite.any()) or n_bad > 2 * max_error_ratio * n:"),
    "AP-20": Edit("kernels/reference/attention_layer.py", '    out = attention_half_layer(inputs, ops={"select_topk": '
                  'capture}, **call)', '    out = attention_half_layer(inputs, ops={"select_topk": capture}, **call)\n'
                  '    out["output"] = out["output"].float()'),
    # MoE
    "MO-10": Edit("goldens/cases/moe.py", "c.num_experts_per_tok).round().long()] = 4.0",
                  "c.num_experts_per_tok).round().long()] = 0.5"),
    "MO-14": Edit("kernels/reference/block.py", '    total = o["moe_expert"](x, shared, None, config=config)',
                  '    total = 0 * o["moe_expert"](x, shared, None, config=config)'),
    # SP / replay / the golden store
    "SP-01": Edit("contracts/result.py", "    if last is None:", "    if False:"),
    "SP-02": Edit("goldens/catalog.py", '    if option == "both":', '    if option != "both":'),
    "SP-03": Edit("goldens/trees.py", "    if rec.wiring != wiring or rec.case != case_name:", "    if False:"),
    "RP-01": Edit("goldens/trees.py", '            if (kind == "in" and spec.is_input) or (kind == "out" and '
                  "spec.is_output):", '            if (kind == "in" and spec.is_input and not spec.is_output) or '
                  '(kind == "out" and spec.is_output):'),
    "RP-02": Edit("goldens/trees.py", "                if not path.exists():\n                    raise GoldenStoreError"
                  '(f"{path}: missing file', "                if False:\n                    raise GoldenStoreError"
                  '(f"{path}: missing file'),
    "RP-03": Edit("goldens/codec.py", "    if logical in _BIT_VIEWS:", "    if False:"),
    "RP-05": Edit("goldens/trees.py", "    if rec.wiring != wiring or rec.case != case_name:", "    if False:"),
    "RP-06": Edit("goldens/trees.py", "            actual = tree.case.run(backend, _clone(tree.inputs), tree.record.wiring)",
                  "            actual = tree.case.run(backend, tree.inputs, tree.record.wiring)"),
    "RP-08": Edit("goldens/trees.py", "        report.append((name, wiring, [d for d in deltas if d.elements_changed], "
                  "change))", "        report.append((name, wiring, deltas, change))"),
    # V4
    "V4-07": Edit("kernels/v4/decode_metadata.py", "    uncommitted = torch.arange(seq).repeat(batch) >= committed",
                  "    uncommitted = torch.arange(seq).repeat(batch) > committed"),
    "V4-09": Edit("kernels/v4/decode_metadata.py", "    if not is_int(committed) or not 0 <= committed <= seq:",
                  "    if False:"),
    "V4-18": Edit("contracts/compare.py", "pct_thd=pct_thd)\n    return precision.check_owned_rows(a, e, "
                  "ctx.inputs[name], leaf=leaf, name=name)", "pct_thd=pct_thd)\n    return leaf(a, e, name=name)"),
}


def seeded_rows() -> dict[str, list[str]]:
    """row -> the seeded defects declared for its cited tests."""
    from tests.test_coverage_doc import TEST_REF, V4_ID, rows
    from tests.test_seeded_defects import DECLARED

    by_test: dict[tuple[str, str], list[str]] = {}
    for module, d in DECLARED:
        by_test.setdefault((f"contracts/{module.split('.')[-1]}.py", d.test), []).append(d.name)
    out = {}
    for r in rows() + rows(V4_ID):
        if r["status"] == "covered":
            out[r["id"]] = [n for p, t in TEST_REF.findall(r["evidence"]) for n in by_test.get((p, t), [])]
    return out


def cited(row: str) -> list[str]:
    from tests.test_coverage_doc import TEST_REF, V4_ID, rows

    r = next(r for r in rows() + rows(V4_ID) if r["id"] == row)
    return sorted({f"{p}::{t}" for p, t in TEST_REF.findall(r["evidence"])})


def problems() -> list[str]:
    """Why a covered row names no edit, or an edit would seed nothing (the static check CI runs)."""
    out = []
    seeded = seeded_rows()
    for row, defects in sorted(seeded.items()):
        if not defects and row not in EDITS:
            out.append(f"{row}: no seeded defect of a cited test and no entry in tests.mutation.rows.EDITS")
    for row, e in sorted(EDITS.items()):
        if row not in seeded:
            out.append(f"{row}: EDITS names a row that is not covered")
            continue
        path = ROOT / e.path
        count = path.read_text().count(e.old) if path.is_file() else -1
        if count != 1:
            out.append(f"{row}: {e.path} holds the edit's old text {count} times (expected once)")
        if e.old == e.new:
            out.append(f"{row}: the edit changes nothing")
    return out


def _span(subject: str) -> tuple[Path, int, int] | None:
    """(file, first line, last line) of a row's subject: an operator (its reference implementation) or a dotted
    module.function / module.Class / module.Class.method / module.CONSTANT path."""
    import importlib
    import inspect

    obj = None
    if "." not in subject:
        from backends import torch_backend

        try:
            obj = torch_backend().get(subject)
        except Exception:  # noqa: BLE001 (not an operator)
            return None
    else:
        parts = subject.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for name in parts[cut:]:
                    obj = getattr(obj, name)
            except AttributeError:
                return None
            break
    obj = inspect.unwrap(obj) if callable(obj) else obj
    try:
        lines, first = inspect.getsourcelines(obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj))
        path = Path(inspect.getsourcefile(obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)))
    except (TypeError, OSError):
        return None
    if ROOT not in path.parents:
        return None
    return path, first, first + len(lines) - 1


_FLIP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}


def candidates(subject: str) -> list[Edit]:
    """Edits of a subject's source that a maintainer could make: a guard that raises or reports a failure never
    taken, a comparison flipped at its boundary, an integer or float constant moved. Each edit's old text is one
    whole source line, unique in its file."""
    import ast
    import re

    span = _span(subject)
    if span is None:
        return []
    path, first, last = span
    text = path.read_text()
    lines = text.splitlines()
    rel = str(path.relative_to(ROOT))
    out: list[Edit] = []

    def add(lineno: int, new_line: str) -> None:
        old = lines[lineno - 1]
        if old != new_line and text.count(old) == 1 and old.strip():
            out.append(Edit(rel, old, new_line))

    tree = ast.parse(text)
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or not first <= node.lineno <= last:
            continue
        if isinstance(node, ast.If) and node.test.lineno == node.test.end_lineno:
            body = [n for s in node.body for n in ast.walk(s)]
            if any(isinstance(n, ast.Raise) for n in body) or any(
                    isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) in
                    ("_fail", "fail", "failed") for n in body):
                line = lines[node.lineno - 1]
                cond = ast.get_source_segment(text, node.test)
                if cond and line.count(cond) == 1:
                    add(node.lineno, line.replace(cond, "False", 1))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and first <= node.lineno <= last and node.lineno == node.end_lineno:
            line = lines[node.lineno - 1]
            for op in node.ops:
                sym = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}.get(
                    type(op))
                if sym and len(re.findall(rf"(?<![<>=!]){re.escape(sym)}(?![<>=])", line)) == 1:
                    add(node.lineno, re.sub(rf"(?<![<>=!]){re.escape(sym)}(?![<>=])", _FLIP[sym], line, count=1))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and first <= node.lineno <= last and type(node.value) in (int, float) \
                and node.value not in (0, 1, -1):
            line = lines[node.lineno - 1]
            seg = ast.get_source_segment(text, node)
            if seg and len(re.findall(rf"(?<![\w.]){re.escape(seg)}(?![\w.])", line)) == 1:
                moved = repr(node.value * 2) if isinstance(node.value, int) else repr(node.value * 10)
                add(node.lineno, re.sub(rf"(?<![\w.]){re.escape(seg)}(?![\w.])", moved, line, count=1))
    seen, unique = set(), []
    for e in out:
        if e.old not in seen:
            seen.add(e.old)
            unique.append(e)
    return unique


def _run(row: str, edit: Edit, tests: list[str], shadow: Path, timeout: float) -> tuple[str, str]:
    from tests.mutation.clauses import run_edited

    target = shadow / edit.path
    return run_edited(target, target.read_text().replace(edit.old, edit.new, 1), tests, shadow, timeout)


def main(argv: list[str] | None = None) -> int:
    from tests.mutation.clauses import _shadow

    p = argparse.ArgumentParser(prog="python -m tests.mutation.rows", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", metavar="GLOB", help="rows whose ID matches (e.g. 'SC-*')")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per row before it counts as killed")
    p.add_argument("--list", action="store_true", help="each covered row and the edit it names, then exit")
    p.add_argument("--verbose", "-v", action="store_true", help="the test that caught each edit")
    p.add_argument("--propose", action="store_true",
                   help="for rows naming nothing: try edits of the row's subjects (guards dropped, comparisons "
                        "flipped, constants moved) until the cited tests catch one, and print it as an EDITS entry")
    p.add_argument("--tries", type=int, default=8, help="--propose: candidate edits tried per row (default 8)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    seeded = seeded_rows()
    chosen = [r for r in sorted(seeded) if not args.only or any(fnmatch.fnmatch(r, g) for g in args.only)]
    if not chosen:
        print("no covered row matches --only", file=sys.stderr)
        return 2
    if args.list:
        for r in chosen:
            what = f"seeded defects {', '.join(seeded[r])}" if seeded[r] else \
                f"edit {EDITS[r].path}: {EDITS[r].old!r} -> {EDITS[r].new!r}" if r in EDITS else "NOTHING"
            print(f"{r}  {what}")
        return 0
    if args.propose:
        return _propose([r for r in chosen if not seeded[r] and r not in EDITS], args)
    bad = problems()
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    work = [(r, EDITS[r], cited(r)) for r in chosen if not seeded[r]]
    shadows = [_shadow() for _ in range(min(args.jobs, max(1, len(work))))]
    start = time.monotonic()
    results: dict[str, tuple[str, str]] = {}
    try:
        def job(i: int):
            for k in range(i, len(work), len(shadows)):
                row, edit, tests = work[k]
                results[row] = _run(row, edit, tests, shadows[i], args.timeout)
        with ThreadPoolExecutor(len(shadows)) as pool:
            list(pool.map(job, range(len(shadows))))
    finally:
        for s in shadows:
            shutil.rmtree(s, ignore_errors=True)
    for row, _e, _t in work:
        outcome, detail = results[row]
        if args.verbose or not outcome.startswith("killed"):
            print(f"{outcome:16} {row}  {detail}")
    caught = sum(1 for row, _e, _t in work if results[row][0].startswith("killed"))
    print(f"{caught}/{len(work)} row edits caught by the rows' cited tests; {len(chosen) - len(work)} rows name a "
          f"seeded defect (tests/test_seeded_defects.py) ({time.monotonic() - start:.0f} s, {len(shadows)} workers)")
    return 0 if caught == len(work) else 1


def _propose(rows: list[str], args) -> int:
    from tests.mutation.clauses import _shadow
    from tests.test_coverage_doc import V4_ID
    from tests.test_coverage_doc import rows as doc_rows

    subjects = {r["id"]: [s.strip() for s in r["subject"].split(",") if s.strip()] for r in doc_rows() + doc_rows(V4_ID)}
    shadows = [_shadow() for _ in range(min(args.jobs, max(1, len(rows))))]
    found: dict[str, tuple[Edit | None, str]] = {}
    try:
        def job(i: int):
            for k in range(i, len(rows), len(shadows)):
                row = rows[k]
                tests = cited(row)
                found[row] = (None, "no candidate edit caught")
                tried = 0
                for subject in subjects[row]:
                    for edit in candidates(subject):
                        if tried >= args.tries:
                            break
                        tried += 1
                        outcome, detail = _run(row, edit, tests, shadows[i], args.timeout)
                        if outcome.startswith("killed"):
                            found[row] = (edit, detail)
                            break
                    if found[row][0] is not None:
                        break
                edit, detail = found[row]
                print(f"{row}: {'CAUGHT ' + detail if edit else 'NOTHING CAUGHT'} {edit!r}", flush=True)
        with ThreadPoolExecutor(len(shadows)) as pool:
            list(pool.map(job, range(len(shadows))))
    finally:
        for s in shadows:
            shutil.rmtree(s, ignore_errors=True)
    print("# proposed EDITS entries")
    for row in rows:
        edit, _detail = found[row]
        if edit is not None:
            print(f"    {row!r}: Edit({edit.path!r}, {edit.old!r}, {edit.new!r}),")
    return 0 if all(found[r][0] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
