"""A replay as one self-contained HTML page (``goldens report``, ``goldens replay --report DIR``, pytest
``--golden-report DIR``): per tree and output the verdict, the comparator and its bound, the failure message
with its evidence and cause, a plot of every row's error against its bound (failing rows in red), a
histogram of the element errors in ULPs of the output's dtype (format steps for packed FP4, codes for
E8M0), and the output's history in the store (the snapshots that changed its expected value). Plots are
matplotlib PNGs inlined as data URIs: the page needs no network and no other file.

The row profile uses the same rules as the comparators: floating outputs against the §6 row bound
(``contracts.checks.tolerances.ROW_BOUND``; the FP8 output budget's per-row relative L2 for ``fp8_budget``),
everything else (integers, masks, packed FP4, E8M0 scales) as the number of differing elements per row
against 0. Issue: goldens a kernel engineer trusts (item 7).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from contracts import tolerances
from contracts.evidence import e2m1_order, is_packed_fp4, is_payload, ordered
from goldens.formats import clip

PAGE = "index.html"
MAX_ROWS_LISTED = 12


@dataclass
class OutputReport:
    name: str
    comparator: str
    verdict: str  # PASS | FAIL
    bound: str
    message: str = ""
    cause: str = ""
    failing_rows: list[int] = field(default_factory=list)
    row_plot: str = ""  # data URI
    ulp_plot: str = ""
    ulp_note: str = ""
    history: list[tuple[str, str, str]] = field(default_factory=list)  # (snapshot, written, message)


@dataclass
class TreeReport:
    case: str
    wiring: str
    verdict: str  # PASS | FAIL | ERROR | SKIP | STALE
    detail: str = ""
    outputs: list[OutputReport] = field(default_factory=list)

    def as_json(self) -> str:
        return json.dumps({"case": self.case, "wiring": self.wiring, "verdict": self.verdict, "detail": self.detail,
                           "outputs": [o.__dict__ for o in self.outputs]})

    @classmethod
    def from_json(cls, text: str) -> TreeReport:
        d = json.loads(text)
        outs = [OutputReport(**{**o, "history": [tuple(h) for h in o["history"]]}) for o in d.pop("outputs")]
        return cls(**d, outputs=outs)


# ----------------------------------------------------------------------------------------------- numbers


def _rows(t: torch.Tensor) -> torch.Tensor:
    if t.ndim == 0:
        return t.reshape(1, 1)
    return t.reshape(-1, t.shape[-1]) if t.ndim > 1 else t.reshape(1, -1)


def row_profile(name: str, comparator: str, actual: torch.Tensor, expected: torch.Tensor
                ) -> tuple[np.ndarray, float, str]:
    """(per-row value, bound, what the value is): a row fails when its value exceeds the bound."""
    from kernels import quant

    a, e = actual.detach().cpu(), expected.detach().cpu()
    if comparator == "exact":  # byte identity: the row's differing bytes, whatever the dtype (never a §6 bound)
        ba = (a.reshape(1) if a.ndim == 0 else a).contiguous().view(torch.uint8)
        be = (e.reshape(1) if e.ndim == 0 else e).contiguous().view(torch.uint8)
        if ba.shape != be.shape:
            return np.full(1, np.inf), 0.0, "differing bytes per row (shapes differ)"
        return (_rows(ba) != _rows(be)).sum(1).numpy().astype(np.float64), 0.0, "differing bytes per row"
    payload = is_payload(name)  # a cache's codes: judged decoded, shown as codes
    if is_packed_fp4(name, a):
        a, e = quant.unpack_fp4(a), quant.unpack_fp4(e)
    if a.is_floating_point() and a.dtype != torch.float8_e8m0fnu and not payload:
        ra, re = _rows(a).to(torch.float64), _rows(e).to(torch.float64)
        diff = ra - re
        if comparator == "fp8_budget":
            rel = diff.norm(dim=1) / re.norm(dim=1).clamp_min(1e-300)
            return rel.nan_to_num(nan=np.inf).numpy(), tolerances.FP8_BUDGET.row_rel_l2, "row relative L2"
        b = tolerances.ROW_BOUND
        ref_rms = re.pow(2).mean(1).sqrt()
        rms = diff.pow(2).mean(1).sqrt() / (b.rms_atol + b.rms_rtol * ref_rms)
        peak = diff.abs().amax(1) / (b.peak_atol + b.peak_rtol * ref_rms)
        excess = torch.maximum(rms, peak).nan_to_num(nan=np.inf)
        return excess.numpy(), 1.0, "row error / §6 row bound (max of RMS and peak clauses)"
    if a.dtype.itemsize == 1 and a.is_floating_point():  # FP8 / E8M0 codes: compare the bytes
        a, e = a.view(torch.uint8), e.view(torch.uint8)
    return (_rows(a) != _rows(e)).sum(1).numpy().astype(np.float64), 0.0, "differing elements per row"


def element_distance(name: str, actual: torch.Tensor, expected: torch.Tensor) -> tuple[np.ndarray, str]:
    """Every differing element's distance in units of the output's format, and the unit's name."""
    from kernels import quant

    a, e = actual.detach().cpu().contiguous(), expected.detach().cpu().contiguous()
    if is_packed_fp4(name, a):
        d = (e2m1_order(quant.unpack_fp4(a)) - e2m1_order(quant.unpack_fp4(e))).abs().reshape(-1)
        return d[d > 0].numpy(), "E2M1 format steps"
    if a.dtype == torch.float8_e8m0fnu:
        d = (a.view(torch.uint8).to(torch.int64) - e.view(torch.uint8).to(torch.int64)).abs().reshape(-1)
        return d[d > 0].numpy(), "E8M0 codes (factors of two)"
    if a.is_floating_point():
        d = (ordered(a.reshape(-1)) - ordered(e.reshape(-1))).abs()
        return d[d > 0].numpy(), f"ULPs of {str(a.dtype).removeprefix('torch.')}"
    return np.zeros(0), ""


