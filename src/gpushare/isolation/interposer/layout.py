"""region.h read from Python: its #define constants, and its structs as ctypes Structures,
so that the region's layout is written once, in the header the library is compiled from.

    text = HEADER.read_text()
    constants(text)["GS_MAX_GPUS"]                     # 16
    define(text, {"gs_gpu": GpuRecord, ...})           # fills in GpuRecord._fields_

Only the forms region.h uses are understood: `TYPE name;` and `TYPE name[N]...;` with a
fixed-width integer, `char`, or `struct gs_x` as TYPE and N a number or a constant; a
`union { ... } name;` (a pthread_mutex_t beside a char space that gives its size); and
`__attribute__((aligned(N)))` after a struct. The padding between members is what C's
alignment rules put there, computed here: ctypes adds none of its own (`_pack_ = 1`).
Anything else raises HeaderUnreadable naming the declaration, so a header edit this
cannot follow fails loudly rather than shifting the agent's offsets.
"""

from __future__ import annotations

import ast
import ctypes
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

HEADER: Final = Path(__file__).with_name("region.h")

_CType: TypeAlias = (
    "type[ctypes._SimpleCData[Any]] | type[ctypes.Structure] | type[ctypes.Array[Any]]"
)

_SCALARS: Final[Mapping[str, type[ctypes._SimpleCData[Any]]]] = {
    "char": ctypes.c_char,
    "uint8_t": ctypes.c_uint8,
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
}
_OPAQUE_ALIGNMENT: Final = {"pthread_mutex_t": ctypes.alignment(ctypes.c_long)}
"""The C library's types Python cannot size: only their alignment counts, as a union
member beside a char space that gives the size (region.c's layout test checks it fits)."""

_COMMENT: Final = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_DEFINE: Final = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+([^\n]+)$", re.M)
_LITERAL: Final = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b")
_MEMBER: Final = re.compile(r"^(?:struct\s+)?(\w+)\s+(\w+)((?:\s*\[\s*\w+\s*\])*)$")
_UNION: Final = re.compile(r"^union\s*\{(.*)\}\s*(\w+)$", re.S)
_ALIGNED: Final = re.compile(r"^__attribute__\s*\(\(\s*aligned\s*\(\s*(\w+)\s*\)\s*\)\)$")


class HeaderUnreadable(ValueError):
    """region.h holds a form this parser does not know; the message quotes it."""


@dataclass(frozen=True)
class _Member:
    name: str
    ctype: _CType
    size: int
    alignment: int


def constants(text: str) -> dict[str, int]:
    """Every `#define NAME VALUE` whose value is an integer expression (literals with
    C suffixes, earlier constants, + - * << | and parentheses); others are skipped."""
    found: dict[str, int] = {}
    for name, value in _DEFINE.findall(_COMMENT.sub("", text)):
        try:
            found[name] = _evaluate(_LITERAL.sub(r"\1", value.strip()), found)
        except (SyntaxError, ValueError):
            continue  # an include guard, a string, a macro with arguments
    return found


def define(text: str, classes: Mapping[str, type[ctypes.Structure]]) -> None:
    """Fills in each class's _fields_ from the struct of its name in `text`, in the
    header's order (a struct nested in another must be among `classes`)."""
    code = _COMMENT.sub("", text)
    known = constants(text)
    done: dict[str, _Member] = {}
    for match in re.finditer(r"\bstruct\s+(\w+)\s*\{", code):
        name = match.group(1)
        if name not in classes:
            continue
        body, attributes = _struct_body(code, match.end())
        members = [_member(d, known, done) for d in _declarations(body)]
        aligned = _ALIGNED.match(attributes.strip())
        if attributes.strip() and aligned is None:
            raise HeaderUnreadable(f"struct {name}: unknown attributes {attributes.strip()!r}")
        minimum = _number(aligned.group(1), known) if aligned else 1
        done[name] = _fill(classes[name], members, minimum)
    missing = set(classes) - done.keys()
    if missing:
        raise HeaderUnreadable(f"no struct {', '.join(sorted(missing))} in the header")


_OPERATORS: Final = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.LShift: operator.lshift,
    ast.BitOr: operator.or_,
}


