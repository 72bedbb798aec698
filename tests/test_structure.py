"""The project's module structure: floors that only look down, no import cycle anywhere (function-level imports
included), and every module imports on its own (in a fresh interpreter, with no other project module imported first).

The floors, each importing only those below it: decode/ (the decoder and its measurements), distill/ (the trainer),
kinds/ (one folder per kind of draft, plug-ins into both), specdistill/ (the commands, the run pipeline, the recipe
schema: where a kind is chosen), scripts/ (entry files run by path). decode/ and distill/ never import kinds/ and
name no kind: the kind is handed down to them as a value. The registry (kinds/__init__.py) imports each kind's folder
named in KIND_FOLDERS (importlib): the graph draws those arrows too."""
from __future__ import annotations

import ast
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

from helpers import ROOT, run_process

FLOORS = ("decode", "distill", "kinds", "specdistill", "scripts")  # bottom to top
PACKAGES = FLOORS
LIBRARY = ("decode", "distill")  # the floors that never look a kind up


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every module inside the packages (folders without __init__.py are not packages)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            if not all((root.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
                continue
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(path: Path, modules: dict[str, Path], root: Path = ROOT, annotations: bool = False) -> set[str]:
    """The project modules `path` imports anywhere in its body (functions included): `import a.b`, `from a.b import
    c` (c itself when it is a module) and relative imports; those under `if TYPE_CHECKING:` only with
    ``annotations`` (nothing is imported when the module runs). The registry's kinds (KIND_FOLDERS) too."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in (ast.walk(tree) if annotations else walk_runtime(tree)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x / from .a import x
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "KIND_FOLDERS" for t in node.targets):
            names = [f"kinds.{folder}" for folder in ast.literal_eval(node.value)]  # import_module(f"kinds.{folder}")
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


def walk_runtime(tree: ast.AST) -> Iterator[ast.AST]:
    """ast.walk without the bodies of `if TYPE_CHECKING:` blocks."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def import_graph(root: Path = ROOT, annotations: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports (every import, function-level ones included; with ``annotations``
    those under `if TYPE_CHECKING:` too)."""
    modules = project_modules(root)
    return {name: imported_modules(path, modules, root, annotations) - {name} for name, path in modules.items()}


def floor(module: str) -> int:
    return FLOORS.index(module.split(".")[0])


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
    assert "distill.recipe.sections" in import_graph(annotations=True)["kinds.eagle3.loss"]  # ... counted on demand
    assert "kinds.eagle3.trainer" in graph["kinds.eagle3"]  # a kind's entry loads its parts inside its methods
    assert {"kinds.dflash", "kinds.standalone"} <= graph["kinds"]  # the registry's KIND_FOLDERS (importlib)


def test_imports_for_annotations_only_are_not_walked():
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
                     "if typing.TYPE_CHECKING:\n    import d\ndef f():\n    import e\n")
    imported = {alias.name for node in walk_runtime(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported == {"a", "c", "e"}


def test_no_import_cycle_among_project_modules():
    """None at all: function-level imports and those for annotations only included."""
    cycle = find_cycle(import_graph(annotations=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every import of a module on a higher floor than the importer's."""
    return sorted(f"{name} -> {dep}" for name, deps in graph.items() for dep in deps if floor(dep) > floor(name))


def test_no_floor_imports_one_above_it():
    """decode/ < distill/ < kinds/ < specdistill/ < scripts/: every arrow of the import graph runs down or sideways."""
    assert not upward_imports(import_graph(annotations=True))


def test_the_floor_check_catches_an_arrow_up():
    assert upward_imports({"decode.loop.speculative": {"kinds"}, "kinds": {"decode.loop.speculative"}}) == [
        "decode.loop.speculative -> kinds"]


def kind_names() -> set[str]:
    """Every name a kind goes by: its name, its folder, the --draft value naming it (not its former names: the
    standalone kind's "model" is also the recipe section's name)."""
    from kinds import KIND_FOLDERS, KINDS

    names = {*KIND_FOLDERS} | {kind.name for kind in KINDS}
    return names | {name.replace("_", "-") for name in names}


def kind_name_literals(tree: ast.AST, names: set[str]) -> list[int]:
    """The lines of string constants that are a kind's name (docstrings and prose are not: they equal no name)."""
    return sorted({node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
                   and isinstance(node.value, str) and node.value in names})


def test_decode_and_distill_name_no_kind():
    """The kind is handed down: decode/ and distill/ import nothing of kinds/ (not the registry, not a kind, not
    kinds.base: the protocols each floor asks of a kind live on that floor) and hold no kind's name as a string."""
    graph, names = import_graph(annotations=True), kind_names()
    imports = {name: sorted(dep for dep in deps if dep.split(".")[0] == "kinds")
               for name, deps in graph.items() if name.split(".")[0] in LIBRARY}
    assert not {name: deps for name, deps in imports.items() if deps}
    literals = {f"{path.relative_to(ROOT)}:{line}" for name, path in project_modules().items()
                if name.split(".")[0] in LIBRARY
                for line in kind_name_literals(ast.parse(path.read_text()), names)}
    assert not literals, sorted(literals)


def test_the_name_check_catches_a_kind_name():
    tree = ast.parse('"""A docstring about standalone drafts."""\nif kind == "eagle3":\n    pass\nx = "p-eagle"\n')
    assert kind_name_literals(tree, kind_names()) == [2, 4]


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
    """decode/, distill/, kinds/ and specdistill/ are the library: the entry points in scripts/ import them, never
    the other way."""
    graph = import_graph()
    climbs = {name: sorted(m for m in imported if m.split(".")[0] == "scripts")
              for name, imported in graph.items() if name.split(".")[0] != "scripts"}
    assert not {name: found for name, found in climbs.items() if found}


def test_a_run_is_the_six_named_steps_in_order():
    """specdistill.pipeline.run_recipe calls check, load, tokenise, distil, measure, export in the order the developer
    guide and the train guide give, each once, each in the module that owns it."""
    tree = ast.parse((ROOT / "specdistill" / "pipeline.py").read_text())
    run = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "run_recipe")
    calls = sorted((node for node in ast.walk(run) if isinstance(node, ast.Call)), key=lambda c: c.lineno)
    called = [c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", "") for c in calls]
    steps = ["check_run", "load_models", "training_rows", "distil", "measure_remaining", "export_run"]
    assert [name for name in called if name in steps] == steps
    owners = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)
              for alias in node.names if alias.name in steps}
    assert owners == {"distill.run.preflight", "distill.models.load", "distill.data.sources", "distill.run.distil",
                      "distill.publish.export"}


