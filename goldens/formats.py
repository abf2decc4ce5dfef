"""The machine-readable forms of a replay: the JSON document (``--json``) and JUnit XML (``--junit``), one row
per (case, wiring, output). The HTML page is ``goldens.report``. Spec: §7.3.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def emit_json(document: dict) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a space, never inside a number or a word, with an ellipsis
    when anything was cut (a cut number, `expected=-0` for -0.0397908, misleads)."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return (text[:cut] if cut > 0 else text[:limit]).rstrip() + " …"


def write_junit(path: Path, document: dict) -> None:
    """JUnit XML: one testcase per (case, wiring, output) row; FAIL a failure, ERROR an error, SKIP/STALE
    skipped (STALE also counted as an error: it exits 2)."""
    from xml.etree import ElementTree as ET

    rows = document["rows"]
    suite = ET.Element("testsuite", name=f"goldens replay ({document['backend']}, {document['platform']})",
                       tests=str(len(rows)), failures=str(sum(r["verdict"] == "FAIL" for r in rows)),
                       errors=str(sum(r["verdict"] in ("ERROR", "STALE") for r in rows)),
                       skipped=str(sum(r["verdict"] == "SKIP" for r in rows)))
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname=f"{r['case']}.{r['wiring']}", name=r["output"])
        kind = {"FAIL": "failure", "ERROR": "error", "STALE": "error", "SKIP": "skipped"}.get(r["verdict"])
        if kind:
            ET.SubElement(case, kind, message=clip(r["detail"], 500)).text = r["detail"]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
    except OSError as exc:  # the JUnit file's own failure, named as such (not the store's)
        from goldens.errors import GoldenStoreError

        raise GoldenStoreError(f"--junit {path}: cannot write it ({exc.strerror or exc}); the store is "
                               "untouched") from None