def _evaluate(expression: str, known: Mapping[str, int]) -> int:
    def value(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id in known:
            return known[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return int(_OPERATORS[type(node.op)](value(node.left), value(node.right)))
        raise ValueError(ast.dump(node))

    return value(ast.parse(expression, mode="eval").body)


def _number(text: str, known: Mapping[str, int]) -> int:
    if text.isdigit():
        return int(text)
    if text in known:
        return known[text]
    raise HeaderUnreadable(f"{text!r} is neither a number nor a #define of one")


def _struct_body(code: str, start: int) -> tuple[str, str]:
    """The text between the brace before `start` and its match, and what follows that up
    to the `;` (the struct's attributes)."""
    depth = 1
    for at in range(start, len(code)):
        depth += {"{": 1, "}": -1}.get(code[at], 0)
        if depth == 0:
            end = code.index(";", at)
            return code[start:at], code[at + 1 : end]
    raise HeaderUnreadable("a struct's braces do not close")


def _declarations(body: str) -> list[str]:
    """The `;`-ended declarations at the top level of `body` (a union's are inside one)."""
    found, depth, start = [], 0, 0
    for at, char in enumerate(body):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == ";" and depth == 0:
            found.append(" ".join(body[start:at].split()))
            start = at + 1
    if body[start:].strip():
        raise HeaderUnreadable(f"{body[start:].strip()!r} does not end with ';'")
    return found


def _member(declaration: str, known: Mapping[str, int], structs: Mapping[str, _Member]) -> _Member:
    union = _UNION.match(declaration)
    if union:
        return _union(union.group(2), _declarations(union.group(1)), known, structs)
    match = _MEMBER.match(declaration)
    if match is None:
        raise HeaderUnreadable(f"cannot read the declaration {declaration!r}")
    type_name, name, dimensions = match.groups()
    element = _element(type_name, declaration, structs)
    ctype, size = element.ctype, element.size
    for dimension in reversed(re.findall(r"\w+", dimensions)):
        count = _number(dimension, known)
        ctype, size = ctype * count, size * count
    return _Member(name, ctype, size, element.alignment)


def _element(type_name: str, declaration: str, structs: Mapping[str, _Member]) -> _Member:
    if type_name in _SCALARS:
        scalar = _SCALARS[type_name]
        return _Member(type_name, scalar, ctypes.sizeof(scalar), ctypes.alignment(scalar))
    if type_name in structs:
        return structs[type_name]
    raise HeaderUnreadable(f"{declaration!r}: no Python type for {type_name!r}")


def _union(
    name: str, declarations: list[str], known: Mapping[str, int], structs: Mapping[str, _Member]
) -> _Member:
    """Bytes as many as its largest member Python can size, aligned as its most aligned."""
    size, alignment = 0, 1
    for declaration in declarations:
        opaque = declaration.split()[0]
        if opaque in _OPAQUE_ALIGNMENT:
            alignment = max(alignment, _OPAQUE_ALIGNMENT[opaque])
            continue
        member = _member(declaration, known, structs)
        size, alignment = max(size, member.size), max(alignment, member.alignment)
    if size == 0:
        raise HeaderUnreadable(f"union {name}: no member Python can size")
    size = -(-size // alignment) * alignment
    return _Member(name, ctypes.c_uint8 * size, size, alignment)


def _fill(cls: type[ctypes.Structure], members: list[_Member], minimum_alignment: int) -> _Member:
    """Sets cls's fields, with the padding C puts before each member and at the end."""
    fields: list[tuple[str, _CType]] = []
    offset, alignment = 0, minimum_alignment
    for member in members:
        gap = -offset % member.alignment
        if gap:
            fields.append((f"_pad_{len(fields)}", ctypes.c_uint8 * gap))
        fields.append((member.name, member.ctype))
        offset += gap + member.size
        alignment = max(alignment, member.alignment)
    if offset % alignment:
        fields.append((f"_pad_{len(fields)}", ctypes.c_uint8 * (-offset % alignment)))
    cls._pack_ = 1
    cls._fields_ = fields
    return _Member(cls.__name__, cls, ctypes.sizeof(cls), alignment)
