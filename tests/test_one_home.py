"""One home per concept (issue 20): each concept the issue lists is defined in exactly one place, found by an AST
scan of decode/, distill/ and scripts/.

A concept is a detector that returns its homes ("file:function" where the rule is written). Concepts already
unified must have one home; the others are strict xfails ("issue 20: not yet unified"): when one is unified its
test passes, the xfail fails as XPASS, and the marker is removed here. The dead names the issue lists must stay gone.
"""
from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("decode", "distill", "kinds", "specdistill", "scripts")


def sources() -> dict[str, ast.Module]:
    """'decode/inputs/prompts.py' -> its parsed module, for every Python file of the packages."""
    return {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(), filename=str(path))
            for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


SOURCES = sources()


def scopes() -> Iterator[tuple[str, ast.AST]]:
    """('file:qualname', node) of every function and class, and ('file:<module>', module) for module-level code."""
    for file, module in SOURCES.items():
        yield f"{file}:<module>", module

        def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    yield f"{file}:{name}", child
                    yield from walk(child, f"{name}.")
        yield from walk(module, "")


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a scope, not those of the functions and classes nested in it (they are scopes of their own)."""
    for child in ast.iter_child_nodes(scope):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield child
            yield from own_nodes(child)


def homes(test: Callable[[ast.AST], bool]) -> list[str]:
    """Scopes holding at least one node for which `test` is true."""
    return sorted({name for name, scope in scopes() if any(test(node) for node in own_nodes(scope))})


def defined(kind: type, pattern: Callable[[str], bool]) -> list[str]:
    """'file:qualname' of every function or class (`kind`) whose name matches."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if kind is ast.FunctionDef else (kind,)
    return sorted(name for name, node in scopes() if isinstance(node, kinds) and pattern(node.name))


def reads(node: ast.AST, name: str) -> bool:
    """`node` mentions `name` as a variable, an attribute or a string key (row["name"])."""
    return any((isinstance(n, ast.Name) and n.id == name) or (isinstance(n, ast.Attribute) and n.attr == name)
               or (isinstance(n, ast.Constant) and n.value == name) for n in ast.walk(node))


def call_name(node: ast.AST) -> str:
    if not isinstance(node, ast.Call):
        return ""
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


# ---------------------------------------------------------------------------------------------------------------
# Detectors: where each concept is written
# ---------------------------------------------------------------------------------------------------------------

def prompt_file_readers() -> list[str]:
    """Files defining a function that reads or encodes prompt files (read_prompt*, encode_prompt*)."""
    names = defined(ast.FunctionDef, lambda n: n.startswith(("read_prompt", "encode_prompt")))
    return sorted({name.split(":")[0] for name in names})


def auto_gamma_to_gamma() -> list[str]:
    """Scopes turning a `gamma: auto` row's mean_gamma (or the chosen gammas it is the mean of) into a gamma:
    round / min over candidates / float of it, or `mean_gamma if <auto> else gamma`."""
    def is_conversion(node: ast.AST) -> bool:
        if call_name(node) in ("round", "min", "float"):
            return reads(node, "mean_gamma") or reads(node, "chosen_gammas")
        return (isinstance(node, ast.IfExp) and not isinstance(node.body, ast.JoinedStr)  # not a label
                and reads(node.body, "mean_gamma") and reads(node.orelse, "gamma")
                and (reads(node.test, "is_auto") or reads(node.test, "auto")))
    return homes(is_conversion)


def cost_model_speedup() -> list[str]:
    """Scopes computing tau / (gamma * c + v)."""
    def is_formula(node: ast.AST) -> bool:
        return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.BinOp)
                and isinstance(node.right.op, ast.Add)
                and any(isinstance(s, ast.BinOp) and isinstance(s.op, ast.Mult) for s in (node.right.left,
                                                                                          node.right.right)))
    return homes(is_formula)


def extension_builder_maps() -> list[str]:
    """Module-level dicts from file suffixes ('.json') to datasets builder names."""
    def is_map(node: ast.AST) -> bool:
        return (isinstance(node, ast.Dict) and len(node.keys) > 1
                and all(isinstance(k, ast.Constant) and str(k.value).startswith(".") for k in node.keys)
                and all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in node.values))
    return [name for name in homes(is_map) if name.endswith(":<module>")]


def safetensors_header_readers() -> list[str]:
    """Scopes reading a safetensors header: its 8-byte length by hand, or through safetensors.safe_open."""
    return homes(lambda n: call_name(n) == "safe_open" or (
        call_name(n) == "read" and len(n.args) == 1 and isinstance(n.args[0], ast.Constant) and n.args[0].value == 8))


