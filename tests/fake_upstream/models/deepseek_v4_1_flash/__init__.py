"""TEST DOUBLE of upstream ``models/deepseek_v4_1_flash`` (only the entries pto-contracts binds)."""
