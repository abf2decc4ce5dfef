"""TEST DOUBLE of the pypto toolchain package (only what the pto-contracts binding uses)."""
TEST_DOUBLE = True
__version__ = "0.0.0+test-double"
