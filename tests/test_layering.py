"""docs/DESIGN.md's layers, read from the code: a lowering file launches kernels, so no module under
``compiler/lowering/`` imports the ops, the passes or the compile-time policy, at its top or inside a
function (the op decides, then calls kernels that never call back)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABOVE_THE_KERNELS = ("compiler.ops", "compiler.passes", "compiler.policy")


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module an ``import`` or ``from ... import`` anywhere in the file names, relative imports
    resolved against the file's package under ``root``; ``from package import name`` counts
    ``package.name`` too (it may be a module); so does a literal name handed to ``import_module`` or
    ``__import__``."""
    package = ".".join(path.relative_to(root).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__"):
            found.add(str(node.args[0].value))
    return found


def reaches(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def test_no_lowering_module_imports_the_ops_the_passes_or_the_policy():
    files = sorted((ROOT / "compiler" / "lowering").rglob("*.py"))
    assert files
    upward = {f"{path.relative_to(ROOT)} imports {name}" for path in files for name in imported_modules(path)
              if any(reaches(name, layer) for layer in ABOVE_THE_KERNELS)}
    assert not upward, sorted(upward)


def test_the_reader_sees_imports_inside_functions_and_relative_ones(tmp_path):
    source = tmp_path / "compiler" / "lowering" / "attention" / "probe.py"
    source.parent.mkdir(parents=True)
    source.write_text("import torch\n\ndef run():\n    from compiler.ops.sparse_form import choose_form\n"
                      "    from ...policy import shape_form\n    from compiler import passes\n"
                      "    importlib.import_module('compiler.ops.guard')\n")
    names = imported_modules(source, tmp_path)
    assert {"compiler.ops.sparse_form", "compiler.policy", "compiler.passes", "compiler.ops.guard"} <= names
