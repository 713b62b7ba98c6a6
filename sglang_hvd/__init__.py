"""Hybrid Verified Decoding for SGLang (runtime core: numpy and onnxruntime only)."""

__version__ = "0.1.0"