MODULE_MAP = ROOT / "docs" / "developer" / "index.md"  # the developer guide's "Where things are"


def module_map() -> list[str]:
    """The modules listed in the developer guide's "Where things are" table, in order ('decode/loop/cache.py' ->
    'decode.loop.cache')."""
    text = MODULE_MAP.read_text()
    section = text.split("\n## Where things are\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [row.split("`")[1].removesuffix(".py").replace("/", ".") for row in rows]


def test_the_module_map_matches_the_tree_in_dependency_order():
    """Every module listed, each after what it imports (function-level imports included), the floors in order
    (decode/, distill/, kinds/, specdistill/, scripts/); a package's line, which heads the modules it imports, is the
    one exception."""
    listed = module_map()
    graph = import_graph()
    files = {name for name in graph
             if ("." in name and not name.startswith("decode.metrics")) or name in ("kinds", "specdistill")}
    assert sorted(listed) == sorted(files), (sorted(set(files) - set(listed)), sorted(set(listed) - set(files)))
    position = {name: i for i, name in enumerate(listed)}
    late = [(name, dep) for name in listed for dep in graph[name] if dep in position and position[dep] > position[name]
            and not dep.startswith(name + ".")]
    assert not late, f"listed before a module it imports: {late}"


def test_the_top_floor_reaches_the_kinds_through_the_registry():
    """specdistill/ and scripts/ import of kinds/ only the registry, kinds.base and the kinds' entries
    (kinds/<kind>/__init__.py): a kind's folder is replaceable as a whole."""
    graph, modules = import_graph(), project_modules()
    entries = {"kinds", "kinds.base"} | {name for name, path in modules.items() if name.startswith("kinds.")
                                         and path.name == "__init__.py" and name.count(".") == 1}
    reached = {name: sorted(dep for dep in deps if dep.startswith("kinds.") and dep not in entries)
               for name, deps in graph.items() if floor(name) > floor("kinds")}
    assert not {name: deps for name, deps in reached.items() if deps}


# distill/ grouped by the six steps and the concerns: every module inside a subpackage but these
DISTILL_TOP_LEVEL = {"distill.utils", "distill.fingerprints"}


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


# ---------------------------------------------------------------------------------------------------------------
# A new kind: one folder and one line
# ---------------------------------------------------------------------------------------------------------------
THROWAWAY = '''"""A throwaway kind (tests/test_structure.py): it drafts the newest token again, gamma times."""
from __future__ import annotations

from pydantic import BaseModel, Field

from kinds.base import Kind


class ThrowawayOptions(BaseModel):
    throwaway_width: int = Field(1, ge=1, description="throwaway: a key of its own.")


class RepeatDrafter:
    aux_layers = ()

    def start(self, prefix, target_vocab_size):
        pass

    def propose(self, history, cur, gamma, cfg, generator):
        return cur.view(-1).repeat(gamma), None

    def commit(self, num_accepted):
        pass

    def target_features(self, aux, tokens):
        pass


class ThrowawayKind(Kind):
    name, title, summary, trains = "throwaway", "throwaway drafts", "a test's kind", True
    model_options = ThrowawayOptions

    def recognises(self, draft):
        return draft == "throwaway"

    def holds(self, draft):
        return isinstance(draft, RepeatDrafter)

    def load(self, draft, target, device, dtype, trust_remote_code=False, earliest=False):
        return RepeatDrafter()

    def drafter(self, draft, target, compile=False, capacity=0, max_gamma=8):
        return draft


KIND = ThrowawayKind()
'''

USE_IT = '''
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from decode import autoregressive_generate
from kinds import kind_named, kind_of_source
from specdistill.drafts import speculative_generate
from specdistill.recipes import RecipeError, build_recipe

kind = kind_named("throwaway")
assert kind_of_source("throwaway") is kind and kind.__module__ == "kinds.throwaway"
import kinds
assert kinds.__file__.startswith(sys.argv[1]), kinds.__file__
recipe = build_recipe({"model": {"target": "t", "draft_kind": "throwaway", "throwaway_width": 3},
                       "data": {"dataset": "d.txt"}})
assert recipe.model.kind is kind and recipe.model.throwaway_width == 3
try:
    build_recipe({"model": {"target": "t", "draft": "d", "throwaway_width": 3}, "data": {"dataset": "d.txt"}})
    raise SystemExit("another kind's key was accepted")
except RecipeError as err:
    assert "model.draft_kind throwaway" in str(err), err
torch.manual_seed(0)
target = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)).eval()
prompt = torch.tensor([[1, 5, 7, 5]])
draft = kind.load("throwaway", target, "cpu", torch.float32)
out = speculative_generate(target, draft, prompt, max_new_tokens=12, gamma=3)
assert out.new_tokens == autoregressive_generate(target, prompt, max_new_tokens=12).new_tokens
print("ok")
'''


def test_a_new_kind_is_one_folder_and_one_line(tmp_path):
    """A copy of the library with a throwaway kind: its folder, one line added to the registry (nothing else
    changes), and it is recognised, trained by recipes with its own keys, and decoded by the library; the copy keeps
    every floor rule."""
    for package in ("decode", "distill", "kinds", "specdistill"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "kinds" / "throwaway").mkdir()
    (tmp_path / "kinds" / "throwaway" / "__init__.py").write_text(THROWAWAY)
    registry = tmp_path / "kinds" / "__init__.py"
    before = registry.read_text().splitlines()
    at = before.index('    "standalone",')  # the standalone kind stays last: it takes any folder
    registry.write_text("\n".join([*before[:at], '    "throwaway",', *before[at:]]) + "\n")
    assert len(registry.read_text().splitlines()) == len(before) + 1
    run_process([sys.executable, "-c", textwrap.dedent(USE_IT), str(tmp_path)], timeout=300,
                env={"PYTHONPATH": str(tmp_path), "DS_ACCELERATOR": "cpu"}, cwd=tmp_path)
    graph = import_graph(tmp_path, annotations=True)
    assert "kinds.throwaway" in graph["kinds"]
    assert find_cycle(graph) is None and not upward_imports(graph)
