"""Installs the SGLang CPU harness shims in every Python process, when asked to.

``sglang_hvd.harness.server`` puts this folder on ``PYTHONPATH`` of the SGLang
server it starts, so this file runs at start-up of the server and of every child
SGLang spawns. It does nothing unless ``HVD_TEST_SGLANG_CPU=1``; then it calls
``hvd_cpu_shims.install()`` (see ``harness/stubs/hvd_cpu_shims``).

Python imports only the first ``sitecustomize`` on ``sys.path``; to stay
transparent, this one then runs the next one found, if any.
"""

import os
import sys


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if p and os.path.abspath(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("HVD_TEST_SGLANG_CPU") == "1":
    _stubs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "stubs")
    if _stubs not in sys.path:
        sys.path.insert(0, _stubs)
    import hvd_cpu_shims

    hvd_cpu_shims.install()

_chain_next_sitecustomize()
