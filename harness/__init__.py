"""The engine harness: real SGLang 0.5.23 servers on a CPU-only machine, for tests and benchmarks.

Shipped as ``sglang_hvd.harness`` (the folder ``harness/`` at the top of the repository,
mapped like ``predictor/`` and ``patches/`` in pyproject.toml). It is what the SGLang
test suite (tests/sglang_cpu) and the engine-in-the-loop benchmarks
(launch/bench/engine_eval.py, launch/bench/soak.py) drive; it is not part of serving.
The runtime core (``sglang_hvd``), ``patches/`` and ``predictor/`` never import it
(tests/test_packaging.py checks this).

Modules, each importable on its own (only ``trace_oracle``, ``tiny_models``, ``gates``
and ``faults`` need numpy, and ``faults`` onnx; sglang is imported only inside server
processes):

  server        start_server / start_router / roll_replica: SGLang (or sglang_hvd.launch_server)
                as a subprocess on 127.0.0.1 with the CPU engine and the shims below
  tiny_models   tiny float32 checkpoints with the real Qwen3 tokenizer (random, "cycle", "spread")
  trace_oracle  model folders for the trace oracle: a target whose greedy output is recorded
                traces, and its calibrated EAGLE3 stand-in draft
  gates         GateFactory: a real gate per verify shape, trained briefly on the synthetic workload
  faults        faulty_gate: a gate whose ONNX graph fails at run time on chosen batch sizes

Folders the server processes get on ``PYTHONPATH`` (``server.SITE_DIR``, then
``server.STUBS_DIR`` from ``site/sitecustomize.py``, only when ``HVD_TEST_SGLANG_CPU=1``):

  site/sitecustomize.py   installs the shims at start-up of every server process
  stubs/sgl_kernel        the strict ``sgl_kernel`` stand-in (the installed wheel is the CUDA build)
  stubs/hvd_cpu_shims     torch ports of the CPU kernels, attention and sampling verify, TP on gloo
  stubs/hvd_trace_oracle  the trace-oracle target and EAGLE3 stand-in (SGLANG_EXTERNAL_MODEL_PACKAGE)

They are located relative to this file, so a regular ``pip install '.[sglang]'`` works as
well as the editable install (the stub packages and ``site/`` are installed with it).
tests/sglang_cpu/README.md explains each shim and why it exists.
"""
