"""TEST DOUBLE of upstream ``models/deepseek_v4_1_flash/config.py``: the dynamic dims and widths used here."""
import pypto.language as pl

ROPE_DIM = 16  # the FLASH tiny preset's width: the double is "compiled" where the contracts call it
T_DYN = pl.dynamic("T")

CMP_POSITIONS_DYN = pl.dynamic("CMP_POSITIONS")


class _Flash:
    """The compiled candidate-selection constants of the FLASH preset (spec §5.2)."""

    candidate_block_size = 8
    candidate_topk_blocks = 2048


FLASH = _Flash()
