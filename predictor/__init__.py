"""Offline side of HVD: replay-labelled training data, MLP training (torch), ONNX export.

Shipped as ``sglang_hvd.predictor``. May import ``sglang_hvd``; the runtime never imports this.
"""
