# Makes ``tests/sglang_cpu/stubs`` importable as a subpackage of the test package (for
# the unit tests). The SGLang server processes instead get this folder on sys.path, so
# there ``sgl_kernel`` and ``hvd_cpu_shims`` are top-level packages.
