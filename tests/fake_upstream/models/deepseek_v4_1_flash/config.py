"""TEST DOUBLE of upstream ``models/deepseek_v4_1_flash/config.py``: the dynamic dims and widths used here."""
import pypto.language as pl

ROPE_DIM = 64
T_DYN = pl.dynamic("T")
