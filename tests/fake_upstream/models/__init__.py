"""TEST DOUBLE of upstream ``models``."""
