"""The house rules of the library's imports, read from the source: every import counts (at module level, inside
functions and under ``if TYPE_CHECKING:`` alike). Rooms (packing, codecs, each room of loaders, each format) import
one another only along the arrows of :data:`ARROWS`; no module imports a private name (``_x``) of another room;
no import cycle anywhere; ``packing`` is pure (no torch, ``from torch import`` included, outside
``packing/batch.py``); nothing of the library imports ``bench``; no room of loaders holds more than 12 modules; and
a batch walks one way through the planned path."""

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


def import_nodes(path: Path):
    """Every import statement of a module (at module level, in functions, under ``if TYPE_CHECKING:``)."""
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _absolute(name: str, path: Path, node: ast.ImportFrom) -> str:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
    return base


def _module_of(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def imports(name: str, path: Path) -> set[str]:
    """The library modules ``name`` imports."""
    found = set()
    for node in import_nodes(path):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = _absolute(name, path, node)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            module = _module_of(target)
            if module and module != name:
                found.add(module)
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


def room(module: str) -> str:
    """The room of a library module: a top package (``mmfeed.packing``), a room of loaders
    (``mmfeed.loaders.planned``), a format (``mmfeed.loaders.formats.lerobot``), a module of the loaders root
    (``mmfeed.loaders.open``), the facade's private helpers (``mmfeed._util``) or a facade module."""
    parts = module.split(".")
    if parts[:2] == ["mmfeed", "loaders"] and len(parts) > 2:
        return ".".join(parts[:4]) if parts[2] == "formats" and len(parts) > 3 else ".".join(parts[:3])
    if len(parts) > 1 and parts[1] in ("packing", "codecs", "bench", "testing"):
        return ".".join(parts[:2])
    if len(parts) > 1 and parts[1].startswith("_") and parts[1] != "__main__":
        return "mmfeed._util"
    return module


LOADERS = "mmfeed.loaders"
ARROWS = {  # room -> the rooms it may import (besides itself and the facade's private helpers, mmfeed._util)
    "mmfeed._util": set(),
    "mmfeed.packing": set(),
    "mmfeed.codecs": set(),
    f"{LOADERS}.clock": set(),
    f"{LOADERS}.heap": set(),
    f"{LOADERS}.shm": {f"{LOADERS}.clock", "mmfeed.packing"},
    f"{LOADERS}.transport": {"mmfeed.codecs"},
    f"{LOADERS}.stores": {f"{LOADERS}.transport", "mmfeed.codecs", "mmfeed.packing"},
    f"{LOADERS}.sources": {f"{LOADERS}.stores", f"{LOADERS}.transport", f"{LOADERS}.clock", "mmfeed.codecs",
                           "mmfeed.packing"},
    f"{LOADERS}.formats": {f"{LOADERS}.sources"},
    f"{LOADERS}.formats.*": {f"{LOADERS}.formats", f"{LOADERS}.sources", f"{LOADERS}.stores",
                             f"{LOADERS}.transport", f"{LOADERS}.clock", f"{LOADERS}.heap", "mmfeed.codecs",
                             "mmfeed.packing"},
    f"{LOADERS}.open": {f"{LOADERS}.formats", f"{LOADERS}.formats.*", f"{LOADERS}.sources", f"{LOADERS}.stores",
                        f"{LOADERS}.transport"},
    f"{LOADERS}.observe": set(),
    f"{LOADERS}.planned": {f"{LOADERS}.sources", f"{LOADERS}.stores", f"{LOADERS}.transport", f"{LOADERS}.clock",
                           f"{LOADERS}.shm", f"{LOADERS}.heap", "mmfeed.codecs", "mmfeed.packing"},
    f"{LOADERS}.loop": {f"{LOADERS}.planned", f"{LOADERS}.observe", f"{LOADERS}.open", f"{LOADERS}.sources",
                        f"{LOADERS}.clock", f"{LOADERS}.shm", f"{LOADERS}.heap", "mmfeed.codecs", "mmfeed.packing"},
    f"{LOADERS}.streaming": {f"{LOADERS}.planned", f"{LOADERS}.formats.*", f"{LOADERS}.sources",
                             f"{LOADERS}.transport", f"{LOADERS}.clock", "mmfeed.codecs", "mmfeed.packing"},
    f"{LOADERS}.conversion": {f"{LOADERS}.open", f"{LOADERS}.formats.*", f"{LOADERS}.planned",
                              f"{LOADERS}.sources", f"{LOADERS}.stores", f"{LOADERS}.transport", "mmfeed.codecs",
                              "mmfeed.packing"},
    f"{LOADERS}.fill_cache": {f"{LOADERS}.open", f"{LOADERS}.sources", f"{LOADERS}.stores"},
    LOADERS: set(),  # names its rooms lazily (mmfeed._lazy): no import
}
"""The allowed arrows between the rooms of the library below the facade. The facade (``mmfeed``, its CLI,
``mmfeed.testing``) and ``bench`` sit on top and may import any room; no room here imports them."""


def allowed(source_room: str, target_room: str) -> bool:
    if target_room in (source_room, "mmfeed._util"):
        return True
    key = f"{LOADERS}.formats.*" if source_room.startswith(f"{LOADERS}.formats.") else source_room
    wanted = f"{LOADERS}.formats.*" if target_room.startswith(f"{LOADERS}.formats.") else target_room
    return wanted in ARROWS[key]


def test_the_graph_is_read():
    assert len(MODULES) > 80
    assert "mmfeed.loaders.formats" in GRAPH["mmfeed.loaders.open"]
    assert "mmfeed.loaders.sources.requests" in GRAPH["mmfeed.loaders.sources.windows"]


def test_every_room_of_the_library_is_in_the_table():
    rooms = {room(m) for m in MODULES if m.startswith(("mmfeed.loaders", "mmfeed.packing", "mmfeed.codecs"))}
    missing = {r for r in rooms if r not in ARROWS and not r.startswith(f"{LOADERS}.formats.")}
    assert not missing, f"rooms without a row in ARROWS: {sorted(missing)}"


def test_rooms_import_one_another_only_along_the_arrows():
    bad = []
    for name in sorted(GRAPH):
        source = room(name)
        if source not in ARROWS and not source.startswith(f"{LOADERS}.formats."):
            continue  # the facade, the CLI, mmfeed.testing and bench sit on top
        for target in sorted(edges_of(name)):
            if not allowed(source, room(target)):
                bad.append(f"{name} -> {target}")
    assert not bad, "imports against the rooms' arrows:\n" + "\n".join(bad)


def test_no_import_cycle_anywhere_type_checking_included():
    assert cycles() == []


def test_no_private_name_is_imported_across_rooms():
    bad = []
    for name, path in MODULES.items():
        for node in import_nodes(path):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _absolute(name, path, node)
            target = _module_of(base)
            if target is None or room(target) == room(name) or room(target) == "mmfeed._util":
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private:
                bad.append(f"{name} imports {private} from {base}")
    assert not bad, "\n".join(bad)


def _imports_torch(path: Path) -> bool:
    for node in import_nodes(path):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return True
    return False


def test_packing_is_pure():
    for name, targets in GRAPH.items():
        if name.startswith("mmfeed.packing") and name != "mmfeed.packing.batch":
            bad = {t for t in targets if t.startswith(("mmfeed.loaders", "mmfeed.codecs", "mmfeed.bench"))}
            assert not bad, f"{name} imports {bad}"
            assert not _imports_torch(MODULES[name]), f"{name} imports torch"


def test_the_torch_check_catches_every_spelling(tmp_path):
    for text in ("import torch\n", "from torch import nn\n", "import torch.nn as nn\n",
                 "from torch.utils import data\n", "def f():\n    import torch\n"):
        (tmp_path / "m.py").write_text(text)
        assert _imports_torch(tmp_path / "m.py"), text
    (tmp_path / "m.py").write_text("import torchvision_like\nx = 'import torch'\n")
    assert not _imports_torch(tmp_path / "m.py")


def test_codecs_are_a_leaf_and_the_library_imports_nothing_of_bench():
    for name, targets in GRAPH.items():
        if name.startswith("mmfeed.codecs"):
            assert not {t for t in targets if room(t) not in ("mmfeed.codecs", "mmfeed._util")}, name
        if not name.startswith(("mmfeed.bench", "mmfeed.cli", "mmfeed.__main__")):
            assert not {t for t in targets if t.startswith("mmfeed.bench")}, f"{name} imports bench"


def test_no_room_of_loaders_holds_more_than_12_modules():
    for folder in sorted(p for p in (ROOT / "loaders").rglob("*") if p.is_dir() and p.name != "__pycache__"):
        count = len(list(folder.glob("*.py")))
        assert count <= 12, f"loaders/{folder.relative_to(ROOT / 'loaders')} holds {count} modules"


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


@pytest.mark.parametrize("room_name", ["planned", "loop", "streaming", "conversion", "observe", "sources", "stores",
                                       "transport", "formats", "formats/lerobot", "formats/webdataset",
                                       "formats/hdf5", "formats/zarr"])
def test_each_room_is_a_package_with_its_own_docstring(room_name):
    init = ROOT / "loaders" / room_name / "__init__.py"
    assert init.is_file() and ast.get_docstring(ast.parse(init.read_text()))


def test_every_format_is_registered_and_the_recipe_is_written_down():
    from mmfeed.loaders.formats import FORMATS, registered

    folders = sorted(p.name for p in (ROOT / "loaders" / "formats").iterdir() if (p / "__init__.py").is_file())
    assert sorted(FORMATS) == folders
    assert [f.name for f in registered()] == list(FORMATS)
    recipe = ast.get_docstring(ast.parse((ROOT / "loaders" / "formats" / "__init__.py").read_text()))
    assert "Adding a format" in recipe and "FORMAT = Format(" in recipe


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


def test_the_loop_modules_form_no_cycle_also_not_for_annotations():
    """The loop's modules import one another one way, ``if TYPE_CHECKING:`` imports included: the epoch iterator
    and the epochs' owner know the loader only through protocols, never by importing dataloader."""
    loop = {name: path for name, path in MODULES.items() if name.startswith("mmfeed.loaders.loop.")}
    assert {"mmfeed.loaders.loop.epochs", "mmfeed.loaders.loop.epoch_iter"} <= set(loop)
    graph = {}
    for name, path in loop.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmfeed.loaders.loop."):
                found.add(node.module)
        graph[name] = found & set(loop)
    assert "mmfeed.loaders.loop.dataloader" not in graph["mmfeed.loaders.loop.epoch_iter"]
    assert "mmfeed.loaders.loop.dataloader" not in graph["mmfeed.loaders.loop.epochs"]
    done, visiting = set(), []

    def visit(name):
        assert name not in visiting, f"import cycle: {' -> '.join([*visiting, name])}"
        if name in done:
            return
        visiting.append(name)
        for target in graph[name]:
            visit(target)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_the_epoch_iterator_reads_no_private_member_of_the_loader_or_the_epochs():
    """The iterator reads the loader's public settings and the epochs' public verbs, nothing private of either."""
    tree = ast.parse((ROOT / "loaders" / "loop" / "epoch_iter.py").read_text())
    owners = {"loader", "epochs", "_settings", "_epochs"}
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            if name in owners:
                private.append(f"{name}.{node.attr} (line {node.lineno})")
    assert private == []