def lm_head_row_counts() -> list[str]:
    """Scopes counting an lm_head's rows: get_output_embeddings().weight.shape[0], or a function named so."""
    def is_count(node: ast.AST) -> bool:
        return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "shape" and reads(node.value, "get_output_embeddings"))
    return sorted(set(homes(is_count)) | set(defined(ast.FunctionDef, lambda n: "lm_head_rows" in n)))


def eos_cutters() -> list[str]:
    return defined(ast.FunctionDef, lambda n: "cut_at_eos" in n)


def atomic_writers() -> list[str]:
    """Scopes writing a temporary file and renaming it over the real one (os.replace next to a write)."""
    writes = ("write_text", "write_bytes", "dump", "write")
    return [name for name, scope in scopes()
            if any(call_name(n) == "replace" and reads(n, "os") for n in own_nodes(scope))
            and any(call_name(n) in writes for n in own_nodes(scope))]


# Concept -> (detector, unified already?). Unified concepts must have exactly one home.
CONCEPTS: dict[str, tuple[Callable[[], list[str]], bool]] = {
    "how a prompt file is read (decode/inputs/prompts.py)": (prompt_file_readers, True),
    "functions named read_prompt_file": (lambda: defined(ast.FunctionDef, lambda n: n == "read_prompt_file"), True),
    "classes named StepClock": (lambda: defined(ast.ClassDef, lambda n: n == "StepClock"), True),
    "reading a file as text (decode.inputs.checks.read_text)": (
        lambda: defined(ast.FunctionDef, lambda n: n == "read_text"), True),
    "refusing NaN/inf in recipes (recipe_schema.Section: pydantic's allow_inf_nan=False)": (
        lambda: homes(lambda n: isinstance(n, ast.keyword) and n.arg == "allow_inf_nan"), True),
    "refusing NaN/inf in flags (command_line.finite_float)": (
        lambda: defined(ast.FunctionDef, lambda n: n == "finite_float"), True),
    "gamma: auto -> a gamma": (auto_gamma_to_gamma, True),
    "the cost-model speedup tau / (gamma c + v)": (cost_model_speedup, True),
    "file extension -> datasets builder map": (extension_builder_maps, True),
    "safetensors header parsing": (safetensors_header_readers, True),
    "lm_head row count": (lm_head_row_counts, True),
    # decode.loop.speculative.cut_at_eos (on-policy sampling moved to decode/loop/batched.py)
    "cutting a token list at EOS": (eos_cutters, True),
    "atomic write (temporary file + os.replace)": (atomic_writers, True),
}


def concept_params() -> list:
    not_yet = pytest.mark.xfail(strict=True, reason="issue 20: not yet unified")
    return [pytest.param(name, marks=() if unified else not_yet, id=name) for name, (_, unified) in CONCEPTS.items()]


@pytest.mark.parametrize("concept", concept_params())
def test_concept_has_one_home(concept):
    detector, _ = CONCEPTS[concept]
    found = detector()
    assert len(found) == 1, f"{concept}: {len(found)} homes: {found}"


@pytest.mark.parametrize("concept", list(CONCEPTS))
def test_detector_finds_the_concept(concept):
    """A detector that finds nothing would pass nothing: every concept is found at least once."""
    assert CONCEPTS[concept][0](), concept


# ---------------------------------------------------------------------------------------------------------------
# Dead names stay gone
# ---------------------------------------------------------------------------------------------------------------

DEAD_NAMES = [("distill/recipe/sections.py", "DTYPES"), ("distill/recipe/sections.py", "DATA_FORMATS"),
              ("decode/inputs/prompts.py", "ChatTemplate"), ("decode/loop/stats.py", "block_efficiency"),
              ("decode/loop/auto_gamma.py", "mean_gamma"), ("decode/inputs/loading.py", "read_prompts"),
              ("decode/inputs/loading.py", "encode_prompts")]


