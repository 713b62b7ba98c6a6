"""Builds the native drafter extension; everything else is configured in pyproject.toml.

The extension is optional: without a C++17 compiler the install succeeds and the
drafter falls back to the Python reference (with a log line saying so).
"""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

native = Pybind11Extension(
    "sglang_hvd.drafter._native",
    ["sglang_hvd/drafter/native/bindings.cpp"],
    depends=[
        "sglang_hvd/drafter/native/flat_map.hpp",
        "sglang_hvd/drafter/native/suffix_index.hpp",
        "sglang_hvd/drafter/native/suffix_search.hpp",
        "sglang_hvd/drafter/native/suffix_drafter.hpp",
        "sglang_hvd/drafter/native/row_tree.hpp",
        "sglang_hvd/drafter/native/request_state.hpp",
        "sglang_hvd/drafter/native/reaper.hpp",
        "sglang_hvd/drafter/native/pool.hpp",
        "sglang_hvd/drafter/native/features.hpp",
        "sglang_hvd/drafter/native/pairwise_sum.hpp",
        "sglang_hvd/drafter/native/choose_mode.hpp",
        "sglang_hvd/drafter/native/row_plans.hpp",
    ],
    cxx_std=17,
    extra_compile_args=["-O3"],
    optional=True,
)

setup(ext_modules=[native], cmdclass={"build_ext": build_ext})
