"""The only code that imports sglang: plugin entry point, hooks and the HVD worker.

Shipped as ``sglang_hvd.patches``. Nothing else in the package imports sglang.
"""
