"""Model facts, Torch references and engine-side lowering for the DeepSeek-V4 kernels."""
