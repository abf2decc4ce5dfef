"""Versioned golden replay trees (filled in by the golden-store work)."""
