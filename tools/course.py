"""The course's map, read from the notebooks' headers (run from the project root).

    python tools/course.py figure   # book/figures/course_map.svg: which notebook needs which
    python tools/course.py table    # the teacher's table of sessions (Markdown, to stdout)

Every notebook opens with a header whose ``**Prerequisites:**`` line links the notebooks it
builds on; those links are the arrows of the map. The core track is ``CORE``, in order; the
appendix is the ``A*`` notebooks; everything else is an elective. Reading minutes are counted
as chapter-check counts them (prose words / 200 + code lines / 10); full-run times come from
the notebooks' stored run (``metadata.d2l_multi.run.seconds``), when there is one.
"""
import itertools
import json
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
CORE = ["00_devices", "01_lenet_from_scratch", "02_allreduce", "03_data_parallel_from_scratch",
        "04a_jit_and_shardings", "04b_shard_map", "07b_predicting_steps",
        "09_sharded_matmuls"]
LINK = re.compile(r"\]\((\w+)\.ipynb\)")
SPLIT = {  # what suits class time and what homework, as the notebooks' authors planned them
    "00_devices": "all in class",
    "01_lenet_from_scratch": "class; the training loop at home",
    "02_allreduce": "class up to the ring; the ring's details at home",
    "03_data_parallel_from_scratch": "class",
    "04a_jit_and_shardings": "class",
    "04b_shard_map": "class",
    "07b_predicting_steps": "class; the step calculator at home",
    "09_sharded_matmuls": "class; the H100 and TPU problems at home",
    "05a_flax": "class; Linen with pmap at home",
    "05b_batchnorm": "class",
    "05c_resnet": "the chart in class; the training at home",
    "06_keras": "home",
    "07a_collectives": "timing and the fit in class",
    "07c_mixed_precision": "class",
    "07d_low_precision_communication": "class, or home after 07c",
    "08_ensembles": "home",
    "09a_memory": "the chart in class; the large models at home",
    "09b_remat": "class",
    "12_capstone": "home, over a week; the answers discussed in class",
}


def source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def notebooks():
    """{name: (title, prerequisites, reading minutes, full-run seconds or None)}."""
    found = {}
    for path in sorted(CHAPTERS.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        first = source(nb["cells"][0])
        title = first.splitlines()[0].lstrip("# ").strip()
        line = next((x for x in first.split("\n\n") if x.startswith("**Prerequisites:**")), "")
        words = code = 0
        for cell in nb["cells"]:
            text = source(cell)
            if cell["cell_type"] == "markdown":
                words += len(text.split())
            elif cell["cell_type"] == "code":
                code += sum(1 for x in text.splitlines() if x.strip())
        run = nb.get("metadata", {}).get("d2l_multi", {}).get("run", {})
        found[path.stem] = (title, LINK.findall(line.split("**Learning goals:**")[0]),
                            words / 200 + code / 10, run.get("seconds"))
    return found


def kind(name):
    return "core" if name in CORE else "appendix" if name.startswith("A") else "elective"


def figure(out=ROOT / "book" / "figures" / "course_map.svg"):
    """Draw the map: the core track on a line, each elective or appendix notebook below the
    last core notebook it needs, arrows from every prerequisite."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    plt.rcParams.update({"svg.fonttype": "path", "font.size": 8,
                         "font.family": "DejaVu Sans"})
    nbs = notebooks()
    col = {name: i for i, name in enumerate(CORE)}
    place = {name: (col[name], 0) for name in CORE}
    depth = {}
    for name in sorted(nbs, key=lambda n: (n not in CORE, n)):
        if name in place:
            continue
        needs = nbs[name][1]
        base = max((place[n][0] for n in needs if n in place), default=0)
        row = 1 + max([place[n][1] for n in needs if n in place and place[n][0] == base
                       and n not in CORE] + [depth.get(base, 0)])
        depth[base] = row
        place[name] = (base, row)
    width, height = 1.55, 0.78
    cols = max(x for x, _ in place.values()) + 1
    rows = max(y for _, y in place.values()) + 1
    fig = plt.figure(figsize=(cols * width + 0.3, rows * height + 0.6))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(-0.15, cols * width + 0.15)
    ax.set_ylim(-(rows - 1) * height - 0.5, 0.5)
    ax.axis("off")
    faces = {"core": "#4C72B0", "elective": "#C9D6EA", "appendix": "#E6E6E6"}

    def centre(name):
        x, y = place[name]
        return x * width + width / 2, -y * height

    for name, (x, y) in place.items():
        cx, cy = centre(name)
        title = nbs[name][0].removeprefix("Appendix: ").replace("`", "")
        lines = textwrap.wrap(title, 21, max_lines=2, placeholder=" …")
        label = name.split("_", 1)[0] + "\n" + "\n".join(lines)
        ax.add_patch(FancyBboxPatch((cx - 0.68, cy - 0.3), 1.36, 0.6,
                                    boxstyle="round,pad=0.02,rounding_size=0.05",
                                    facecolor=faces[kind(name)], edgecolor="#222222",
                                    linewidth=0.8, zorder=2))
        ax.text(cx, cy, label, ha="center", va="center", fontsize=6.5, zorder=3,
                color="white" if kind(name) == "core" else "#222222")
    def arrow(a, b, rad=0.0):
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=7,
                                     color="#555555", linewidth=0.6, shrinkA=0,
                                     shrinkB=0, zorder=1,
                                     connectionstyle=f"arc3,rad={rad}"))

    for a, b in itertools.pairwise(CORE):  # the track, in order
        (x0, y0), (x1, y1) = centre(a), centre(b)
        arrow((x0 + 0.68, y0), (x1 - 0.68, y1))
    for name in place:  # an elective hangs below its last core class: arrows among the rest
        for need in nbs[name][1]:
            if need in place and need not in CORE and need != name:
                (x0, y0), (x1, y1) = centre(need), centre(name)
                if x0 == x1:
                    arrow((x0, y0 - 0.3), (x1, y1 + 0.3), 0.0 if y0 - y1 <= height else 0.25)
                else:
                    arrow((x0 + (0.68 if x1 > x0 else -0.68), y0),
                          (x1 + (-0.68 if x1 > x0 else 0.68), y1), 0.1)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None} if out.suffix == ".svg" else None)
    plt.close(fig)
    return out


def table():
    """The sessions of the core track, then the electives and the appendix, as Markdown."""
    nbs = notebooks()
    rows = ["| class | notebook | builds on | reading (min) | full run on 2 cores "
            "| in class / at home |",
            "|---|---|---|---|---|---|"]
    order = CORE + sorted(n for n in nbs if kind(n) == "elective") + sorted(
        n for n in nbs if kind(n) == "appendix")
    for i, name in enumerate(order, 1):
        title, needs, minutes, seconds = nbs[name]
        label = str(i) if name in CORE else kind(name)
        run = "—" if seconds is None else (f"{seconds:.0f} s" if seconds < 60 else
                                           f"{seconds // 60:.0f} min {seconds % 60:.0f} s")
        rows.append(f"| {label} | [{title}](chapters/{name}.ipynb) | "
                    f"{', '.join(n.split('_', 1)[0] for n in needs) or '—'} | "
                    f"{minutes:.0f} | {run} | {SPLIT.get(name, 'class')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "figure"
    print(figure() if what == "figure" else table())