@pytest.mark.parametrize("file, name", DEAD_NAMES)
def test_dead_name_is_gone(file, name):
    """Neither defined (assigned, def or class, at any depth) in its old file, nor imported from it anywhere."""
    for node in ast.walk(SOURCES[file]):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        assigned = [t.id for t in targets if isinstance(t, ast.Name)]
        named = getattr(node, "name", None) if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else None
        assert name not in assigned and name != named, f"{file} still defines {name}"
    module = file.removesuffix(".py").replace("/", ".")
    for path in [*SOURCES, *(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("*.py"))]:
        tree = SOURCES.get(path) or ast.parse((ROOT / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                assert name not in [alias.name for alias in node.names], f"{path} imports {name} from {module}"


# ---------------------------------------------------------------------------------------------------------------
# Kinds of draft: one interface (kinds), no branches on the kind elsewhere
# ---------------------------------------------------------------------------------------------------------------

# Where the kinds are implemented: kinds/, one folder per kind, and the registry (kinds/__init__.py). Everything a
# module outside could use to decide the kind itself is derived from the registry, so a new kind is covered at once.
def registry_vocabulary() -> tuple[set[str], set[str], set[str]]:
    """(names a kind goes by: its name, vLLM's method for it, prompt lookup's --draft value; the classes of its
    drafts in memory and in training; the recogniser functions of its folders)."""
    from kinds import KINDS

    names = {kind.name for kind in KINDS} | {kind.vllm_method for kind in KINDS} - {"draft_model"}
    names |= {"prompt-lookup", "PROMPT_LOOKUP"}
    classes, recognisers = set(), set()
    for file, module in SOURCES.items():
        if not file.startswith("kinds/"):
            continue
        for node in ast.walk(module):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Drafter", "Head", "Draft", "Training", "Kind")):
                classes.add(node.name)
            if isinstance(node, ast.FunctionDef) and node.name.startswith(tuple(f"is_{k.name}" for k in KINDS)):
                recognisers.add(node.name)
    return names, classes, recognisers


KIND_NAMES, DRAFT_CLASSES, KIND_RECOGNISERS = registry_vocabulary()


def branches_on_draft_kind(node: ast.AST) -> bool:
    """The kind decided outside kinds/: `isinstance(x, <a kind's draft class>)`; a call to a kind's folder
    recogniser (is_eagle3_folder, ...); a comparison with a kind's name or vLLM method (`draft_kind == "eagle3"`,
    `kind in ("dflash", ...)`); a table keyed by kind names (`{"standalone": A, "eagle3": B}`)."""
    if call_name(node) == "isinstance" and len(node.args) == 2:
        classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
        return any(getattr(c, "id", getattr(c, "attr", None)) in DRAFT_CLASSES for c in classes)
    if call_name(node) in KIND_RECOGNISERS:
        return True
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        sides += [e for s in sides if isinstance(s, (ast.Tuple, ast.List, ast.Set)) for e in s.elts]
        return any((isinstance(s, ast.Constant) and s.value in KIND_NAMES)
                   or (isinstance(s, ast.Name) and s.id in KIND_NAMES) for s in sides)
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value in KIND_NAMES for k in node.keys)
    return False


def kind_branches(sources: dict[str, ast.Module]) -> list[str]:
    """'file:line' of every branch on the draft kind outside kinds/."""
    return sorted(f"{file}:{node.lineno}" for file, module in sources.items() if not file.startswith("kinds/")
                  for node in ast.walk(module) if branches_on_draft_kind(node))


def test_no_module_outside_the_kinds_branches_on_the_draft_kind():
    found = kind_branches(SOURCES)
    assert not found, f"branches on the draft kind outside kinds/: {found}"


def test_the_kind_branch_detector_finds_each_pattern():
    """Each pattern a module could use to branch on the kind is caught (a detector that finds nothing passes
    nothing): by class, by name comparison, by a table keyed by kind names, by a kind-specific recogniser."""
    snippets = ["if isinstance(draft, Eagle3Head): pass", "ok = isinstance(d, (torch.nn.Module, PromptLookupDrafter))",
                "if isinstance(model, UnrolledHead): pass", "if isinstance(draft, DFlashDraft): pass",
                "wrapped = isinstance(model, BlockTraining)",
                "head = is_eagle3_folder(path)", "block = is_dflash_folder(path)",
                "if args.draft == PROMPT_LOOKUP: pass", "lookup = draft != 'prompt-lookup'", "skip = method == 'ngram'",
                "if recipe.model.draft_kind == 'eagle3': pass", "if kind in ('dflash', 'standalone'): pass",
                "TRAINERS = {'standalone': DistillTrainer, 'eagle3': HeadTrainer}",
                "CARD_TEXTS = {'dflash': CardText('...')}"]
    for snippet in snippets:
        assert kind_branches({"decode/other.py": ast.parse(snippet)}), snippet
    assert not kind_branches({"kinds/eagle3/drafter.py": ast.parse(snippets[0])})  # a kind's own folder may
    assert not kind_branches({"decode/other.py": ast.parse("spec = {'method': 'eagle3', 'model': path}")})


def test_the_registry_names_every_kind_folder_once():
    """One registry line per kind folder: each kinds/<name>/ holds the Kind that KINDS lists under that name."""
    from kinds import KINDS

    folders = sorted(p.name for p in (ROOT / "kinds").iterdir() if (p / "__init__.py").is_file())
    assert sorted(kind.name for kind in KINDS) == folders
    for kind in KINDS:
        assert type(kind).__module__ == f"kinds.{kind.name}", kind.name
