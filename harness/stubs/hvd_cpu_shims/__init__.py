"""Shims that let a real SGLang 0.5.23 run EAGLE3 on a CPU-only machine.

``install()`` is called by the harness's ``site/sitecustomize.py`` in every
Python process (SGLang spawns its scheduler and detokenizer with ``spawn``) when
``HVD_TEST_SGLANG_CPU=1``. It never edits the installed SGLang:

* ``sgl_kernel`` resolves to the strict stub in ``stubs/sgl_kernel`` (the harness's)
  (the folder is put first on ``sys.path``), which exports the torch kernel ports
  of ``kernels.py``;
* SGLang modules are patched right after they are first imported, by a
  post-import hook (so nothing of SGLang is imported early):
  ``sglang.srt.layers.attention.torch_native_backend`` (TARGET_VERIFY) and
  ``sglang.srt.speculative.draft_utils`` (torch_native draft backends); see
  ``attention.py``;
* with ``HVD_TEST_TREE_MASK_MODE=full`` also ``sglang.srt.speculative.eagle_worker_v2``:
  its EAGLE trees are built with the FULL_MASK layout (what GPU attention backends
  read) instead of the CPU's QLEN_ONLY, so HVD's row rewriter is tested on both;
* ``sglang.srt.distributed.parallel_state``: TP groups without the CUDA communicators,
  so ``--tp-size 2`` all-reduces over gloo (``distributed.py``);
* ``sglang.srt.speculative.eagle_utils``: verify samples when a request does (SGLang
  forces greedy verify on the CPU), through torch ports of the GPU's sampling ops
  (``sampling.py``).

``contract.py`` lists every private SGLang symbol these shims rely on; the patches
check it first and raise ``ShimContractError`` naming what changed.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

ENV_FLAG = "HVD_TEST_SGLANG_CPU"
MASK_MODE_FLAG = "HVD_TEST_TREE_MASK_MODE"  # "full": FULL_MASK trees on the CPU
STUBS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_installed = False


# module -> "shim module:patch function" (resolved lazily: importing torch from
# sitecustomize, before the program's own imports, is avoided)
PATCHED_MODULES = {
    "sglang.srt.layers.attention.torch_native_backend": "attention:patch_torch_native_backend",
    "sglang.srt.speculative.draft_utils": "attention:patch_draft_backend_factory",
    "sglang.srt.distributed.parallel_state": "distributed:patch_parallel_state",
    "sglang.srt.speculative.eagle_utils": "sampling:patch_eagle_utils",
}


def _patched_modules() -> dict[str, str]:
    names = dict(PATCHED_MODULES)
    mode = os.environ.get(MASK_MODE_FLAG, "")
    if mode == "full":
        names["sglang.srt.speculative.eagle_worker_v2"] = "attention:force_full_tree_mask"
    elif mode:
        raise ValueError(f"{MASK_MODE_FLAG}={mode!r}: only 'full' is known")
    return names


def _apply(name: str, module) -> None:
    import importlib

    from . import contract

    contract.check_module(name, module)  # raises ShimContractError, naming the symbol
    shim, function = _patched_modules()[name].split(":")
    getattr(importlib.import_module(f"{__name__}.{shim}"), function)(module)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _apply(self._name, module)

    def __getattr__(self, attr):  # get_source, get_filename, ... for tracebacks/inspect
        return getattr(self._loader, attr)


class _PostImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self._names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    """Idempotent. Puts the sgl_kernel stub first and arms the post-import patches."""
    global _installed
    if _installed:
        return
    _installed = True
    if STUBS_DIR not in sys.path:
        sys.path.insert(0, STUBS_DIR)
    stale = sys.modules.get("sgl_kernel")
    if stale is not None and not getattr(stale, "HVD_CPU_TEST_STUB", False):
        raise RuntimeError("hvd_cpu_shims.install(): the real sgl_kernel was imported "
                           "before the stub could be installed")
    names = list(_patched_modules())
    for name in names:
        if name in sys.modules:  # imported before us (not the sitecustomize path)
            _apply(name, sys.modules[name])
    sys.meta_path.insert(0, _PostImportHook([n for n in names if n not in sys.modules]))
