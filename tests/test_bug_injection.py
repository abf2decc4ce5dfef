"""Bugs injected into upstream-shaped goldens are caught by the contracts run on ``--backend upstream``.

A checkout-shaped folder is written here (``models/deepseek_v4_flash_mtp``: a config whose model object the worker
re-targets, and three modules whose goldens are a few lines of Torch written for this test from the spec's rules:
the embedding lookup, the final RMSNorm, the hyper-connection post mix and its prefill form). Each injected bug is one line changed, as
a kernel engineer's slip would be (an index, an epsilon, a weight left out, a rounding moved, a transposed mix); the
operator's contracts are run on the bugged folder in a pytest of their own and must fail, naming the operator;
on the clean folder they must pass, so a catch is the bug's and not the folder's. The same injection against a real
pypto-lib checkout is a command (the closing notes of #45 give its table): this test keeps the mechanism honest on
every CI run without a checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = "deepseek_v4_flash_mtp"

CONFIG = '''
import dataclasses

@dataclasses.dataclass(frozen=True)
class Cfg:
    name: str
    hidden_size: int
    hc_mult: int
    rms_norm_eps: float

FLASH = Cfg("flash", 4096, 4, 1e-6)
'''

MODULES = {
    "lookup_embedding": '''
        from config import FLASH as M

        def golden_lookup_embedding_test(tensors):
            ids = tensors["input_ids"].long()
            tensors["hidden_states"][:] = tensors["embed_weight"].index_select(0, ids)
        ''',
    "rmsnorm": '''
        import torch
        from config import FLASH as M

        EPS = M.rms_norm_eps

        def golden_rms_norm_test(tensors):
            x = tensors["x"].float()
            w = tensors["norm_w"].float()
            inv = torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
            tensors["x_normed"][:] = (x * inv * w).to(torch.bfloat16)
        ''',
    "hc_post": '''
        import torch
        from config import FLASH as M

        def golden_hc_post(tensors):
            x, residual = tensors["x"].float(), tensors["residual"].float()
            post = tensors["post"].float()
            hc = residual.shape[1]
            comb = tensors["comb"].float().reshape(-1, hc, hc)
            for o in range(hc):
                y = x * post[:, o:o + 1]
                for i in range(hc):
                    y = y + residual[:, i, :] * comb[:, i, o:o + 1]
                tensors["y"][:, o, :] = y

        def golden_hc_post_prefill(tensors):
            golden_hc_post(tensors)
            tensors["y"][int(tensors["num_tokens"]):] = 0
        ''',
}

# (bug, module, the line as written, the line with the bug, the operator whose contracts must catch it)
BUGS = [
    ("lookup: the next row", "lookup_embedding", 'ids = tensors["input_ids"].long()',
     'ids = (tensors["input_ids"].long() + 1) % tensors["embed_weight"].shape[0]', "lookup_embedding"),
    ("lookup: rows widened to FP32 and back", "lookup_embedding",
     'tensors["hidden_states"][:] = tensors["embed_weight"].index_select(0, ids)',
     'tensors["hidden_states"][:] = (tensors["embed_weight"].index_select(0, ids).float() * 1.0001)',
     "lookup_embedding"),
    ("rmsnorm: eps 1e-5", "rmsnorm", "EPS = M.rms_norm_eps", "EPS = 1e-5", "final_norm"),
    ("rmsnorm: the weight left out", "rmsnorm", "w = tensors[\"norm_w\"].float()",
     "w = torch.ones_like(tensors[\"norm_w\"].float())", "final_norm"),
    ("rmsnorm: rounded to BF16 before the weight", "rmsnorm",
     "tensors[\"x_normed\"][:] = (x * inv * w).to(torch.bfloat16)",
     "tensors[\"x_normed\"][:] = ((x * inv).to(torch.bfloat16).float() * w).to(torch.bfloat16)", "final_norm"),
    ("hc_post: the residual mix transposed", "hc_post", "y = y + residual[:, i, :] * comb[:, i, o:o + 1]",
     "y = y + residual[:, i, :] * comb[:, o, i:i + 1]", "hc_post"),
    ("hc_post: the post mix of stream 0 for every stream", "hc_post", "y = x * post[:, o:o + 1]",
     "y = x * post[:, 0:1]", "hc_post"),
    ("hc_post_prefill: the last real row zeroed too", "hc_post", 'tensors["y"][int(tensors["num_tokens"]):] = 0',
     'tensors["y"][int(tensors["num_tokens"]) - 1:] = 0', "hc_post"),
]
OPERATORS = sorted({b[4] for b in BUGS})


def _checkout(where: Path, bug: tuple | None = None) -> Path:
    (where / "golden").mkdir(parents=True)
    (where / "golden" / "runner.py").write_text("# layout only\n")
    model = where / "models" / FOLDER
    model.mkdir(parents=True)
    (model / "config.py").write_text(textwrap.dedent(CONFIG))
    for name, source in MODULES.items():
        text = textwrap.dedent(source)
        if bug and bug[1] == name:
            assert text.count(bug[2]) == 1, f"{bug[0]}: the line to change is not in {name}.py once"
            text = text.replace(bug[2], bug[3])
        (model / f"{name}.py").write_text(text)
    return where


def _contracts(root: Path, operator: str, *extra: str) -> subprocess.CompletedProcess:
    """The operator's contracts (and its trees) on the upstream backend over ``root`` (one pytest process, no
    xdist)."""
    env = {**os.environ, "PYPTO_LIB_ROOT": str(root), "CI": "true"}
    env.pop("PTO_UPSTREAM_PYTHON", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *extra,
                           "contracts/", "--backend", "upstream", "--model", FOLDER, "--operator", operator,
                           "-k", "not moe"],  # the MoE stage's contracts mix in hc_post; this folder has no moe.py
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("operator", OPERATORS)
def test_the_clean_goldens_pass_their_contracts(tmp_path, operator):
    """Control: the goldens as written pass every contract of their operator on the upstream backend (so a failure
    below is the bug's), and the contracts ran (a run with nothing judged would prove nothing)."""
    run = _contracts(_checkout(tmp_path), operator)
    tail = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-400:]
    assert run.returncode == 0 and " passed" in tail and "failed" not in tail, f"{operator}: {tail}\n{run.stdout[-2000:]}"


@pytest.mark.parametrize("bug", BUGS, ids=[b[0] for b in BUGS])
def test_a_bug_injected_into_a_golden_is_caught(tmp_path, bug):
    """One line of one golden changed: the operator's contracts on the upstream backend fail."""
    run = _contracts(_checkout(tmp_path, bug), bug[4], "-x")  # one failure is the catch
    tail = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-400:]
    assert run.returncode == 1 and "failed" in tail, f"{bug[0]}: not caught by {bug[4]}'s contracts ({tail})"
