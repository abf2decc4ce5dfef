"""Every spec section the code and docs cite (``§5.3``) has a heading in docs/spec/, and every heading there is
cited: the spec the code points at is in the repository, in this project's words."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITE = re.compile(r"§(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{1,3} §(\d+(?:\.\d+)*)\b", re.M)


def _cited() -> dict[str, str]:
    """section -> one place that cites it (outside docs/spec)."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    out: dict[str, str] = {}
    for name in files:
        if name.startswith(("docs/spec/", "artifacts/")) or not (ROOT / name).is_file():
            continue
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            for section in CITE.findall(line):
                out.setdefault(section, f"{name}:{n}")
    return out


def _headings() -> set[str]:
    return {s for path in (ROOT / "docs" / "spec").glob("*.md") for s in HEADING.findall(path.read_text())}


def test_every_cited_section_has_a_heading():
    cited, headings = _cited(), _headings()
    missing = {s: where for s, where in cited.items() if s not in headings}
    assert not missing, "cited sections without a heading in docs/spec/: " + \
        ", ".join(f"§{s} ({where})" for s, where in sorted(missing.items()))


def test_every_heading_is_cited_or_a_parent_of_one():
    cited, headings = _cited(), _headings()
    unused = sorted(h for h in headings if h not in cited and not any(c.startswith(h + ".") for c in cited))
    assert not unused, f"docs/spec/ headings nothing cites: {unused}"


def test_the_walk_sees_a_citation():
    assert "8" in _cited() and "5.3" in _headings()
