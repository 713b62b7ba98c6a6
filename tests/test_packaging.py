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


def _imports(path: str) -> list[str]:
    """Every module name a file imports (absolute, or resolved from sglang_hvd-relative
    imports), plus every string literal that names a module (importlib, entry points)."""
    import ast

    rel = os.path.relpath(path, os.path.join(REPO, "sglang_hvd")).replace(os.sep, "/")
    package = ["sglang_hvd"] + rel.split("/")[:-1]
    names = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names += [module] + [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.append(node.value)
    return names


def test_the_runtime_core_imports_neither_patches_nor_predictor_nor_heavy_libraries():
    """The dependency rule: patches -> sglang_hvd <- predictor; sglang only in patches,
    torch only in predictor (and patches); the core finds `hvd train` and the launcher
    through entry points, never by import, not even lazily."""
    offenders = []
    for root, _, files in os.walk(os.path.join(REPO, "sglang_hvd")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            for module in _imports(path):
                if module.split(".")[0] in ("torch", "sglang", "onnx") or module.startswith(
                        ("sglang_hvd.patches", "sglang_hvd.predictor")):
                    offenders.append(f"{os.path.relpath(path, REPO)}: {module}")
    assert offenders == []


def test_commands_and_the_launcher_outside_the_core_are_entry_points():
    from importlib import metadata

    from sglang_hvd.cli.main import command

    train = {ep.name: ep.value for ep in metadata.entry_points(group="sglang_hvd.commands")}
    launchers = {ep.name: ep.value for ep in metadata.entry_points(group="sglang_hvd.launchers")}
    assert train == {"train": "sglang_hvd.predictor.train_cli:main"}
    assert launchers == {"launch_server": "sglang_hvd.patches.launch:main"}
    assert command("train").__module__ == "sglang_hvd.predictor.train_cli"


def test_the_serving_runtime_never_imports_replay():
    """One-way layers: replay drives the serving code (stepper, decision, gate), never the
    reverse; only the commands that run replay (cli/replay.py, cli/eval.py) import it."""
    offenders = []
    for root, _, files in os.walk(os.path.join(REPO, "sglang_hvd")):
        rel_root = os.path.relpath(root, os.path.join(REPO, "sglang_hvd")).replace(os.sep, "/")
        if rel_root == "replay" or rel_root.startswith("replay/"):
            continue
        for name in files:
            if not name.endswith(".py") or (rel_root == "cli" and name in ("replay.py", "eval.py")):
                continue
            path = os.path.join(root, name)
            offenders += [f"{os.path.relpath(path, REPO)}: {m}" for m in _imports(path) if m.startswith("sglang_hvd.replay")]
    assert offenders == []
