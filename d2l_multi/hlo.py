"""The collectives of a compiled program, read from its HLO text in every form XLA prints them.

XLA:CPU prints a collective as one instruction, ``%s = f32[8]{0} all-reduce(%x), ...``.
XLA:GPU runs collectives asynchronously and prints them in two more forms:

* a dedicated pair, ``all-reduce-start`` / ``all-reduce-done`` (also ``all-gather``,
  ``collective-permute``; and, in XLA's "syntax sugar" printing, ``reduce-scatter-start``,
  ``all-to-all-start``, with an ``-update`` that may sit between start and done);
* a generic asynchronous operation, ``async-start(...), calls=%comp`` / ``async-done``, whose
  called computation ``%comp`` holds the collective itself as one instruction (how XLA prints
  reduce-scatter and all-to-all by default).

``collective_ops`` reads each collective **once**: a ``-start`` stands for its pair (its
``-done`` is not counted), and a wrapped collective is read from the computation that holds it
(the ``async-start`` that calls it is not counted). ``COLLECTIVE_OP`` is the one pattern that
matches an instruction of each kind in its synchronous or ``-start`` form."""
import math
import re
from typing import NamedTuple

from . import _checks as check
from .errors import InputError

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute")

# One HLO instruction whose opcode is a collective, synchronous or a -start:
# "%name = <result type> <kind>(" or "... <kind>-start(".
COLLECTIVE_OP = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.-]+) = (?P<shape>.+?) "
    r"(?P<kind>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\(", re.M)

HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f16": 2, "bf16": 2, "s16": 2,
             "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8,
             "u64": 8}  # bytes per element of HLO's element types
_MORE_BYTES = {"s4": 0.5, "u4": 0.5, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1,
               "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3b11fnuz": 1, "f8e3m4": 1,
               "c64": 8, "c128": 16}

_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.-]+)\s.*\{\s*$")
_ASYNC_START = re.compile(r"\basync-start\(.*?\bcalls=%?([\w.-]+)")


class CollectiveOp(NamedTuple):
    """One collective of a compiled program, as each device runs it.

    ``kind``: one of ``COLLECTIVES``; ``name``: its instruction's name; ``asynchronous``: XLA
    runs it as a start and a done (``-start``, or wrapped by ``async-start``), not as one
    instruction; ``arrays``: ``(element type, shape)`` of each array it returns on one device;
    ``group_size``: the devices in each of its groups, ``k`` (for a ``collective-permute``,
    the devices that send)."""
    kind: str
    name: str
    asynchronous: bool
    arrays: tuple
    group_size: int

    @property
    def nbytes(self) -> float:
        """Bytes of the arrays it returns on one device."""
        return sum(math.prod(shape) * _element_bytes(dtype) for dtype, shape in self.arrays)


def _element_bytes(dtype):
    if dtype in HLO_BYTES:
        return HLO_BYTES[dtype]
    if dtype in _MORE_BYTES:
        return _MORE_BYTES[dtype]
    raise ValueError(f"unknown HLO element type {dtype!r}: add its bytes per element to "
                     f"d2l_multi/hlo.py")


def _tuple_elements(shape):
    """The top-level elements of an HLO tuple type, or ``[shape]`` for an array type."""
    shape = re.sub(r"/\*.*?\*/", "", shape).strip()
    if not shape.startswith("("):
        return [shape]
    elements, depth, begin = [], 0, 1
    for i, char in enumerate(shape):
        depth += {"(": 1, ")": -1, "{": 1, "}": -1, "[": 1, "]": -1}.get(char, 0)
        if (char == "," and depth == 1) or (char == ")" and depth == 0):
            elements.append(shape[begin:i].strip())
            begin = i + 1
        if depth == 0 and char == ")":
            break
    return [e for e in elements if e]


def _arrays(shape):
    """``(element type, shape)`` of every array in an HLO type, tuples flattened."""
    return tuple((dtype, tuple(int(d) for d in dims.split(",") if d))
                 for dtype, dims in _ARRAY.findall(re.sub(r"/\*.*?\*/", "", shape)))


def _group_size(line, kind, num_partitions):
    if kind == "collective-permute":
        pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
        return len(re.findall(r"\{", pairs.group(1))) if pairs else 0
    groups = re.search(r"replica_groups=(\{.*?\}\}|\{\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)",
                       line)
    if groups is None or groups.group(1) == "{}":
        return num_partitions
    text = groups.group(1)
    if text.startswith("["):  # iota form: [groups,size]<=[devices]
        return int(text[1:text.index("]")].split(",")[-1])
    return len(text[2:text.index("}")].split(","))


def _outputs(shape, kind, start):
    """The type of the arrays a collective returns, from its instruction's result type: a
    ``-start`` returns (operands, outputs, ...) except ``all-reduce-start``, whose result is
    its output."""
    if not start or kind == "all-reduce":
        return shape
    elements = _tuple_elements(shape)
    return elements[1] if len(elements) > 1 else elements[0]


def collective_ops(hlo_text: str) -> list:
    """Every collective of an HLO module's text, once each, as ``CollectiveOp`` records in the
    order they appear: synchronous instructions, ``-start``/``-done`` pairs (read at the
    start) and collectives wrapped by ``async-start(..., calls=%comp)`` (read in ``%comp``)."""
    partitions = re.search(r"\bnum_partitions=(\d+)", hlo_text)
    replicas = re.search(r"\breplica_count=(\d+)", hlo_text)
    devices = max(int(partitions.group(1)) if partitions else 1,
                  int(replicas.group(1)) if replicas else 1)
    wrapped = set(_ASYNC_START.findall(hlo_text))  # computations run asynchronously
    ops, computation = [], None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header and " = " not in line:
            computation = header.group(1)
            continue
        match = COLLECTIVE_OP.match(line)
        if match is None:
            continue
        kind, start = match.group("kind"), bool(match.group("start"))
        ops.append(CollectiveOp(
            kind=kind, name=match.group("name"),
            asynchronous=start or computation in wrapped,
            arrays=_arrays(_outputs(match.group("shape"), kind, start)),
            group_size=_group_size(line, kind, devices)))
    return ops


def _check_hlo_text(hlo_text: str) -> None:
    """Raise an InputError unless ``hlo_text`` is HLO text (a string), not a compiled program."""
    if not isinstance(hlo_text, str):
        raise InputError(f"HLO text is needed, not a {type(hlo_text).__name__}: "
                        f"pass f.lower(*args).compile().as_text()")


collective_ops = check.validated(collective_ops, _check_hlo_text)
