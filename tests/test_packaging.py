"""The wheel ships every subpackage, under the sglang_hvd namespace only, and what may import what."""

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


def test_predictor_patches_and_harness_import_under_the_namespace():
    import sglang_hvd.harness
    import sglang_hvd.patches
    import sglang_hvd.predictor

    assert os.path.dirname(sglang_hvd.predictor.__file__) == os.path.join(REPO, "predictor")
    assert os.path.dirname(sglang_hvd.patches.__file__) == os.path.join(REPO, "patches")
    assert os.path.dirname(sglang_hvd.harness.__file__) == os.path.join(REPO, "harness")


def test_the_harness_finds_its_server_folders_beside_itself():
    """The folders the harness puts on PYTHONPATH of its servers are located from its own
    file (so a non-editable install works as well) and are shipped: the stub packages are
    listed packages, and site/sitecustomize.py is package data."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    from sglang_hvd.harness import server

    assert server.SITE_DIR == os.path.join(REPO, "harness", "site")
    assert server.STUBS_DIR == os.path.join(REPO, "harness", "stubs")
    assert os.path.isfile(os.path.join(server.SITE_DIR, "sitecustomize.py"))
    assert setuptools["package-data"]["sglang_hvd.harness"] == ["site/sitecustomize.py"]
    assert {"sglang_hvd.harness.stubs.sgl_kernel", "sglang_hvd.harness.stubs.hvd_cpu_shims",
            "sglang_hvd.harness.stubs.hvd_trace_oracle"} <= set(setuptools["packages"])


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
    assert ("native drafter not built (No module named 'sglang_hvd.drafter._native'); "
            "using the Python reference") in caplog.text


def _imports(path: str, root: str = "sglang_hvd", package: str = "sglang_hvd") -> list[str]:
    """Every module name a file imports (absolute, or resolved from relative imports: the
    file lies under the folder ``root`` of the repository, shipped as ``package``), plus
    every string literal that names a module (importlib, entry points)."""
    import ast

    rel = os.path.relpath(path, os.path.join(REPO, root)).replace(os.sep, "/")
    package = package.split(".") + rel.split("/")[:-1]
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


def _python_files(folder: str) -> list[str]:
    return sorted(os.path.join(root, name) for root, _, files in os.walk(os.path.join(REPO, folder))
                  for name in files if name.endswith(".py"))


def _names(module: str, *prefixes: str) -> bool:
    """Whether ``module`` is one of ``prefixes`` or inside one of them."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_runtime_core_imports_neither_patches_nor_predictor_nor_heavy_libraries():
    """The dependency rule: patches -> sglang_hvd <- predictor; sglang only in patches,
    torch only in predictor (and patches); the core finds `hvd train` and the launcher
    through entry points, never by import, not even lazily. Nor does it import the engine
    harness (sglang_hvd.harness, harness/), the recipes in launch/ or the tests."""
    offenders = []
    for path in _python_files("sglang_hvd"):
        for module in _imports(path):
            if module.split(".")[0] in ("torch", "sglang", "onnx", "tests", "launch") or _names(
                    module, "sglang_hvd.patches", "sglang_hvd.predictor", "sglang_hvd.harness"):
                offenders.append(f"{os.path.relpath(path, REPO)}: {module}")
    assert offenders == []


def test_serving_and_training_never_import_the_engine_harness():
    """patches/ (the server) and predictor/ (training) are shipped code too: the harness's
    CPU shims and stubs must never reach them."""
    offenders = [f"{os.path.relpath(path, REPO)}: {module}"
                 for folder, package in (("patches", "sglang_hvd.patches"), ("predictor", "sglang_hvd.predictor"))
                 for path in _python_files(folder) for module in _imports(path, folder, package)
                 if _names(module, "sglang_hvd.harness", "harness")]
    assert offenders == []


def test_launch_and_the_harness_never_import_tests_nor_edit_sys_path():
    """launch/ scripts import the installed package (sglang_hvd, sglang_hvd.harness), and
    the harness is product code: neither reaches into tests/ (nor its modules by their
    folder-relative names), and no launch/ file edits the import path."""
    offenders = []
    for path in _python_files("launch"):
        offenders += [f"{os.path.relpath(path, REPO)}: {m}" for m in _imports(path, "launch", "launch")
                      if _names(m, "tests", "sglang_cpu", "conftest")]
    for path in _python_files("harness"):
        offenders += [f"{os.path.relpath(path, REPO)}: {m}" for m in _imports(path, "harness", "sglang_hvd.harness")
                      if _names(m, "tests", "sglang_cpu", "conftest")]
    for root, _, files in os.walk(os.path.join(REPO, "launch")):
        for name in files:
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                if "sys.path" in f.read():
                    offenders.append(f"{os.path.relpath(os.path.join(root, name), REPO)}: sys.path")
    assert offenders == []


def test_commands_and_the_launcher_outside_the_core_are_entry_points():
    from importlib import metadata

    from sglang_hvd.cli.main import command

    train = {ep.name: ep.value for ep in metadata.entry_points(group="sglang_hvd.commands")}
    launchers = {ep.name: ep.value for ep in metadata.entry_points(group="sglang_hvd.launchers")}
    assert train == {"train": "sglang_hvd.predictor.train_cli:main", "adapt": "sglang_hvd.predictor.adapt_cli:main"}
    assert launchers == {"launch_server": "sglang_hvd.patches.launch:main"}
    assert command("train").__module__ == "sglang_hvd.predictor.train_cli"
    assert command("adapt").__module__ == "sglang_hvd.predictor.adapt_cli"


def test_the_serving_runtime_never_imports_replay():
    """One-way layers: replay drives the serving code (stepper, decision, gate), never the
    reverse; only the commands that run replay (cli/replay.py, cli/eval.py, cli/eval_load.py) import it."""
    offenders = []
    for root, _, files in os.walk(os.path.join(REPO, "sglang_hvd")):
        rel_root = os.path.relpath(root, os.path.join(REPO, "sglang_hvd")).replace(os.sep, "/")
        if rel_root == "replay" or rel_root.startswith("replay/"):
            continue
        for name in files:
            if not name.endswith(".py") or (rel_root == "cli" and name in ("replay.py", "eval.py", "eval_load.py")):
                continue
            path = os.path.join(root, name)
            offenders += [f"{os.path.relpath(path, REPO)}: {m}"
                          for m in _imports(path) if m.startswith("sglang_hvd.replay")]
    assert offenders == []
