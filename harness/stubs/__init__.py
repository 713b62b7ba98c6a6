# Makes ``stubs/`` importable as ``sglang_hvd.harness.stubs`` (the unit tests and the
# harness read the ports and the oracle table this way, and the install ships the stub
# packages). The SGLang server processes instead get this folder on sys.path, so there
# ``sgl_kernel``, ``hvd_cpu_shims`` and ``hvd_trace_oracle`` are top-level packages.
