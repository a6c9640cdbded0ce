"""The schedule of a compiled program: the instructions of its ENTRY
computation in the order they run, the asynchronous collectives (a ``-start``
and its ``-done``, or XLA's generic ``async-start``/``async-done`` around a
collective) with the computation scheduled between them, and how far each
collective sits from its first user."""
import re
from typing import Any

from . import _checks as check
from ._earlier import schedule as d2l
from .errors import InputError
from .hlo import COLLECTIVES

INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%?([\w.-]+) = .*? ([a-z][\w-]*)\(")
PLUMBING = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast",
            "copy", "partition-id", "replica-id", "after-all"}  # no arithmetic


def operand_names(line, start):
    """The ``%names`` inside the parentheses that open at ``line[start]``."""
    depth = 0
    for end in range(start, len(line)):
        depth += {"(": 1, ")": -1}.get(line[end], 0)
        if depth == 0:
            return re.findall(r"%([\w.-]+)", line[start:end])
    return re.findall(r"%([\w.-]+)", line[start:])


def _root_opcodes(hlo_text):
    """The opcode of each computation's ROOT instruction, by computation name."""
    roots, computation = {}, None
    for line in hlo_text.splitlines():
        if line[:1].strip() and line.rstrip().endswith("{"):  # a header
            words = line.split()
            computation = words[words[0] == "ENTRY"].lstrip("%")
        elif line.lstrip().startswith("ROOT") and computation:
            match = INSTRUCTION.match(line)
            if match:
                roots[computation] = match.group(2)
    return roots


def hlo_schedule(hlo_text):
    """The ENTRY computation of an HLO module as (name, opcode, operands)
    triples, in the order the compiled program runs them. A generic
    asynchronous operation (``async-start(...), calls=%c``, ``async-update``,
    ``async-done``) is named after the instruction it wraps, as XLA's syntax
    sugar prints it: ``reduce-scatter-start``, ``reduce-scatter-done``."""
    roots = _root_opcodes(hlo_text)
    entry = hlo_text[hlo_text.index("\nENTRY"):].split("\n}")[0]
    schedule, wrapped = [], {}  # wrapped: async name -> the opcode it wraps
    for line in entry.splitlines()[1:]:
        match = INSTRUCTION.match(line)
        if match:
            name, opcode = match.groups()
            operands, inner = operand_names(line, match.end() - 1), None
            if opcode == "async-start":
                called = re.search(r"\bcalls=%?([\w.-]+)", line)
                inner = roots.get(called.group(1)) if called else None
            elif opcode in ("async-update", "async-done") and operands:
                inner = wrapped.get(operands[0])
            if inner:
                wrapped[name] = inner
                opcode = inner + opcode[len("async"):]
            schedule.append((name, opcode, operands))
    return schedule


def async_pairs(schedule):
    """Each asynchronous operation of a schedule as (kind, start index, done
    index, opcodes scheduled between its start and its done)."""
    where = {name: i for i, (name, _, _) in enumerate(schedule)}
    pairs = []
    for done, (_, opcode, operands) in enumerate(schedule):
        if opcode.endswith("-done") and operands and operands[0] in where:
            start = where[operands[0]]
            while schedule[start][1].endswith("-update"):  # back to the start
                start = where[schedule[start][2][0]]
            between = [op for _, op, _ in schedule[start + 1:done]]
            pairs.append((opcode[:-len("-done")], start, done, between))
    return pairs


def collective_slack(schedule):
    """Each collective (or its ``-done``) as (opcode, index, index of its
    first user): the instructions between them do not wait for its result."""
    readers = {}  # name -> the indices of the instructions that read it
    for i, (_, _, operands) in enumerate(schedule):
        for operand in operands:
            readers.setdefault(operand, []).append(i)

    def first_use(name):  # looking through get-tuple-element
        uses = [first_use(schedule[i][0])
                if schedule[i][1] == "get-tuple-element" else i
                for i in readers.get(name, [])]
        return min(uses, default=len(schedule))

    return [(opcode, i, first_use(name))
            for i, (name, opcode, _) in enumerate(schedule)
            if opcode.removesuffix("-done") in d2l.COLLECTIVES]


def plot_schedule(schedule, figsize=(7, 2.8)):
    """Draw a schedule in program order: a tick per computing instruction, and
    for each collective a bar from its start to its first user."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=figsize)
    rows = collective_slack(schedule)
    starts = {done: start for _, start, done, _ in async_pairs(schedule)}
    for row, (opcode, at, use) in enumerate(rows, start=1):
        begin = starts.get(at, at)
        ax.barh(row, max(use - begin, 0.5), left=begin, height=0.6,
                color="#DD8452" if "reduce" in opcode else "#4C72B0")
    compute = [i for i, (_, opcode, _) in enumerate(schedule)
               if opcode not in PLUMBING
               and not opcode.endswith(("-start", "-update"))
               and opcode.removesuffix("-done") not in COLLECTIVES]
    ax.plot(compute, [0] * len(compute), "|", color="#222222", markersize=10)
    ax.set_yticks(range(len(rows) + 1),
                  ["compute"] + [opcode for opcode, _, _ in rows])
    ax.set_xlabel("position in the schedule "
                  "(collective: from its start to its first user)")
    ax.set_xlim(-1, len(schedule))
    ax.invert_yaxis()
    fig.tight_layout()
    return ax


Schedule = list[tuple[str, str, list[str]]]  # (name, opcode, operands) in program order


def _check_hlo_entry(hlo_text: str) -> None:
    """Refuse anything but the text of an HLO module with an ENTRY
    computation."""
    if not isinstance(hlo_text, str):
        raise InputError(f"hlo_schedule reads HLO text, not a "
                         f"{type(hlo_text).__name__}; pass "
                         f"jax.jit(f).lower(*args).compile().as_text()")
    if "\nENTRY" not in hlo_text:
        raise InputError("the text has no ENTRY computation; pass the HLO "
                         "text of a whole module, e.g. "
                         "jax.jit(f).lower(*args).compile().as_text()")


def _check_schedule(schedule: Schedule) -> None:
    """Refuse anything but a list of (name, opcode, operands) triples (``hlo_schedule``)."""
    if isinstance(schedule, str) or not all(
            isinstance(row, (tuple, list)) and len(row) == 3 for row in schedule):
        raise InputError(f"schedule must be a list of (name, opcode, operands) triples; make "
                         f"it with d2l.hlo_schedule(hlo_text), got {str(schedule)[:80]!r}")


def _check_plot(schedule: Schedule, figsize: tuple[float, float] = (7, 2.8)) -> Any:
    _check_schedule(schedule)
    check.positive(width=figsize[0], height=figsize[1])


hlo_schedule = check.validated(hlo_schedule, _check_hlo_entry)
async_pairs = check.validated(async_pairs, _check_schedule)
collective_slack = check.validated(collective_slack, _check_schedule)
plot_schedule = check.validated(plot_schedule, _check_plot)
