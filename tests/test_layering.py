"""The house rules of the library's imports, read from the source (module-level imports and those inside
functions alike): no import cycle anywhere; ``packing`` imports nothing of ``loaders``, ``codecs`` or torch
outside ``packing/batch.py``; ``codecs`` nothing of ``loaders`` or ``packing``; the sources nothing of the loaders
root but the stage clock; nothing of the library imports ``bench``; and a batch walks one way through the planned
path."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"mmfeed": "mmfeed", "mmfeed.packing": "packing", "mmfeed.loaders": "loaders", "mmfeed.codecs": "codecs",
            "mmfeed.bench": "bench"}


def modules() -> dict[str, Path]:
    """Every module of the library by its dotted name."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if package == "mmfeed" and parts and parts[0] == "testing":
                pass
            out[".".join([package, *parts])] = path
    return out


MODULES = modules()


def imports(name: str, path: Path) -> set[str]:
    """The library modules ``name`` imports (at module level or in any function; TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` imports are for annotations only
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skip.update(id(n) for n in ast.walk(node))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports(name, path) for name, path in MODULES.items()}
# a package's __init__ that only names its modules lazily (mmfeed._lazy) is not an import of them
LAZY = {name for name, path in MODULES.items() if path.name == "__init__.py" and "lazy_exports" in path.read_text()}


def edges_of(name: str) -> set[str]:
    return {t for t in GRAPH[name] if not (t in LAZY and name.startswith(t + "."))}


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges_of(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    assert len(MODULES) > 80
    assert "mmfeed.loaders.formats.lerobot.source" in GRAPH["mmfeed.loaders.open"]


def test_no_import_cycle_anywhere_also_not_inside_functions():
    assert cycles() == []


def test_packing_is_pure():
    for name, targets in GRAPH.items():
        if name.startswith("mmfeed.packing") and name != "mmfeed.packing.batch":
            bad = {t for t in targets if t.startswith(("mmfeed.loaders", "mmfeed.codecs", "mmfeed.bench"))}
            assert not bad, f"{name} imports {bad}"
            source = MODULES[name].read_text()
            assert "import torch" not in source, f"{name} imports torch"


def test_codecs_know_nothing_of_loaders_or_packing_and_the_library_nothing_of_bench():
    for name, targets in GRAPH.items():
        if name.startswith("mmfeed.codecs"):
            assert not {t for t in targets if t.startswith(("mmfeed.loaders", "mmfeed.packing"))}, name
        if not name.startswith(("mmfeed.bench", "mmfeed.cli", "mmfeed.__main__")):
            assert not {t for t in targets if t.startswith("mmfeed.bench")}, f"{name} imports bench"


def test_sources_import_nothing_of_the_loaders_root_but_the_stage_clock():
    for name, targets in GRAPH.items():
        if name.startswith("mmfeed.loaders.sources"):
            outside = {t for t in targets if t.startswith("mmfeed.loaders") and not t.startswith("mmfeed.loaders.sources")}
            assert outside <= {"mmfeed.loaders.clock"}, f"{name} imports {outside}"


def test_collation_calls_no_item_kind_and_no_dataset_back():
    """Items hand collation data (``items.reads``); collation and its steps import nothing of the item kinds or
    the dataset, and the steps nothing of collation."""
    kinds = {"mmfeed.loaders.planned.items", "mmfeed.loaders.planned.records", "mmfeed.loaders.planned.dataset"}
    for name in ("mmfeed.loaders.planned.collate", "mmfeed.loaders.planned.steps", "mmfeed.loaders.planned.reads"):
        assert not GRAPH[name] & kinds, f"{name} imports {GRAPH[name] & kinds}"
    assert "mmfeed.loaders.planned.collate" not in GRAPH["mmfeed.loaders.planned.steps"]
    for name in ("mmfeed.loaders.planned.items", "mmfeed.loaders.planned.records"):
        assert "mmfeed.loaders.planned.collate" not in GRAPH[name], f"{name} imports collation"


def test_a_stream_is_given_what_it_reads_not_the_dataset_that_starts_it():
    """The streaming dataset imports its worker's stream, never the reverse, not even for annotations."""
    assert "mmfeed.loaders.streaming.worker" in GRAPH["mmfeed.loaders.streaming.dataset"]
    tree = ast.parse(MODULES["mmfeed.loaders.streaming.worker"].read_text())
    named = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "mmfeed.loaders.streaming.dataset" not in named and "TYPE_CHECKING" not in ast.dump(tree)


def test_the_loop_imports_the_planned_path_never_the_reverse():
    for name, targets in GRAPH.items():
        if name.startswith("mmfeed.loaders.planned"):
            assert not {t for t in targets if t.startswith("mmfeed.loaders.loop")}, f"{name} imports the loop"


@pytest.mark.parametrize("room", ["planned", "loop", "streaming", "conversion", "observe"])
def test_each_room_is_a_package_with_its_own_docstring(room):
    init = ROOT / "loaders" / room / "__init__.py"
    assert init.is_file() and ast.get_docstring(ast.parse(init.read_text()))


PATH = ["mmfeed.loaders.loop.dataloader", "mmfeed.loaders.planned.dataset", "mmfeed.loaders.planned.items",
        "mmfeed.packing.epoch", "mmfeed.packing.samples", "mmfeed.loaders.sources.requests",
        "mmfeed.loaders.planned.collate", "mmfeed.loaders.planned.steps"]


def test_a_batch_walks_one_way():
    """The modules a batch crosses from the sampler to the collated batch (the README's list): each imports the
    next it hands work to, and none imports back up the path."""
    position = {name: k for k, name in enumerate(PATH)}
    for name in PATH:
        back = {t for t in GRAPH[name] if t in position and position[t] < position[name]}
        assert not back, f"{name} imports {back}, earlier on the path"
