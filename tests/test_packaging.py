"""The wheel ships every subpackage, under the sglang_hvd namespace only."""

from __future__ import annotations

import os
import tomllib

from conftest import REPO


def test_every_package_folder_is_listed_in_pyproject():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    dirs = setuptools["package-dir"]
    found = set()
    for package, folder in dirs.items():
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            if "__init__.py" in files and "__pycache__" not in root:
                rel = os.path.relpath(root, os.path.join(REPO, folder))
                found.add(package if rel == "." else package + "." + rel.replace(os.sep, "."))
    assert found == listed
    assert all(p == "sglang_hvd" or p.startswith("sglang_hvd.") for p in listed)


def test_predictor_and_patches_import_under_the_namespace():
    import sglang_hvd.patches
    import sglang_hvd.predictor

    assert os.path.dirname(sglang_hvd.predictor.__file__) == os.path.join(REPO, "predictor")
    assert os.path.dirname(sglang_hvd.patches.__file__) == os.path.join(REPO, "patches")


def test_the_native_drafter_is_built_wherever_a_compiler_is():
    import shutil

    from sglang_hvd.drafter.native_drafter import default_drafter_name, native_available

    if shutil.which("g++") or shutil.which("c++"):
        assert native_available(), "the install should have built sglang_hvd.drafter._native (see setup.py)"
        assert default_drafter_name() == "native"


def test_without_the_extension_the_python_drafter_is_used_and_says_so(monkeypatch, caplog):
    import sglang_hvd.drafter.native_drafter as nd

    monkeypatch.setattr(nd, "_native", None)
    monkeypatch.setattr(nd, "_IMPORT_ERROR", "No module named 'sglang_hvd.drafter._native'")
    monkeypatch.setattr(nd, "_warned", False)
    with caplog.at_level("WARNING"):
        assert nd.default_drafter_name() == "python"
    assert "native drafter not built (No module named 'sglang_hvd.drafter._native'); using the Python reference" in caplog.text
