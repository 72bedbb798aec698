"""The project's module structure: no import cycle among decode/, distill/, kinds/ and scripts/, and every module
imports on its own (in a fresh interpreter, with no other project module imported first).

kinds/ holds the draft kinds as plug-ins: a kind's `Kind` (kinds/<kind>/__init__.py) imports the parts of its folder
inside its methods, when a caller needs them (its trainer, its deploy checks, ...). Those lazy imports are how the
registry reaches its plug-ins, not a dependency of the module: the graph leaves them out (`plugin_loading`)."""
from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

from helpers import ROOT, run_process

PACKAGES = ("decode", "distill", "kinds", "scripts")


def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every module inside the packages (folders without __init__.py are not packages)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if not all((ROOT.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
                continue
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports anywhere in its body (functions included): `import a.b`, `from a.b import
    c` (c itself when it is a module) and relative imports; not those under `if TYPE_CHECKING:` (annotations only:
    nothing is imported when the module runs)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in walk_runtime(ast.parse(path.read_text(), filename=str(path)), plugin_loading(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x / from .a import x
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


def plugin_loading(path: Path) -> bool:
    """Whether `path` is a kind's plug-in entry (kinds/<kind>/__init__.py), whose functions load its parts lazily."""
    parts = path.relative_to(ROOT).parts
    return len(parts) == 3 and parts[0] == "kinds" and parts[2] == "__init__.py"


def walk_runtime(tree: ast.AST, skip_functions: bool = False) -> Iterator[ast.AST]:
    """ast.walk without the bodies of `if TYPE_CHECKING:` blocks (and of functions, with ``skip_functions``)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        if skip_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        todo.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(path, modules) - {name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle [a, b, ..., a] of the graph, or None (depth-first search, colouring the nodes)."""
    state: dict[str, str] = {}  # "open" on the current path, "done" after

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for child in sorted(graph[node]):
            if state.get(child) == "open":
                return path[path.index(child):] + [child]
            if child not in state and (cycle := visit(child, path + [child])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_module_level_function_level_and_package_imports():
    graph = import_graph()
    assert "distill.losses.divergences" in graph["distill.losses.fused"]  # from distill.losses.divergences import ...
    assert "decode" in graph["distill.data.target_data"]  # from decode import speculative_generate
    assert "distill.publish.hub" in graph["distill.publish.export"]  # imported inside a function
    assert "decode.loop.stats" in graph["decode"]  # a package's __init__
    assert "distill.recipe.sections" not in graph["kinds.eagle3.loss"]  # under `if TYPE_CHECKING:`
    assert "kinds.eagle3.trainer" not in graph["kinds.eagle3"]  # a kind's plug-in entry loads its parts lazily
    assert "kinds.eagle3.options" in graph["kinds.eagle3"]  # ... but its module-level imports count


def test_imports_for_annotations_only_are_not_walked():
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
                     "if typing.TYPE_CHECKING:\n    import d\ndef f():\n    import e\n")
    imported = {alias.name for node in walk_runtime(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported == {"a", "c", "e"}


def test_no_import_cycle_among_project_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_imports_alone():
    """One interpreter; before each module every project module is dropped from sys.modules, so each import starts
    from nothing of the project (third-party libraries stay loaded: they are not what is tested)."""
    names = sorted(project_modules())
    program = (
        "import importlib, sys, traceback\n"
        f"packages, failed = {PACKAGES!r}, []\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] in packages]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        failed.append(name + ': ' + traceback.format_exc().strip().splitlines()[-1])\n"
        "print('\\n'.join(failed), file=sys.stderr)\n"
        "sys.exit(1 if failed else 0)\n"
    )
    run_process([sys.executable, "-c", program], timeout=300, env={"PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu"})


def test_no_library_module_imports_scripts():
    """decode/, distill/ and kinds/ are the library: the entry points in scripts/ import them, never the other way."""
    graph = import_graph()
    climbs = {name: sorted(m for m in imported if m.split(".")[0] == "scripts")
              for name, imported in graph.items() if name.split(".")[0] in ("decode", "distill", "kinds")}
    assert not {name: found for name, found in climbs.items() if found}


def test_a_run_is_the_six_named_steps_in_order():
    """distill.pipeline.run_recipe calls check, load, tokenise, distil, measure, export in the order the developer guide and the train guide give,
    each once, each in the module that owns it."""
    tree = ast.parse((ROOT / "distill" / "pipeline.py").read_text())
    run = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "run_recipe")
    calls = sorted((node for node in ast.walk(run) if isinstance(node, ast.Call)), key=lambda c: c.lineno)
    called = [c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", "") for c in calls]
    steps = ["check_run", "load_models", "training_rows", "distil", "measure_remaining", "export_run"]
    assert [name for name in called if name in steps] == steps
    owners = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)
              for alias in node.names if alias.name in steps}
    assert owners == {"distill.run.preflight", "distill.models.load", "distill.data.sources", "distill.run.trainer",
                      "distill.publish.export"}


MODULE_MAP = ROOT / "docs" / "developer" / "index.md"  # the developer guide's "Where things are"


def module_map() -> list[str]:
    """The modules listed in the developer guide's "Where things are" table, in order ('decode/loop/cache.py' ->
    'decode.loop.cache')."""
    text = MODULE_MAP.read_text()
    section = text.split("\n## Where things are\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [row.split("`")[1].removesuffix(".py").replace("/", ".") for row in rows]


def plugin_interface() -> set[str]:
    """What the library may import of kinds/ from anywhere: the registry, the interface and each kind's entry."""
    return {name for name, path in project_modules().items()
            if name in ("kinds", "kinds.base") or plugin_loading(path)}


def test_the_module_map_matches_the_tree_in_dependency_order():
    """Every module listed, each after what it imports; the kinds' folders come last (each kind's parts use the
    library), so the library's imports of the plug-in interface (the registry, kinds.base, a kind's entry) are the
    one exception, besides a package's line, which heads the modules it imports."""
    listed = module_map()
    graph = import_graph()
    files = {name for name in graph if "." in name and not name.startswith("decode.metrics")} | {"kinds"}
    assert sorted(listed) == sorted(files), (sorted(set(files) - set(listed)), sorted(set(listed) - set(files)))
    position, interface = {name: i for i, name in enumerate(listed)}, plugin_interface()
    late = [(name, dep) for name in listed for dep in graph[name] if dep in position and position[dep] > position[name]
            and not (dep in interface and not name.startswith("kinds")) and not dep.startswith(name + ".")]
    assert not late, f"listed before a module it imports: {late}"


def test_the_library_reaches_the_kinds_only_through_their_interface():
    """Outside kinds/, no module imports a kind's parts (its model, drafter, trainer, ...): only the registry, the
    interface and the kinds' entries, so a kind's folder is replaceable as a whole."""
    graph, interface = import_graph(), plugin_interface()
    reached = {name: sorted(dep for dep in deps if dep.startswith("kinds.") and dep not in interface)
               for name, deps in graph.items() if not name.startswith("kinds") and not name.startswith("scripts")}
    assert not {name: deps for name, deps in reached.items() if deps}


# distill/ grouped by the six steps and the concerns: every module inside a subpackage but these
DISTILL_TOP_LEVEL = {"distill.utils", "distill.fingerprints", "distill.pipeline"}


def project_packages() -> set[str]:
    return {name for name, path in project_modules().items() if path.name == "__init__.py"}


def test_every_distill_module_sits_in_a_subpackage():
    modules, packages = project_modules(), project_packages()
    top = {name for name in modules if name.count(".") == 1 and name.startswith("distill.") and name not in packages}
    assert top == DISTILL_TOP_LEVEL, sorted(top ^ DISTILL_TOP_LEVEL)


def test_distill_subpackages_say_what_they_hold_and_import_nothing():
    """Each subpackage's __init__ is a docstring only: `import distill.losses.divergences` loads no other module."""
    graph = import_graph()
    for package in sorted(name for name in project_packages() if name.startswith("distill.")):
        tree = ast.parse(project_modules()[package].read_text())
        assert ast.get_docstring(tree), f"{package}/__init__.py has no docstring"
        assert not graph[package], f"{package}/__init__.py imports {sorted(graph[package])}"


def test_the_module_map_lists_each_package_as_one_block_headed_by_its_own_line():
    listed = module_map()
    for package in sorted(project_packages() - set(PACKAGES)):
        inside = [i for i, name in enumerate(listed) if name == package or name.startswith(package + ".")]
        assert listed[inside[0]] == package, f"{package}'s line does not head its modules"
        assert inside == list(range(inside[0], inside[0] + len(inside))), f"{package}'s modules are not one block"
