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
