"""Guards: the private SGLang symbols the CPU shims rely on, the strict sgl_kernel
stub, and the ports against SGLang's own Triton kernels (Triton's CPU interpreter).

Each check names the symbol that is missing or changed, so an SGLang upgrade that
breaks the shims fails here first, not as a garbage token deep in an e2e test.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")

from sglang_hvd.harness import server as harness  # noqa: E402
from sglang_hvd.harness.stubs.hvd_cpu_shims import contract  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(code: str, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([harness.SGLANG_PYTHON, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=HERE)


def _last_json(proc: subprocess.CompletedProcess):
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("{", "["))]
    assert lines, (f"no JSON from the probe (rc={proc.returncode})\n"
                   f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


@pytest.fixture(scope="module", autouse=True)
def _sglang_python():
    reason = harness.sglang_available()
    if reason:
        pytest.skip(reason)


def test_sglang_symbols_the_shims_rely_on():
    problems = contract.check_all()
    assert not problems, "SGLang changed under the CPU shims:\n" + "\n".join(problems)


def test_cpu_engine_binds_ports_and_patches():
    """With SGLANG_USE_CPU_ENGINE=1 and the shims installed (as in the servers):
    every wrapper module bound the port, both patches are in, and each SGLang
    ``*_func`` wrapper gives the port's result (argument order)."""
    proc = _run("import json\nfrom hvd_cpu_shims import contract\nprint(json.dumps(contract.probe_cpu_engine()))",
                harness.server_env())
    problems = _last_json(proc)
    assert not problems, "\n".join(problems)


def test_stub_is_strict_and_names_the_symbol():
    code = """
import json
import sgl_kernel
from sgl_kernel import build_tree_kernel_efficient_cpu, some_cuda_only_op
from sgl_kernel.kvcacheio import transfer_kv_direct
out = {"stub": sgl_kernel.HVD_CPU_TEST_STUB, "port": build_tree_kernel_efficient_cpu.__module__}
for name, fn in (("top", some_cuda_only_op), ("sub", transfer_kv_direct)):
    try:
        fn(1)
    except NotImplementedError as exc:
        out[name] = str(exc)
try:
    bool(some_cuda_only_op)
except NotImplementedError as exc:
    out["bool"] = str(exc)
print(json.dumps(out))
"""
    out = _last_json(_run(code, harness.server_env()))
    assert out["stub"] is True
    assert out["port"] == "hvd_cpu_shims.kernels"
    assert "'sgl_kernel.some_cuda_only_op' is not implemented" in out["top"]
    assert "'sgl_kernel.kvcacheio.transfer_kv_direct' is not implemented" in out["sub"]
    assert "some_cuda_only_op" in out["bool"]


def test_site_folder_alone_changes_nothing():
    """Without HVD_TEST_SGLANG_CPU=1 the sitecustomize on PYTHONPATH is inert."""
    env = harness.server_env()
    env.pop("HVD_TEST_SGLANG_CPU")
    code = """
import importlib.util, json, sys
spec = importlib.util.find_spec("sgl_kernel")
print(json.dumps({"shims": "hvd_cpu_shims" in sys.modules, "origin": spec.origin if spec else None,
                  "stubs_on_path": any(p.endswith("stubs") for p in sys.path)}))
"""
    out = _last_json(_run(code, env))
    assert out["shims"] is False and out["stubs_on_path"] is False
    assert out["origin"] is None or not out["origin"].startswith(harness.STUBS_DIR)


def test_ports_match_triton_kernels_in_interpreter():
    """The ports against the Triton kernels they replace, on random realistic
    inputs (trees grown by SGLang's own select_top_k_tokens, topk 1 to 3)."""
    env = harness.server_env({"TRITON_INTERPRET": "1"})
    env.pop("HVD_TEST_SGLANG_CPU")
    env.pop("SGLANG_USE_CPU_ENGINE")
    proc = subprocess.run([harness.SGLANG_PYTHON, os.path.join(HERE, "triton_reference.py"), "0", "6"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=HERE)
    out = _last_json(proc)
    assert "error" not in out, out
    assert out["cases"] >= 40
    assert not out["mismatches"], "\n".join(out["mismatches"])
