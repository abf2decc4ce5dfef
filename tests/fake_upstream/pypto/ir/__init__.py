"""TEST DOUBLE of ``pypto.ir`` (only what the binding touches)."""
