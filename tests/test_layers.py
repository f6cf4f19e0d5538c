"""The packages import only downwards: core <- relay_passes, schedules <- the user API.

Read from the sources with ``ast``: a module-level or function-level import of a higher
layer fails, so does an import between ``relay_passes`` and ``schedules``, and so does a
function-level import of our own packages made only to dodge a cycle (the few deferred
imports kept, each for a reason other than a cycle, are listed with it).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tvm_ext", "relay_passes", "schedules")

#: The user API: the modules of tvm_ext that may import the passes and the schedules.
API = frozenset(["tvm_ext", "tvm_ext.__main__", "tvm_ext.pipeline", "tvm_ext.compiled_model",
                 "tvm_ext.build_pipeline", "tvm_ext.cli", "tvm_ext.training", "tvm_ext.tuning",
                 "tvm_ext.measured_rollback", "tvm_ext.torch_backend", "tvm_ext.baselines", "tvm_ext.models"])

#: Deferred imports kept on purpose, none for a cycle: (module, imported module) -> why.
DEFERRED = {
    ("tvm_ext.cli", "*"): "the command line loads TVM and the pipeline only for the command it runs",
    ("tvm_ext.torch_backend", "*"): "torch.compile loads the backend; tvm_ext loads when it first compiles",
}


def layer(module: str) -> int:
    """0: the core (registry, ops, Loop IR, lowering, machine facts, frontends); 1: the passes
    and the schedules; 2: the user API."""
    if module in API:
        return 2
    return 1 if module.split(".")[0] in ("relay_passes", "schedules") else 0


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path):
    """(imported module, line, deferred: inside a function) for each import of our packages."""
    tree = ast.parse(path.read_text())
    deferred = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from tvm_ext import attrs`` imports the module tvm_ext.attrs, not the package's API
            names = [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else node.module
                     for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES:
                yield name, node.lineno, id(node) in deferred


MODULES = dict(_modules())


def test_the_layer_table_names_real_modules():
    assert API <= set(MODULES)
    assert {m for m in MODULES if layer(m) == 0} >= {"tvm_ext.registry", "tvm_ext.loop_ir", "tvm_ext.lowering",
                                                    "tvm_ext.machine", "tvm_ext.ops.anchors", "tvm_ext.symbol"}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_only_downwards(module):
    for name, line, _ in _imports(MODULES[module]):
        where = f"{module}:{line} imports {name}"
        assert layer(name) <= layer(module), f"{where}: an upward import (layer {layer(module)} -> {layer(name)})"
        a, b = module.split(".")[0], name.split(".")[0]
        assert {a, b} != {"relay_passes", "schedules"}, f"{where}: the passes and the schedules never meet"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_is_deferred_to_dodge_a_cycle(module):
    for name, line, deferred in _imports(MODULES[module]):
        if deferred:
            assert (module, "*") in DEFERRED or (module, name) in DEFERRED, \
                f"{module}:{line} imports {name} inside a function; import it at the top of the module"


def test_the_check_catches_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from tvm_ext.pipeline import compile\nfrom tvm_ext import OPS, attrs\n\n"
                   "def f():\n    from relay_passes import graph\n")
    found = list(_imports(bad))
    assert [(n, d) for n, _, d in found] == [("tvm_ext.pipeline", False), ("tvm_ext", False),
                                             ("tvm_ext.attrs", False), ("relay_passes.graph", True)]
    assert layer("tvm_ext.pipeline") > layer("tvm_ext.registry") and layer("relay_passes.graph") == 1
