"""docs/architecture.md says what the import contracts say: its table of the core is the
core contract's modules, its table of layers is the layers contract, and its table of
contracts names every contract of pyproject.toml's `[tool.importlinter]`, with what each
forbids. A module or a contract added to one side and not the other fails here."""

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
IMPORTLINTER = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]

CORE_HEADING = "## The pure core (`src/gpushare/`, no I/O)"
CONTRACTS_HEADING = "## The import contracts"
CORE_CELL = "the core"
"""A cell of the contracts table that starts so stands for the core's table."""
LAYERS_CELL = "the layers"
"""... and one that starts so for every package of the layers' table."""
DOCUMENTED_KEYS = {"name", "type", "source_modules", "forbidden_modules", "layers"}
"""What the page describes of a contract; another key (ignore_imports, containers, ...)
changes what a contract means, so it has to be described before this test lets it by."""


def _section(text: str, heading: str) -> str:
    """The page's text from `heading` to the next heading of the same level or higher."""
    start = text.index(heading + "\n") + len(heading)
    rest = text[start:]
    end = re.search(r"^## ", rest, re.M)
    return rest[: end.start()] if end else rest


def _tables(section: str) -> list[list[list[str]]]:
    """Each table of the section, as its rows of cells: header and separator left out."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        if current is None:
            current = []
            tables.append(current)
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if all(set(cell) <= set("-: ") for cell in cells):
            continue
        current.append(cells)
    return tables


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([\w.]+)`", cell))


def core_modules(text: str) -> set[str]:
    """The core's table: `x.py` is gpushare.x, and so is the folder `x/`."""
    [table] = _tables(_section(text, CORE_HEADING))
    modules = set()
    for first, *_ in table:
        found = re.fullmatch(r"`(\w+)(?:\.py|/)`", first)
        assert found, f"the core's table has a row that names no module or folder: {first}"
        modules.add(f"gpushare.{found.group(1)}")
    return modules


def layers(text: str) -> list[set[str]]:
    """The layers' table, top to bottom: each layer's packages."""
    rows = _tables(_section(text, CONTRACTS_HEADING))[1]
    assert [row[0] for row in rows] == [str(n) for n in range(1, len(rows) + 1)]
    return [_names(row[1]) for row in rows]


def contracts(text: str) -> dict[str, list[str]]:
    """The contracts' table by contract name: kind, modules, may not import."""
    rows = _tables(_section(text, CONTRACTS_HEADING))[0]
    return {name: rest for name, *rest in rows}


def resolve(cell: str, text: str) -> set[str]:
    """A cell of the contracts table as the modules it stands for."""
    if cell.startswith(CORE_CELL):
        return core_modules(text)
    if cell.startswith(LAYERS_CELL):
        return set().union(*layers(text))
    assert _names(cell), f"a cell of the contracts table names no module: {cell}"
    return _names(cell)


def declared_layers(contract: Mapping[str, Any]) -> list[set[str]]:
    """A layers contract's layers; `|` between packages makes them independent (as the
    page says), `:` would not, so it is refused here until the page can say it."""
    assert not any(":" in layer for layer in contract["layers"]), contract["layers"]
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


@pytest.fixture(scope="module")
def text() -> str:
    return PAGE.read_text()


def test_the_page_names_every_contract_and_no_other(text: str):
    declared = {c["name"]: c["type"] for c in IMPORTLINTER["contracts"]}
    described = {name: kind for name, (kind, *_) in contracts(text).items()}
    assert described == declared


def test_each_contract_says_only_what_the_page_describes():
    assert IMPORTLINTER["root_package"] == "gpushare"
    for contract in IMPORTLINTER["contracts"]:
        assert set(contract) <= DOCUMENTED_KEYS, contract["name"]


def test_each_forbidden_contract_forbids_what_the_page_says(text: str):
    described = contracts(text)
    for contract in IMPORTLINTER["contracts"]:
        if contract["type"] != "forbidden":
            continue
        _, sources, forbidden = described[contract["name"]]
        assert set(contract["source_modules"]) == resolve(sources, text), contract["name"]
        assert set(contract["forbidden_modules"]) == resolve(forbidden, text), contract["name"]


def test_the_core_table_is_the_core_contract(text: str):
    """Said twice on purpose: the test above reads it through the contracts table, this
    one names the contract, so a rewording of the table cannot hide a missing module."""
    [core] = [c for c in IMPORTLINTER["contracts"] if c["name"].startswith("The pure core")]
    assert sorted(core_modules(text)) == sorted(core["source_modules"])


def test_the_layers_table_is_the_layers_contract(text: str):
    [contract] = [c for c in IMPORTLINTER["contracts"] if c["type"] == "layers"]
    assert layers(text) == declared_layers(contract)
    assert contracts(text)[contract["name"]][1].startswith(LAYERS_CELL)


def test_the_parsers_read_tables_as_the_page_writes_them():
    page = "\n".join(
        [
            CORE_HEADING,
            "",
            "| module | holds |",
            "|---|---|",
            "| `one.py` | a | b |",
            "| `two/` | c |",
            "",
            "## Next",
            "| `three.py` | not the core's |",
        ]
    )
    assert core_modules(page) == {"gpushare.one", "gpushare.two"}
    assert resolve("`gpushare`, `tests`", page) == {"gpushare", "tests"}
    assert declared_layers({"layers": ["a", "b | c"]}) == [{"a"}, {"b", "c"}]
