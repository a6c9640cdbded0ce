"""The recorded accelerator run that notebook 07b shows (d2l.H100_MODELS) is the one in
docs/benchmarks.md, figure for figure: the lesson loads it, nobody retypes it."""
import pathlib
import re

import d2l_multi as d2l

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def recorded_section():
    text = DOC.read_text()
    start = text.index("## One device of each kind")
    return text[start:text.index("\n## ", start + 1)]


def test_h100_rows_are_the_recorded_tables():
    rows, batch = [], None
    for line in recorded_section().splitlines():
        match = re.match(r"batch (\d+);", line)
        if match:
            batch = int(match.group(1))
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 7 and cells[0] != "model":
            model, device, ms, _, _, gflop, _ = cells
            rows.append((model, device, batch, float(ms), float(gflop)))
    assert rows and sorted(rows) == sorted(d2l.H100_MODELS["rows"])


def test_h100_machine_and_versions_are_the_recorded_ones():
    section = recorded_section()
    machine = re.search(r"machine: (.*?), load average [\d. ]+, (Linux .*)", section)
    assert d2l.H100_MODELS["machine"] == f"{machine.group(1)}, {machine.group(2)}"
    assert d2l.H100_MODELS["versions"] in section
