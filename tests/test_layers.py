"""The import direction of ssmgate's layers (docs/extending.md#layers): a module imports only from
its own layer and the layers below it, and no experiment package imports another."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "ssmgate"

# lowest first; a module may import its own layer and any layer before it
LAYERS = [
    {"config_error", "storage_error", "processes", "xla_env", "malloc_env", "platform_env", "tree_paths", "plotting",
     "ssmgate"},
    {"cores"},
    {"theory"},
    {"tasks"},
    {"models"},
    {"train"},
    {"data"},
    {"interventions"},
    {"cli"},
    {"report"},
    {"programs"},   # the registry and every experiment package (which may not import each other)
    {"main", "reproduce", "ladder", "bench", "aot"},
]


def unit(module: str) -> str:
    """'ssmgate.train.loop' -> 'train'; 'ssmgate.programs.p1_kv.flags' -> 'programs.p1_kv'."""
    parts = module.split(".")
    if len(parts) == 1:
        return "ssmgate"
    if parts[1] == "programs" and len(parts) > 2 and parts[2] != "registry":
        return f"programs.{parts[2]}"
    return parts[1]


def layer(u: str) -> int:
    name = u.split(".")[0]
    return next(i for i, members in enumerate(LAYERS) if name in members)


def imports(path: Path):
    """(line, imported module) of every ssmgate import in `path`, function-level ones included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ssmgate":
            for alias in node.names:  # `from ssmgate.programs.p1_kv import flags` imports ssmgate.programs.p1_kv.flags
                sub = f"{node.module}.{alias.name}"
                as_module = ROOT.parent.joinpath(*sub.split(".")).with_suffix(".py").exists() \
                    or ROOT.parent.joinpath(*sub.split(".")).is_dir()
                yield node.lineno, sub if as_module else node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ssmgate":
                    yield node.lineno, alias.name


def violations(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        src = unit(module)
        for line, target in imports(path):
            dst = unit(target)
            where = f"{path.relative_to(root.parent)}:{line} imports {target}"
            if src.startswith("programs.") and dst.startswith("programs.") and src != dst:
                out.append(f"{where}: one experiment package imports another")
            elif dst != src and layer(dst) > layer(src):
                out.append(f"{where}: layer {src} imports the higher layer {dst}")
    return out


def test_every_module_belongs_to_a_layer():
    units = {unit(".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"))
             for p in ROOT.rglob("*.py")}
    for u in units:
        layer(u)  # StopIteration names a module outside LAYERS


def test_imports_go_down_the_layers_and_never_across_experiments():
    assert violations() == []


@pytest.mark.parametrize("source, message", [
    ("from ssmgate.programs.p1_kv import program\n", "one experiment package imports another"),
    ("from ssmgate.programs.p1_kv.program import offset_key\n", "one experiment package imports another"),
    ("import ssmgate.programs.registry\n", "layer models imports the higher layer programs"),
])
def test_the_check_catches_upward_and_sideways_imports(tmp_path, source, message):
    pkg = tmp_path / "ssmgate"
    for d in ("programs/p1_horn", "models"):
        (pkg / d).mkdir(parents=True)
    target = pkg / ("models/x.py" if "registry" in source else "programs/p1_horn/x.py")
    target.write_text(source)
    (pkg / "programs" / "p1_kv").mkdir()
    (pkg / "programs" / "p1_kv" / "program.py").write_text("")
    (pkg / "programs" / "registry.py").write_text("")
    found = violations(pkg)
    assert len(found) == 1 and message in found[0], found