# ------------------------------------------------------------------------------------------------- plots


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(5.2, 2.2))


def row_plot(values: np.ndarray, bound: float, what: str, title: str) -> str:
    return _png(row_figure(values, bound, what, title))


def row_figure(values: np.ndarray, bound: float, what: str, title: str):
    """The per-row plot; its legend sits outside the axes, so it never hides a plotted point."""
    fig, ax = _figure()
    x = np.arange(len(values))
    shown = np.where(np.isfinite(values), values, np.nanmax(np.where(np.isfinite(values), values, 0)) * 2 + 1)
    bad = values > bound
    ax.scatter(x[~bad], shown[~bad], s=6, color="#2b7bba", label="within bound")
    if bad.any():
        ax.scatter(x[bad], shown[bad], s=14, color="#d62728", label="over bound")
    ax.axhline(bound, color="#d62728", linestyle="--", linewidth=1, label=f"bound {bound:g}")
    ax.set_xlabel("row")
    ax.set_ylabel(what if len(what) < 28 else what.split(" (")[0], fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def ulp_plot(distances: np.ndarray, unit: str, title: str) -> str:
    fig, ax = _figure()
    top = max(1, int(np.ceil(np.log2(distances.max() + 1))))
    bins = np.concatenate(([0.5], 2.0 ** np.arange(0, top + 1) + 0.5))
    ax.hist(distances, bins=bins, color="#6a51a3")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(unit)
    ax.set_ylabel("elements")
    ax.set_title(title, fontsize=9)
    return _png(fig)


# ---------------------------------------------------------------------------------------------- sections


def effective_comparator(comparator: str, name: str, params: Mapping[str, object]) -> str:
    """The rule that bounds this output: a half-layer tree's ``output`` is judged by its mode's output rule
    (``contracts.checks.attention.output_leaf``: the §6 row bound for C1A, the FP8 budget for SWA/C2A)."""
    if comparator == "half_layer" and name == "output" and "kind" in params:
        from contracts.checks.attention import C1A
        from kernels.config import LayerKind

        return "row_rms_peak" if LayerKind(str(params["kind"])) in C1A else "fp8_budget"
    if comparator == "half_layer" and is_payload(name):
        return "cache_payload"
    if comparator == "half_layer" and name.endswith("_scale"):
        return "cache_scale"
    return comparator


def output_report(case: str, wiring: str, name: str, comparator: str, actual: torch.Tensor | None,
                  expected: torch.Tensor, result, history: list[tuple[str, str, str]],
                  params: Mapping[str, object] | None = None) -> OutputReport:
    from contracts.compare import TOLERANCES

    comparator = effective_comparator(comparator, name, params or {})
    tol = TOLERANCES.get(comparator, {})
    bound = ", ".join(f"{k}={v:g}" for k, v in tol.items()) or ("byte-exact" if comparator in ("exact", "cache_scale")
                                                               else "see the comparator")
    out = OutputReport(name, comparator, "PASS" if result.ok else "FAIL", bound,
                       "" if result.ok else result.message(), result.cause, history=history)
    if actual is None or actual.shape != expected.shape or actual.dtype != expected.dtype or expected.numel() == 0:
        out.ulp_note = "no plot: the actual output is missing or has another shape or dtype"
        return out
    if torch.equal(actual.view(torch.uint8) if actual.dtype.itemsize == 1 else actual,
                   expected.view(torch.uint8) if expected.dtype.itemsize == 1 else expected):
        out.ulp_note = "every element equal to the expected value"
        return out
    values, limit, what = row_profile(name, comparator, actual, expected)
    if not result.ok:  # rows over the line are "failing" only where the comparator failed the output
        out.failing_rows = [int(i) for i in np.nonzero(values > limit)[0]]
    out.row_plot = row_plot(values, limit, what, f"{case}/{wiring} {name}: {what}")
    distances, unit = element_distance(name, actual, expected)
    if not unit:
        out.ulp_note = f"integer output: {int((_rows(actual) != _rows(expected)).sum())} element(s) differ"
    elif distances.size == 0:
        out.ulp_note = f"every element equal (0 {unit})"
    else:
        out.ulp_plot = ulp_plot(distances, unit, f"{distances.size} differing element(s), in {unit}")
        out.ulp_note = f"max {int(distances.max())}, median {float(np.median(distances)):g} {unit}"
    return out


class History:
    """The store's snapshots of main, newest first (``limit`` of them), read once per report: which of them
    changed an output's expected value (its content digest)."""

    def __init__(self, store, *, limit: int = 20):
        log = [e for e in store.log() if e.metadata.get("action") != "keep-actual"]
        self.store, self.entries, self.truncated = store, log[:limit], len(log) > limit
        self._readers: dict[str, object] = {}

    def _reader(self, snapshot: str):
        if snapshot not in self._readers:
            try:
                self._readers[snapshot] = self.store.reader(snapshot)
            except Exception:  # noqa: BLE001 - an expired or unreadable snapshot ends the history
                self._readers[snapshot] = None
        return self._readers[snapshot]

    def of(self, case: str, wiring: str, outputs: Iterable[str]) -> dict[str, list[tuple[str, str, str]]]:
        from goldens.catalog import tree_path

        base, outputs = tree_path(case, wiring), list(outputs)
        digests = []
        for e in self.entries:
            r = self._reader(e.snapshot)
            if r is None:
                break
            digests.append({o: r.array_attrs(f"{base}/out/{o}").get("digest") if r.has(f"{base}/out/{o}") else None
                            for o in outputs})
        hist: dict[str, list[tuple[str, str, str]]] = {o: [] for o in outputs}
        for i, e in enumerate(self.entries[: len(digests)]):
            if i + 1 == len(digests) and (self.truncated or len(digests) < len(self.entries)):
                break  # the oldest snapshot looked at: what came before it is not known here
            older = digests[i + 1] if i + 1 < len(digests) else {o: None for o in outputs}
            for o in outputs:
                if digests[i][o] is not None and digests[i][o] != older[o]:
                    hist[o].append((e.snapshot, e.written_at.strftime("%Y-%m-%d %H:%M:%S"), e.message))
        return hist


def output_history(store, case: str, wiring: str, outputs: Iterable[str], *, limit: int = 20
                   ) -> dict[str, list[tuple[str, str, str]]]:
    """Per output: the snapshots of main (newest first, up to ``limit`` looked at) that changed its expected
    value, with their time and message."""
    return History(store, limit=limit).of(case, wiring, outputs)


def tree_report(history: History | None, tree, actual: Mapping[str, torch.Tensor] | None,
                results: Mapping[str, object]) -> TreeReport:
    case, wiring = tree.case.name, tree.record.wiring
    history = history.of(case, wiring, results) if history is not None else {}
    outs = [output_report(case, wiring, name, tree.record.comparators[name], (actual or {}).get(name),
                          tree.expected[name], r, history.get(name, []), tree.record.params)
            for name, r in results.items()]
    verdict = "PASS" if all(o.verdict == "PASS" for o in outs) else "FAIL"
    return TreeReport(case, wiring, verdict, outputs=outs)


# ------------------------------------------------------------------------------------------------- page

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin:1.4em 0 .3em} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.25em .5em;vertical-align:top;text-align:left}
.PASS{color:#1a7f37;font-weight:600}.FAIL{color:#cf222e;font-weight:700}
.ERROR{color:#8250df;font-weight:700}.SKIP,.STALE{color:#9a6700;font-weight:700}
.out{border:1px solid #ddd;border-radius:6px;padding:.6em;margin:.6em 0}
.out[data-verdict=FAIL]{border:2px solid #cf222e} .failing-rows,.cause{color:#cf222e;font-weight:600} code,pre{font-size:12px;white-space:pre-wrap;word-break:break-all}
img{max-width:100%} .plots{display:flex;flex-wrap:wrap;gap:1em}
"""


# The page checks itself once loaded (no network, nothing else): script errors and images that failed to decode
# are written on <html data-errors / data-images>, which a headless browser's DOM dump shows.
_SELF_CHECK = (
    "window.addEventListener('error',function(e){var d=document.documentElement;"
    "d.dataset.errors=(d.dataset.errors||'')+(e.message||('cannot load '+(e.target&&e.target.tagName)))+';'},true);"
    "window.addEventListener('load',function(){var n=0,b=0;for(var i of document.images){n++;"
    "if(!(i.complete&&i.naturalWidth>0))b++}"
    "document.documentElement.dataset.images=n+' loaded, '+b+' broken'});"
)


def _esc(s: object) -> str:
    return html.escape(str(s))


def _output_html(case: str, wiring: str, o: OutputReport) -> str:
    rows = o.failing_rows[:MAX_ROWS_LISTED]
    more = f" (+{len(o.failing_rows) - len(rows)} more)" if len(o.failing_rows) > len(rows) else ""
    failing = (f'<p class="failing-rows">rows over the bound: {", ".join(f"row {r}" for r in rows)}{more}</p>'
               if rows else "")
    hist = "".join(f"<tr><td><code>{_esc(s[:12])}</code></td><td>{_esc(w)}</td><td>{_esc(m)}</td></tr>"
                   for s, w, m in o.history) or '<tr><td colspan="3">unchanged in the snapshots looked at</td></tr>'
    plots = "".join(f'<figure><img alt="{_esc(alt)}" src="{src}"></figure>'
                    for alt, src in (("per-row error against the bound", o.row_plot), ("error histogram", o.ulp_plot))
                    if src)
    return (f'<div class="out" id="{_esc(case)}-{_esc(wiring)}-{_esc(o.name)}" data-verdict="{o.verdict}">'
            f'<b>{_esc(o.name)}</b> <span class="{o.verdict}">{o.verdict}</span> &middot; comparator '
            f"<code>{_esc(o.comparator)}</code> &middot; bound <code>{_esc(o.bound)}</code>"
            + (f'<p class="cause">cause: {_esc(o.cause)}</p>' if o.cause else "")
            + (f"<pre>{_esc(o.message)}</pre>" if o.message else "") + failing
            + f'<div class="plots">{plots}</div><p>{_esc(o.ulp_note)}</p>'
            + f"<details><summary>history of the expected value</summary><table>{hist}</table></details></div>")


def page(title: str, trees: list[TreeReport], summary: Mapping[str, int]) -> str:
    order = {"ERROR": 0, "FAIL": 1, "STALE": 2, "SKIP": 3, "PASS": 4}
    trees = sorted(trees, key=lambda t: (order.get(t.verdict, 5), t.case, t.wiring))
    index = "".join(f'<tr><td><a href="#{_esc(t.case)}-{_esc(t.wiring)}">{_esc(t.case)}</a></td><td>{_esc(t.wiring)}'
                    f'</td><td class="{t.verdict}">{t.verdict}</td><td>{_esc(clip(t.detail, 160))}</td></tr>' for t in trees)
    body = []
    for t in trees:
        body.append(f'<h2 id="{_esc(t.case)}-{_esc(t.wiring)}">{_esc(t.case)} / {_esc(t.wiring)} '
                    f'<span class="{t.verdict}">{t.verdict}</span></h2>')
        if t.detail:
            body.append(f"<pre>{_esc(t.detail)}</pre>")
        body += [_output_html(t.case, t.wiring, o) for o in t.outputs]
    counts = " &middot; ".join(f"{_esc(k)}: {v}" for k, v in summary.items())
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
            f"<style>{_CSS}</style><script>{_SELF_CHECK}</script></head><body><h1>{_esc(title)}</h1><p id=\"summary\">{counts}</p>"
            f"<table><tr><th>case</th><th>wiring</th><th>verdict</th><th>detail</th></tr>{index}</table>"
            + "".join(body) + "</body></html>\n")


def write(out_dir: str | Path, title: str, trees: list[TreeReport], summary: Mapping[str, int]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / PAGE
    target.write_text(page(title, trees, summary), encoding="utf-8")
    return target


PARTS = ".parts"


def write_part(out_dir: str | Path, tree: TreeReport) -> None:
    """One tree's section, written by a pytest replay test (any xdist worker); ``assemble`` makes the page."""
    parts = Path(out_dir) / PARTS
    parts.mkdir(parents=True, exist_ok=True)
    (parts / f"{tree.case}__{tree.wiring}.json").write_text(tree.as_json(), encoding="utf-8")


def assemble(out_dir: str | Path, title: str) -> Path | None:
    """The page from every part under ``out_dir`` (then the parts are removed); None when no tree reported."""
    parts = Path(out_dir) / PARTS
    files = sorted(parts.glob("*.json")) if parts.is_dir() else []
    if not files:
        return None
    trees = [TreeReport.from_json(f.read_text(encoding="utf-8")) for f in files]
    summary = {v: sum(t.verdict == v for t in trees) for v in ("PASS", "FAIL", "ERROR", "SKIP", "STALE")}
    page = write(out_dir, title, trees, summary)
    for f in files:
        f.unlink()
    parts.rmdir()
    return page
