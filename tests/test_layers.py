"""The package's imports point one way: every suzak module belongs to a layer, imports only its own layer or those
below, and no chain of imports runs in a circle (docs/architecture.md draws the layers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "suzak"

# Lowest first. A module matches the longest name or "name.*" pattern it falls under.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaves", ("suzak", "suzak.media.*", "suzak.scoring", "suzak.scoring.prompts", "suzak.scoring.parsing",
                "suzak.trl_internals.*", "suzak.runs.redaction")),  # redaction: which names are secret, read by all
    ("data, models, rewards", ("suzak.data.*", "suzak.models.*", "suzak.scoring.*")),  # scoring: the rewards by task
    ("eval", ("suzak.eval.*",)),
    ("runs", ("suzak.runs.*",)),
    ("release", ("suzak.release.*",)),
    ("training", ("suzak.training.*",)),
    ("commands", ("suzak.train", "suzak.sft", "suzak.selftest.*", "suzak.watch", "suzak.__main__")),
]  # fmt: skip


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def layer_of(module: str) -> int:
    for number, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if (
                module == pattern
                or (pattern.endswith(".*") and module.startswith(pattern[:-1]))
                or (pattern.endswith(".*") and module == pattern[:-2])
            ):
                return number
    raise AssertionError(f"{module} is in no layer of tests/test_layers.py: place it (and in docs/architecture.md)")


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """suzak modules ``path`` imports, at module level or inside functions alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "suzak"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "suzak":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return {name for name in found if name in modules}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    names = module_names()
    return {name: imports_of(path, set(names)) - {name} for name, path in names.items()}


def test_every_module_has_a_layer(graph):
    for module in graph:
        layer_of(module)


def test_architecture_md_names_every_module(graph):
    """docs/architecture.md stays true to the code: its table names each module of the package (in backquotes,
    the full dotted name), and no module that is gone."""
    import re

    text = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(suzak(?:\.[A-Za-z_0-9]+)*)`", text))
    missing = sorted(set(graph) - named)
    assert not missing, f"docs/architecture.md does not name {missing}"
    gone = sorted(name for name in named if name not in graph and not _is_attribute(name, graph))
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


def _is_attribute(name: str, graph) -> bool:
    """``suzak.media.vision.patch_factor``-style names: a name a module of the package defines."""
    import importlib

    module, _, attribute = name.rpartition(".")
    return module in graph and hasattr(importlib.import_module(module), attribute)


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
            for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a)]  # fmt: skip


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``a -> b -> a``) of ``graph``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycle = path + [module, target]
                return cycle[cycle.index(target) :]
            if target not in state and (cycle := visit(target, path + [module])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [])):
            return cycle
    return None


def test_imports_point_down(graph):
    assert upward_edges(graph) == []


def test_no_import_cycles(graph):
    assert find_cycle(graph) is None


def test_the_checks_can_fail():
    """An eval module importing the trainer is reported, and so are two modules importing each other."""
    assert upward_edges({"suzak.eval.runner": {"suzak.training.trainer"}}) == [
        "suzak.eval.runner (eval) imports suzak.training.trainer (training)"
    ]
    assert find_cycle(
        {"suzak.scoring.parsing": {"suzak.media.vision"}, "suzak.media.vision": {"suzak.scoring.parsing"}}
    ) == ["suzak.media.vision", "suzak.scoring.parsing", "suzak.media.vision"]


# --- the picture of the layers in docs/architecture.md, drawn from the graph ------------------------------------------

ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"
BEGIN, END = "<!-- layers: drawn by `python tests/test_layers.py`; do not edit -->", "<!-- end of layers -->"


def room_of(module: str) -> str:
    """The folder a module lives in (``data/``), or the module itself at the package's top (``train``)."""
    parts = module.split(".")[1:]
    if not parts:
        return "suzak"
    return f"{parts[0]}/" if (PACKAGE / parts[0]).is_dir() else parts[0]


def layers_picture(graph: dict[str, set[str]]) -> str:
    """The layers top to bottom, each with its rooms (a folder's modules of that layer in brackets) and, under
    them, the rooms of lower layers they import: the picture docs/architecture.md shows, drawn from the code."""
    import textwrap

    lines = []
    for number in reversed(range(len(LAYERS))):
        mine = sorted(m for m in graph if layer_of(m) == number)
        rooms: dict[str, list[str]] = {}
        for module in mine:
            rooms.setdefault(room_of(module), []).append(module.split(".")[-1])
        shown = [room + (f" ({', '.join(sorted(set(names) - {room.rstrip('/')}))})" if room.endswith("/") else "")
                 for room, names in rooms.items()]  # fmt: skip
        below = sorted({room_of(t) for m in mine for t in graph[m] if layer_of(t) < number} - set(rooms))
        name = LAYERS[number][0]
        body = textwrap.wrap("  ".join(shown), 100, break_on_hyphens=False)
        lines += [f"{name:<24}{body[0]}", *(" " * 24 + line for line in body[1:])]
        if below:
            lines += textwrap.wrap("imports " + ", ".join(below), 124, initial_indent=" " * 24,
                                   subsequent_indent=" " * 32)  # fmt: skip
        lines.append("")
    return "\n".join(["```", *lines[:-1], "```"])


def drawn_block(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise AssertionError(f"docs/architecture.md lacks the layers' markers {BEGIN!r} ... {END!r}")
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()


def test_architecture_md_draws_the_layers_as_they_are(graph):
    """The picture of the layers in docs/architecture.md is the one the code draws now (``python
    tests/test_layers.py`` redraws it after a move), so it cannot drift."""
    assert drawn_block(ARCHITECTURE.read_text(encoding="utf-8")) == layers_picture(graph), (
        "docs/architecture.md's layers are out of date: run python tests/test_layers.py"
    )


def test_the_package_top_holds_at_most_16_entries():
    """src/suzak reads at a glance: the commands, trl_internals and the packages (docs/architecture.md)."""
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 16, entries


if __name__ == "__main__":  # redraw docs/architecture.md's picture of the layers
    names = module_names()
    drawn = layers_picture({name: imports_of(path, set(names)) - {name} for name, path in names.items()})
    text = ARCHITECTURE.read_text(encoding="utf-8")
    drawn_block(text)  # the markers are there
    head, tail = text[: text.index(BEGIN) + len(BEGIN)], text[text.index(END) :]
    ARCHITECTURE.write_text(f"{head}\n{drawn}\n{tail}", encoding="utf-8")
    print(f"{ARCHITECTURE}: layers redrawn")
