"""A strict stand-in for ``sgl_kernel`` on a machine without libcuda (the CPU harness).

The installed sgl_kernel wheel is the CUDA build; ``import sgl_kernel`` fails
without libcuda, and SGLang imports it from dozens of modules. This package is put
in front of it (``harness/site/sitecustomize.py``, only when
``HVD_TEST_SGLANG_CPU=1``) and exports:

* the torch ports of the CPU kernels the speculative path calls
  (``hvd_cpu_shims.kernels``), under their sgl_kernel names;
* for every other name, a placeholder that raises ``NotImplementedError`` naming
  the symbol the moment it is called (or used in any other way than being
  imported, compared or printed). A silent no-op would only surface much later as
  garbage; a MagicMock-style stub did exactly that.

Submodules (``sgl_kernel.kvcacheio``, ``sgl_kernel.scalar_type``...) are created
on demand with the same rule.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

from hvd_cpu_shims import kernels as _kernels

__version__ = "0.0.0+hvd-cpu-test-stub"
HVD_CPU_TEST_STUB = True


class StubSymbolError(NotImplementedError):
    pass


class _Missing:
    """A symbol the stub does not implement: importable, unusable."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _fail(self, *args, **kwargs):
        raise StubSymbolError(
            f"sgl_kernel stub (sglang_hvd.harness): '{self._name}' is not implemented on the CPU "
            "harness; add a torch port to harness/stubs/hvd_cpu_shims/kernels.py "
            "if the CPU path really needs it"
        )

    __call__ = _fail

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __setattr__(self, attr, value):
        self._fail()

    def __bool__(self):
        self._fail()

    def __iter__(self):
        self._fail()

    def __getitem__(self, key):
        self._fail()

    def __repr__(self):
        return f"<sgl_kernel stub: missing {self._name!r}>"

    def __reduce__(self):
        return (_Missing, (self._name,))


def _module_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = _Missing(f"{module_name}.{name}")
        setattr(sys.modules[module_name], name, value)
        return value

    return __getattr__


for _name in _kernels.__all__:
    globals()[_name] = getattr(_kernels, _name)
__getattr__ = _module_getattr(__name__)


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``sgl_kernel.<anything>`` importable as a strict stub module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


__path__ = []  # submodules come only from the finder below, never from the real wheel
if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())
