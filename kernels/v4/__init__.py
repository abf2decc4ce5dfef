"""DeepSeek-V4 (Pro and its Flash preset): what differs from V4.1, written once for both V4 presets."""
