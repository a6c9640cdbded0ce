"""Draw the chapter's diagrams as SVG files in chapters/img/ (run from the project root).

    python tools/figures.py            # all figures
    python tools/figures.py ring       # the figures whose name contains 'ring'

Text is stored as paths, so the files render the same everywhere, with no font to fetch.
"""
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = pathlib.Path(__file__).resolve().parent.parent / "chapters" / "img"
DEVICE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]     # one colour per device
LIGHT = ["#C9D6EA", "#F5D5BF", "#C6E3CD", "#EDC3C4"]
GREY, INK = "#E6E6E6", "#222222"
plt.rcParams.update({"svg.fonttype": "path", "font.size": 10, "font.family": "DejaVu Sans"})


def canvas(width, height):
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, width), ax.set_ylim(0, height), ax.axis("off")
    return fig, ax


def box(ax, x, y, w, h, text="", face=GREY, edge=INK, size=10, weight="normal", lw=1.0,
        style="round,pad=0.02,rounding_size=0.06", color=INK):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=style, facecolor=face, edgecolor=edge,
                                linewidth=lw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                weight=weight, color=color)


def arrow(ax, start, end, color=INK, lw=1.2, style="-|>", rad=0.0, ls="-"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=11, color=color,
                                 linewidth=lw, linestyle=ls,
                                 connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))


def save(fig, name):
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / f"{name}.svg", metadata={"Date": None})  # no date: reproducible files
    plt.close(fig)


def layers_column(ax, x, y0, w, h, n, faces, labels=None, gap=0.18):
    """n stacked layer boxes from the bottom (input) up."""
    for i in range(n):
        box(ax, x, y0 + i * (h + gap), w, h, labels[i] if labels else f"layer {i + 1}",
            face=faces[i], size=9)


def split_network():
    """Network partitioning: consecutive layers live on different devices."""
    fig, ax = canvas(5.2, 3.4)
    ax.text(2.6, 3.2, "Network partitioning: each device holds some layers", ha="center",
            size=10, weight="bold")
    faces = [LIGHT[0], LIGHT[0], LIGHT[1], LIGHT[1]]
    layers_column(ax, 1.9, 0.55, 1.4, 0.42, 4, faces)
    box(ax, 0.2, 0.55, 1.25, 1.0, "device 0\nlayers 1-2", face=DEVICE[0], color="white",
        size=9)
    box(ax, 0.2, 1.75, 1.25, 1.0, "device 1\nlayers 3-4", face=DEVICE[1], color="white",
        size=9)
    ax.text(2.6, 0.25, "input batch", ha="center", size=9)
    arrow(ax, (2.6, 0.35), (2.6, 0.55))
    arrow(ax, (3.45, 1.2), (3.45, 1.85), color=DEVICE[1], rad=-0.5)
    ax.text(3.7, 1.55, "activations\nforward", size=8, va="center", color=DEVICE[1])
    arrow(ax, (3.95, 1.85), (3.95, 1.2), color=DEVICE[0], rad=-0.5)
    ax.text(4.2, 1.3, "gradients\nbackward", size=8, va="center", color=DEVICE[0])
    save(fig, "split_network")


def split_layers():
    """Layer-wise partitioning: every layer's units (channels) are split over the devices."""
    fig, ax = canvas(5.2, 3.4)
    ax.text(2.6, 3.2, "Layer-wise partitioning: each device holds half of each layer",
            ha="center", size=10, weight="bold")
    for i in range(4):
        y = 0.55 + i * 0.6
        box(ax, 1.2, y, 1.35, 0.42, f"layer {i + 1}, half A", face=LIGHT[0], size=8)
        box(ax, 2.65, y, 1.35, 0.42, f"layer {i + 1}, half B", face=LIGHT[1], size=8)
        if i < 3:
            arrow(ax, (2.1, y + 0.42), (3.1, y + 0.6), color="#777777", lw=0.8)
            arrow(ax, (3.1, y + 0.42), (2.1, y + 0.6), color="#777777", lw=0.8)
    ax.text(0.65, 1.6, "device 0", ha="center", color=DEVICE[0], weight="bold", size=9)
    ax.text(4.55, 1.6, "device 1", ha="center", color=DEVICE[1], weight="bold", size=9)
    ax.text(2.6, 0.2, "every layer exchanges activations with the other half", ha="center",
            size=8, color="#555555")
    save(fig, "split_layers")


def split_data():
    """Data parallelism: every device holds the whole model and a slice of the batch."""
    fig, ax = canvas(5.2, 3.4)
    ax.text(2.6, 3.2, "Data parallelism: each device holds the whole model", ha="center",
            size=10, weight="bold")
    for d, x in enumerate((0.55, 3.05)):
        for i in range(4):
            box(ax, x, 0.95 + i * 0.45, 1.6, 0.32, f"layer {i + 1}", face=LIGHT[d], size=8)
        box(ax, x + 0.3, 0.35, 1.0, 0.36, f"batch part {d + 1}", face=DEVICE[d],
            color="white", size=8)
        ax.text(x + 0.8, 2.85, f"device {d}", ha="center", color=DEVICE[d], weight="bold",
                size=9)
    arrow(ax, (2.2, 1.85), (3.0, 1.85), style="<|-|>", color=INK)
    ax.text(2.6, 2.0, "allreduce\ngradients", ha="center", va="bottom", size=8)
    save(fig, "split_data")


def data_parallel_step():
    """One data-parallel SGD step on k = 4 devices."""
    fig, ax = canvas(8.2, 4.2)
    box(ax, 2.6, 3.6, 3.0, 0.42, "mini-batch of B examples", face=GREY, size=9)
    for d in range(4):
        x = 0.35 + d * 2.0
        arrow(ax, (4.1, 3.6), (x + 0.8, 3.15), color="#777777", lw=0.9)
        box(ax, x, 2.7, 1.6, 0.42, "B/4 examples", face=DEVICE[d], color="white", size=9)
        box(ax, x, 1.85, 1.6, 0.6, f"device {d}\nloss, gradient $g_{d}$", face=LIGHT[d],
            size=8)
        arrow(ax, (x + 0.8, 2.7), (x + 0.8, 2.45))
        arrow(ax, (x + 0.8, 1.85), (x + 0.8, 1.45))
        box(ax, x, 0.35, 1.6, 0.5, r"$w \leftarrow w - \eta\, \bar g$", face=LIGHT[d], size=9)
        arrow(ax, (x + 0.8, 1.05), (x + 0.8, 0.85))
    box(ax, 0.35, 1.05, 7.6, 0.4, r"allreduce: every device gets $\bar g = \frac{1}{4}"
        r"(g_0 + g_1 + g_2 + g_3)$", face="#FFF2CC", size=9)
    ax.text(0.1, 3.0, "split", size=8, rotation=90, va="center", color="#555555")
    ax.text(0.1, 2.15, "compute", size=8, rotation=90, va="center", color="#555555")
    ax.text(0.1, 0.6, "update", size=8, rotation=90, va="center", color="#555555")
    save(fig, "data_parallel_step")


def ring_allreduce():
    """The ring on k = 4 devices: each sends to its right neighbour, one chunk per step."""
    import math
    fig, ax = canvas(8.4, 3.6)
    centre, radius = (1.8, 1.75), 1.15
    points = []
    for d in range(4):
        angle = math.pi / 2 - d * math.pi / 2
        x, y = centre[0] + radius * math.cos(angle), centre[1] + radius * math.sin(angle)
        points.append((x, y))
        box(ax, x - 0.42, y - 0.26, 0.84, 0.52, f"device {d}", face=DEVICE[d],
            color="white", size=8)
    for d in range(4):
        (x0, y0), (x1, y1) = points[d], points[(d + 1) % 4]
        arrow(ax, (x0 + 0.35 * (x1 - x0), y0 + 0.35 * (y1 - y0)),
              (x0 + 0.65 * (x1 - x0), y0 + 0.65 * (y1 - y0)), rad=0.0, lw=1.4)
    ax.text(1.8, 0.05, "each device sends to its right neighbour", ha="center", size=8)
    # the chunks: device d's array in 4 chunks; after reduce-scatter device d owns chunk d+1
    ax.text(5.9, 3.35, "every device's gradient, cut into k = 4 chunks", ha="center",
            size=9, weight="bold")
    for d in range(4):
        y = 2.6 - d * 0.5
        ax.text(3.85, y + 0.17, f"device {d}", size=8, color=DEVICE[d], ha="left")
        for c in range(4):
            owner = c == (d + 1) % 4
            box(ax, 4.65 + c * 0.62, y, 0.56, 0.34, f"{c}", face=DEVICE[d] if owner
                else LIGHT[d], color="white" if owner else INK, size=8,
                style="square,pad=0.0")
    ax.text(5.9, 0.35, "reduce-scatter (k-1 steps): after it, device d holds the full sum of\n"
            "chunk d+1 (dark).  all-gather (k-1 steps): the finished chunks go once\n"
            "around the ring.  Each device sends 2(k-1) chunks of n/k bytes.",
            ha="center", size=8)
    save(fig, "ring_allreduce")


def gather_to_one():
    """Allreduce through one device: everyone sends to device 0, which sends the sum back."""
    fig, ax = canvas(4.2, 3.0)
    box(ax, 1.6, 2.2, 1.0, 0.5, "device 0", face=DEVICE[0], color="white", size=8)
    for d, x in zip((1, 2, 3), (0.3, 1.6, 2.9)):
        box(ax, x, 0.4, 1.0, 0.5, f"device {d}", face=DEVICE[d], color="white", size=8)
        arrow(ax, (x + 0.35, 0.9), (2.0, 2.2), rad=0.0)
        arrow(ax, (2.2, 2.2), (x + 0.65, 0.9), rad=0.0, ls="--", color="#777777")
    ax.text(2.1, 2.85, "gather to one, then broadcast", ha="center", size=9, weight="bold")
    ax.text(2.1, 0.1, "device 0 receives and sends (k-1)·n bytes", ha="center", size=8)
    save(fig, "gather_to_one")


def lenet():
    """LeNet's layers and the shape of a batch of b images after each."""
    fig, ax = canvas(8.6, 1.9)
    layers = [("input", "b×28×28×1"), ("conv 3×3\n+ ReLU", "b×26×26×20"),
              ("avg pool\n2×2", "b×13×13×20"), ("conv 5×5\n+ ReLU", "b×9×9×50"),
              ("avg pool\n2×2", "b×4×4×50"), ("flatten", "b×800"),
              ("dense\n+ ReLU", "b×128"), ("dense", "b×10")]
    for i, (name, shape) in enumerate(layers):
        x = 0.15 + i * 1.06
        box(ax, x, 0.75, 0.9, 0.75, name, face=LIGHT[i % 2] if i else GREY, size=8)
        ax.text(x + 0.45, 0.45, shape, ha="center", size=7.5, color="#444444")
        if i:
            arrow(ax, (x - 0.16, 1.12), (x, 1.12))
    save(fig, "lenet")


def three_modes():
    """JAX's three ways to program many devices, on one array of 16 rows over 8 devices."""
    fig, ax = canvas(8.7, 3.5)
    modes = [("automatic", "jax.jit + shardings, Auto axes", "the global program",
              "inputs only; the compiler\npicks the rest", "float32[16,4]",
              "inserted by the compiler"),
             ("explicit", "jax.jit, Explicit axes", "the global program",
              "in every array's type,\nchecked op by op", "float32[16@data,4]",
              "inserted by the compiler"),
             ("manual", "jax.shard_map", "the program of one device",
              "in_specs / out_specs", "float32[2,4]{V:data}", "written by you (psum)")]
    for m, (name, api, view, shardings, typ, collectives) in enumerate(modes):
        x = 0.15 + m * 2.9
        box(ax, x, 0.1, 2.7, 3.3, face="#FAFAFA", edge="#999999")
        box(ax, x, 2.95, 2.7, 0.45, name, face=DEVICE[m], color="white", weight="bold",
            size=10)
        ax.text(x + 1.35, 2.72, api, ha="center", size=8, family="DejaVu Sans Mono")
        # the array: one block (automatic), one block cut in 8 typed bands (explicit),
        # 8 separate blocks (manual)
        for r in range(8):
            y = 1.62 + (7 - r) * 0.11
            if m == 0:
                box(ax, x + 0.25, y, 0.7, 0.11, face=LIGHT[0], edge=LIGHT[0],
                    style="square,pad=0.0", lw=0.5)
            elif m == 1:
                box(ax, x + 0.25, y, 0.7, 0.11, face=LIGHT[r % 2 + 1], edge="#777777",
                    style="square,pad=0.0", lw=0.5)
            else:
                box(ax, x + 0.25 + (r % 2) * 0.38, 1.62 + (3 - r // 2) * 0.22, 0.32, 0.16,
                    face=LIGHT[2], edge="#777777", style="square,pad=0.0", lw=0.5)
        ax.text(x + 1.1, 2.06, "you write:\n" + view, size=7.5, va="center")
        ax.text(x + 0.15, 1.3, "shardings: " + shardings, size=7.5, va="top")
        ax.text(x + 0.15, 0.78, "type: " + typ, size=7.5, va="top")
        ax.text(x + 0.15, 0.48, "collectives: " + collectives, size=7.5, va="top")
    save(fig, "three_modes")


def shard_map_grad():
    """Why grad inside shard_map sums: the replicated w is cast to varying
    (jax.lax.pcast(w, 'data', to='varying'), which JAX inserts) where it meets the device's
    batch; the transpose of that cast is a psum of the gradients."""
    fig, ax = canvas(8.4, 3.3)
    ax.text(2.0, 3.05, "forward", ha="center", size=10, weight="bold")
    ax.text(6.3, 3.05, "backward (jax.grad)", ha="center", size=10, weight="bold")
    box(ax, 1.0, 2.3, 2.0, 0.45, "w: the same on every device", face=GREY, size=8)
    box(ax, 5.05, 0.35, 2.5, 0.5, r"$\nabla L_0 + \dots + \nabla L_3$: the same everywhere",
        face="#FFF2CC", size=8)
    for d in range(4):
        x = 0.1 + d * 0.98
        box(ax, x, 0.95, 0.88, 0.6, f"device {d}\n$L_{d}(w, X_{d})$", face=LIGHT[d], size=7.5)
        arrow(ax, (2.0, 2.3), (x + 0.44, 1.55), color="#777777", lw=0.9)
        x2 = 4.4 + d * 0.98
        box(ax, x2, 1.75, 0.88, 0.6, f"device {d}\n$\\nabla L_{d}$", face=LIGHT[d], size=7.5)
        arrow(ax, (x2 + 0.44, 1.75), (6.3, 0.85), color="#777777", lw=0.9)
    ax.text(3.05, 2.0, "pcast(w,\n to='varying'),\ninserted by JAX", ha="left", va="center",
            size=8, color="#555555")
    ax.text(4.35, 1.05, "psum, the\ntranspose\nof the cast", ha="left", va="center", size=8,
            color="#555555")
    ax.text(2.0, 0.45, "shard_map with check_vma=True (the default):\nw is unvarying, each "
            "$L_d$ varies over the devices", ha="center", va="center", size=8,
            color="#555555")
    save(fig, "shard_map_grad")


def flax_two_paths():
    """Notebook 05a: data parallelism with Flax, the classic way (Linen + pmap) and the modern
    way (NNX + nnx.jit + shardings), on k = 4 devices."""
    fig, ax = canvas(9.0, 4.3)
    for x0, title in ((0.15, "classic: Linen + pmap"), (4.7, "modern: NNX + nnx.jit + shardings")):
        ax.text(x0 + 2.07, 4.05, title, ha="center", size=10, weight="bold")
    # classic: stacked copies, a reshaped batch, a per-device program with pmean written by hand
    ax.text(0.15, 3.6, "TrainState: one copy per device, stacked", size=8, color="#555555")
    ax.text(0.15, 2.85, "batch: split_batch → (devices, B/4, ...)", size=8, color="#555555")
    for d in range(4):
        x = 0.15 + d * 1.05
        box(ax, x, 3.15, 0.9, 0.36, f"copy {d}", face=LIGHT[d], size=8)
        box(ax, x, 2.4, 0.9, 0.36, "B/4", face=DEVICE[d], color="white", size=8)
        box(ax, x, 1.45, 0.9, 0.6, f"apply_model\non device {d}", face=LIGHT[d], size=7)
        arrow(ax, (x + 0.45, 2.4), (x + 0.45, 2.05))
        box(ax, x, 0.15, 0.9, 0.5, "update_\nmodel", face=LIGHT[d], size=8)
    box(ax, 0.15, 0.85, 4.05, 0.4, "lax.pmean(grads, 'devices'): written by you", face="#FFF2CC",
        size=8)
    # modern: global arrays with layouts, one program, the compiler partitions it
    box(ax, 4.7, 3.15, 4.15, 0.36, "model + optimizer: global arrays, layout P() (replicated)",
        face=GREY, size=8)
    ax.text(4.7, 2.85, "batch: one global array, layout P('data')", size=8, color="#555555")
    for d in range(4):
        box(ax, 4.7 + d * 1.05, 2.4, 0.95 if d < 3 else 0.99, 0.36, "B/4 rows", face=DEVICE[d],
            color="white", size=8, style="square,pad=0")
    box(ax, 4.7, 1.45, 4.15, 0.6, "nnx_train_step: the single-device step\ncompiled once for the "
        "mesh", face="#DDE8F5", size=8)
    arrow(ax, (6.78, 2.4), (6.78, 2.05))
    box(ax, 4.7, 0.85, 4.15, 0.4, "allreduce of the gradients: inserted by the compiler",
        face="#FFF2CC", size=8)
    box(ax, 4.7, 0.15, 4.15, 0.5, "in-place update of model and optimizer, on every device",
        face=GREY, size=8)
    ax.plot([4.45, 4.45], [0.1, 4.2], color="#BBBBBB", lw=0.8)
    save(fig, "flax_two_paths")


def resnet18():
    """Notebook 05c: d2l's ResNet-18 for 28x28 images, with the output shape of each part for
    b images and width w, and how often each weight of the part is used per image."""
    fig, ax = canvas(9.0, 2.3)
    parts = [("input", "b×28×28×1", ""), ("conv 3×3\n+ BN + ReLU", "b×28×28×w", "784"),
             ("stage 1\n2 blocks", "b×28×28×w", "784"), ("stage 2\n2 blocks", "b×14×14×2w", "196"),
             ("stage 3\n2 blocks", "b×7×7×4w", "49"), ("stage 4\n2 blocks", "b×4×4×8w", "16"),
             ("global\navg pool", "b×8w", ""), ("dense", "b×10", "1")]
    ax.text(0.62, 0.3, "uses of a weight\nper image:", ha="center", size=7.5, color="#8A5A00")
    for i, (name, shape, uses) in enumerate(parts):
        x = 0.15 + i * 1.1
        face = GREY if i in (0, 6) else LIGHT[min(max(i - 2, 0), 3)] if 2 <= i <= 5 else LIGHT[0]
        box(ax, x, 1.0, 0.95, 0.8, name, face=face, size=8)
        ax.text(x + 0.475, 0.7, shape, ha="center", size=7.5, color="#444444")
        if uses:
            ax.text(x + 0.475, 0.42, uses, ha="center", size=7.5, color="#8A5A00")
        if i:
            arrow(ax, (x - 0.15, 1.4), (x, 1.4))
    ax.text(4.5, 2.05, "a block: conv 3×3 + BN + ReLU, conv 3×3 + BN, add the shortcut, ReLU "
            "(stages 2-4 start with stride 2 and a 1×1 conv on the shortcut)", ha="center",
            size=7.5, color="#444444")
    save(fig, "resnet18")


def batchnorm_statistics():
    """Notebook 05b: BatchNorm on k = 4 devices with local statistics (each device its own
    mean and variance) and with global ones (an allreduce of the means of x and x^2)."""
    fig, ax = canvas(9.0, 3.5)
    titles = ((0.15, "local statistics: pmap, no axis_name"),
              (4.75, "global statistics: axis_name, or nnx.jit"))
    for x0, title in titles:
        ax.text(x0 + 2.05, 3.25, title, ha="center", size=10, weight="bold")
    for d in range(4):
        for x0 in (0.15, 4.75):
            x = x0 + d * 1.05
            box(ax, x, 2.4, 0.9, 0.45, f"B/4 rows\ndevice {d}", face=DEVICE[d],
                color="white", size=8)
            arrow(ax, (x + 0.45, 2.4), (x + 0.45, 2.05))
        x = 0.15 + d * 1.05
        box(ax, x, 1.45, 0.9, 0.6, f"$\\mu_{d}$, $\\sigma_{d}^2$", face=LIGHT[d], size=9)
        arrow(ax, (x + 0.45, 1.45), (x + 0.45, 0.75))
        box(ax, x, 0.2, 0.9, 0.55, f"normalise with\n$\\mu_{d}$, $\\sigma_{d}^2$", face=LIGHT[d],
            size=8)
        x = 4.75 + d * 1.05
        box(ax, x, 1.55, 0.9, 0.5, "mean of $x$,\nof $x^2$", face=LIGHT[d], size=8)
        arrow(ax, (x + 0.45, 1.55), (x + 0.45, 1.3))
        arrow(ax, (x + 0.45, 0.85), (x + 0.45, 0.75))
        box(ax, x, 0.2, 0.9, 0.55, "normalise with\n$\\mu$, $\\sigma^2$", face=GREY, size=8)
    box(ax, 4.75, 0.85, 4.05, 0.45, "allreduce (pmean): the same $\\mu$, $\\sigma^2$ on "
        "every device", face="#FFF2CC", size=8)
    ax.plot([4.5, 4.5], [0.1, 3.4], color="#BBBBBB", lw=0.8)
    save(fig, "batchnorm_statistics")


def ensemble_step():
    """One training step of a pmap ensemble on k = 4 devices: the batch is replicated, every
    member updates only its own weights, and only the probabilities are averaged."""
    fig, ax = canvas(8.4, 4.3)
    box(ax, 2.75, 3.7, 3.0, 0.42, "mini-batch of B examples", face=GREY, size=9)
    for d in range(4):
        x = 0.5 + d * 2.0
        arrow(ax, (4.25, 3.7), (x + 0.8, 3.25), color="#777777", lw=0.9)
        box(ax, x, 2.8, 1.6, 0.42, "all B examples", face=DEVICE[d], color="white", size=9)
        box(ax, x, 1.95, 1.6, 0.6, f"device {d}: member {d}\nweights $w_{d}$", face=LIGHT[d],
            size=8)
        arrow(ax, (x + 0.8, 2.8), (x + 0.8, 2.55))
        box(ax, x + 0.4, 1.05, 1.2, 0.45, f"$w_{d} \\leftarrow w_{d} - \\eta\\, g_{d}$",
            face=LIGHT[d], size=8)
        arrow(ax, (x + 1.0, 1.95), (x + 1.0, 1.5), color=DEVICE[d])
        ax.text(x + 1.07, 1.68, f"$g_{d}$", size=8, color=DEVICE[d])
        arrow(ax, (x + 0.15, 1.95), (x + 0.15, 0.62))
        ax.text(x + 0.2, 1.68, f"$p_{d}$", size=8)
    box(ax, 0.5, 0.2, 7.6, 0.42, r"pmean of the probabilities only: the ensemble predicts "
        r"$\bar p = \frac{1}{4}(p_0 + p_1 + p_2 + p_3)$", face="#FFF2CC", size=9)
    ax.text(0.25, 3.0, "replicate", size=8, rotation=90, va="center", color="#555555")
    ax.text(0.25, 2.25, "compute", size=8, rotation=90, va="center", color="#555555")
    ax.text(0.25, 1.27, "update", size=8, rotation=90, va="center", color="#555555")
    save(fig, "ensemble_step")


def ensemble_layouts():
    """Eight members on four devices: impossible for pmap (one per device), natural for a
    stacked ensemble whose leading 'model' axis is sharded P('model')."""
    fig, ax = canvas(8.4, 3.7)
    ax.text(2.0, 3.45, "pmap: one member per device", ha="center", size=10, weight="bold")
    for d in range(4):
        y = 2.55 - d * 0.62
        box(ax, 0.3, y, 1.15, 0.46, f"device {d}", face=DEVICE[d], color="white", size=8)
        box(ax, 1.7, y, 2.0, 0.46, f"member {d}: $w_{d}$", face=LIGHT[d], size=8)
        arrow(ax, (1.45, y + 0.23), (1.7, y + 0.23))
    ax.text(2.0, 0.25, "k devices, k members: the leading axis\nof every array is the device axis",
            ha="center", size=8, color="#555555")
    ax.text(6.3, 3.45, "stacked: one array, sharded P('model')", ha="center", size=10,
            weight="bold")
    ax.text(5.35, 3.05, "'model' axis of w (8 members)", ha="center", size=8, color="#555555")
    for m in range(8):
        d = m // 2
        y = 2.75 - m * 0.28
        box(ax, 4.6, y, 1.5, 0.24, f"member {m}", face=LIGHT[d], size=7,
            style="square,pad=0.0")
    for d in range(4):
        y_top, y_bottom = 2.75 - 2 * d * 0.28 + 0.24, 2.75 - (2 * d + 1) * 0.28
        box(ax, 6.7, (y_top + y_bottom) / 2 - 0.2, 1.2, 0.4, f"device {d}", face=DEVICE[d],
            color="white", size=8)
        arrow(ax, (6.15, (y_top + y_bottom) / 2), (6.7, (y_top + y_bottom) / 2),
              color=DEVICE[d])
    ax.text(6.3, 0.25, "vmap maps one member's step over the axis;\nthe sharding puts 8 / 4 = 2 "
            "members on each device", ha="center", size=8, color="#555555")
    save(fig, "ensemble_layouts")


def memory_per_device():
    """What each of 4 devices holds under data parallelism and under FSDP (Adam)."""
    fig, ax = canvas(9.0, 3.5)
    kinds = [("parameters", 0.45, "#4C72B0"), ("gradients", 0.45, "#8DA0CB"),
             ("Adam state", 0.9, "#55A868"), ("activations", 0.45, "#DD8452")]
    for panel, (title, x0, split) in enumerate((("data parallelism", 0.35, 1),
                                                ("fully-sharded data parallelism", 3.95, 4))):
        ax.text(x0 + 1.55, 3.2, title, ha="center", size=10, weight="bold")
        for d in range(4):
            x, y = x0 + d * 0.8, 0.45
            for i, (name, h, face) in enumerate(kinds):
                h = h if i == 3 else h / split   # the batch is split in both
                box(ax, x, y, 0.6, h, face=face, style="square,pad=0.0", lw=0.6)
                y += h
            ax.text(x + 0.3, 0.2, f"device {d}", ha="center", size=8)
        ax.plot([x0 - 0.1, x0 + 3.15], [0.45, 0.45], color=INK, lw=0.8)
    for i, (name, _, face) in enumerate(reversed(kinds)):
        box(ax, 7.55, 2.55 - i * 0.35, 0.22, 0.22, face=face, style="square,pad=0.0", lw=0.6)
        ax.text(7.85, 2.66 - i * 0.35, name, va="center", size=8)
    ax.text(5.5, 1.9, "each device: 1/4 of every\nparameter, gradient and\nAdam array",
            ha="center", size=8, color="#444444")
    save(fig, "memory_per_device")


def megatron_mlp():
    """Tensor parallelism in the MLP on 2 devices: columns of W1, rows of W2, one allreduce."""
    fig, ax = canvas(8.4, 2.9)
    ax.text(4.2, 2.7, "MLP  y = GELU(x W1) W2  on 2 devices (tensor parallelism)", ha="center",
            size=10, weight="bold")
    for d in range(2):
        y = 1.45 - d * 1.05
        box(ax, 0.2, y, 0.9, 0.7, "x\n(whole)", face=GREY, size=8)
        box(ax, 1.5, y, 1.1, 0.7, f"W1, columns\nhalf {d + 1}", face=LIGHT[d], size=8)
        box(ax, 3.0, y, 1.2, 0.7, f"GELU(x W1,{d + 1})\nhidden half", face=LIGHT[d], size=8)
        box(ax, 4.6, y, 1.1, 0.7, f"W2, rows\nhalf {d + 1}", face=LIGHT[d], size=8)
        box(ax, 6.1, y, 0.9, 0.7, f"partial\nsum y{d + 1}", face=DEVICE[d], color="white",
            size=8)
        for a, b in ((1.1, 1.5), (2.6, 3.0), (4.2, 4.6), (5.7, 6.1)):
            arrow(ax, (a, y + 0.35), (b, y + 0.35))
        ax.text(0.05, y + 0.35, f"device {d}", rotation=90, va="center", ha="center", size=8,
                color=DEVICE[d])
    box(ax, 7.35, 0.6, 0.95, 1.3, "allreduce\ny = y1 + y2", face="#FFF2CC", size=8)
    arrow(ax, (7.0, 1.8), (7.35, 1.5))
    arrow(ax, (7.0, 0.75), (7.35, 1.0))
    save(fig, "megatron_mlp")


def _schedule(ax, x0, y0, slots, title, p, m, unit=0.19):
    """Draw a pipeline schedule: slots[s] is a list of (time, 'F' or 'B', micro-batch)."""
    ax.text(x0, y0 + p * 0.32 + 0.12, title, size=9, weight="bold")
    for s in range(p):
        y = y0 + (p - 1 - s) * 0.32
        ax.text(x0 - 0.12, y + 0.13, f"stage {s}", ha="right", va="center", size=7.5)
        ax.add_patch(FancyBboxPatch((x0, y), unit * (2 * (m + p - 1)), 0.26,
                                    boxstyle="square,pad=0.0", facecolor="#F4F4F4",
                                    edgecolor="none"))
        for t, kind, j in slots[s]:
            box(ax, x0 + t * unit, y, unit, 0.26, f"{j + 1}", face=DEVICE[0] if kind == "F"
                else DEVICE[1], color="white", size=6.5, style="square,pad=0.0", lw=0.4)


def simulate_pipeline(orders, p, m):
    """Start times of each stage's operations (forward 'F' and backward 'B' take one unit):
    F of a micro-batch waits for the stage before, B for the stage after."""
    done, slots = {}, [[] for _ in range(p)]
    pending = [list(order) for order in orders]
    free = [0] * p
    while any(pending):
        for s in range(p):
            while pending[s]:
                kind, j = pending[s][0]
                dep = ((s - 1, "F", j) if kind == "F" else
                       (s + 1, "B", j) if s < p - 1 else (s, "F", j))
                if kind == "F" and s == 0:
                    ready = 0
                elif dep in done:
                    ready = done[dep]
                else:
                    break
                start = max(free[s], ready)
                free[s] = done[(s, kind, j)] = start + 1
                slots[s].append((start, kind, j))
                pending[s].pop(0)
    return slots


def pipeline_schedules():
    """GPipe and 1F1B for p = 4 stages and m = 8 micro-batches (forward and backward take one
    time unit each): the same idle time, but 1F1B holds at most p micro-batches' activations."""
    p, m = 4, 8
    gpipe = [[("F", j) for j in range(m)] + [("B", j) for j in range(m)] for _ in range(p)]
    one_f_one_b = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            order += [("F", warm + j), ("B", j)]
        one_f_one_b.append(order + [("B", j) for j in range(m - warm, m)])
    fig, ax = canvas(7.0, 3.6)
    _schedule(ax, 0.75, 1.95, simulate_pipeline(gpipe, p, m),
              "GPipe: all forwards, then all backwards", p, m)
    _schedule(ax, 0.75, 0.25, simulate_pipeline(one_f_one_b, p, m),
              "1F1B: after a warm-up, one forward, one backward", p, m)
    box(ax, 5.2, 3.2, 0.19, 0.19, face=DEVICE[0], style="square,pad=0.0", lw=0.4)
    ax.text(5.45, 3.3, "forward of a micro-batch", va="center", size=7.5)
    box(ax, 5.2, 2.9, 0.19, 0.19, face=DEVICE[1], style="square,pad=0.0", lw=0.4)
    ax.text(5.45, 3.0, "its backward", va="center", size=7.5)
    ax.text(5.2, 2.55, "grey: idle (the bubble)", size=7.5, color="#555555")
    save(fig, "pipeline_schedules")


FIGURES = [lenet, split_network, split_layers, split_data, data_parallel_step, ring_allreduce,
           gather_to_one, three_modes, shard_map_grad, flax_two_paths, resnet18,
           ensemble_step, ensemble_layouts, memory_per_device, megatron_mlp, pipeline_schedules]

def checkpoint_layout():
    """An Orbax checkpoint folder: one folder per finished step, one per item, and the step
    being written under a temporary name until its rename commits it."""
    fig, ax = canvas(8.6, 3.9)
    rows = [(0, "run/", "the folder given to the CheckpointManager", INK),
            (1, "16/", "a finished step (max_to_keep: the oldest ones are deleted)", INK),
            (1, "24/", "the latest finished step: what a restore reads", INK),
            (2, "_CHECKPOINT_METADATA", "when and how the step was saved", "#555555"),
            (2, "state/", "item 'state': the train state (ocp.args.StandardSave)", DEVICE[0]),
            (3, "_METADATA", "tree, shapes, dtypes and shardings of the arrays", "#555555"),
            (3, "manifest.ocdbt", "index of the chunk database", "#555555"),
            (3, "ocdbt.process_0/", "array chunks, written by process 0's devices", "#555555"),
            (2, "data/", "item 'data': a Grain iterator's position (next notebook)", DEVICE[2]),
            (1, "32.orbax-checkpoint-tmp/", "being written: ignored until renamed to 32/",
             DEVICE[3])]
    for i, (depth, name, note, color) in enumerate(rows):
        y = 3.6 - i * 0.36
        x = 0.25 + depth * 0.35
        if depth:
            ax.plot([x - 0.22, x - 0.22, x - 0.05], [y + 0.3, y, y], color="#999999", lw=0.8)
        ax.text(x, y, name, va="center", size=9, color=color,
                weight="bold" if name.endswith("/") else "normal")
        ax.text(3.75, y, note, va="center", size=8, color="#444444")
    save(fig, "checkpoint_layout")


def grain_pipeline():
    """A Grain pipeline and how two processes share every shuffled epoch."""
    fig, ax = canvas(8.6, 3.6)
    stages = ["ArraySource\nlen, [i]", "MapDataset\n.source", ".shuffle(seed)\nevery epoch anew",
              "[q::P]\nprocess q's shard", ".repeat()", ".batch(B // P)", "iterator\nget_state()"]
    for i, text in enumerate(stages):
        x = 0.1 + i * 1.21
        box(ax, x, 2.7, 1.05, 0.65, text, face=LIGHT[0] if i < 6 else "#FFF2CC", size=7.5)
        if i:
            arrow(ax, (x - 0.16, 3.02), (x, 3.02))
    ax.text(0.1, 2.25, "one shuffled epoch (record numbers), read by P = 2 processes:", size=8.5)
    order = [37, 4, 10, 45, 39, 22, 27, 9, 31, 12, 2, 40, 18, 7, 25, 33]
    for i, r in enumerate(order):
        box(ax, 0.1 + i * 0.52, 1.6, 0.46, 0.42, str(r), face=LIGHT[i % 2], size=8,
            style="square,pad=0.0")
    for q in range(2):
        ax.text(0.1, 1.05 - q * 0.5, f"process {q}, batch of B/P = 4:", size=8.5,
                color=DEVICE[q], va="center")
        for j in range(4):
            box(ax, 2.35 + j * 0.52, 0.84 - q * 0.5, 0.46, 0.42, str(order[2 * j + q]),
                face=DEVICE[q], color="white", size=8, style="square,pad=0.0")
    ax.text(4.6, 0.8, "together: the global batch of B = 8\n(the first 8 records of the epoch),\n"
            "no record read twice, none skipped", size=8.5, va="center")
    save(fig, "grain_pipeline")


def processes_and_devices():
    """Two processes with four devices each: local rows become one global batch."""
    fig, ax = canvas(8.6, 3.9)
    for p in range(2):
        x0 = 0.15 + p * 4.3
        box(ax, x0, 0.3, 4.0, 3.1, "", face="#F7F7F7", edge="#999999")
        ax.text(x0 + 0.12, 3.2, f"process {p}  (jax.process_index() = {p})", size=9,
                weight="bold", color=DEVICE[p], va="center")
        box(ax, x0 + 0.3, 2.35, 3.4, 0.5, f"local batch: rows {128 * p}-{128 * p + 127} of 256"
            f"\n(loaded by this process only)", face=LIGHT[p], size=8)
        for d in range(4):
            dx = x0 + 0.3 + d * 0.86
            box(ax, dx, 0.95, 0.75, 0.75, f"device\n{4 * p + d}\nrows\n{128 * p + 32 * d}-"
                f"{128 * p + 32 * d + 31}", face=DEVICE[p], color="white", size=6.5)
            arrow(ax, (x0 + 2.0, 2.35), (dx + 0.37, 1.7), color="#777777", lw=0.7)
        ax.text(x0 + 2.0, 0.55, "its 4 local (addressable) devices", ha="center", size=8,
                color="#555555")
    ax.text(4.3, 0.05, "jax.make_array_from_process_local_data: one global array of 256 rows "
            "over all 8 devices;\nno process holds all of it, and a jitted step's allreduce "
            "crosses the processes", ha="center", size=8)
    save(fig, "processes_and_devices")


def resume_timeline():
    """Checkpoints every few global steps, a crash, and the resumed run."""
    fig, ax = canvas(8.6, 2.6)
    x = lambda step: 0.4 + step * 0.62
    ax.plot([x(0), x(12)], [1.7, 1.7], color=INK, lw=1)
    for step in range(13):
        ax.plot([x(step), x(step)], [1.64, 1.76], color=INK, lw=0.8)
        ax.text(x(step), 1.45, str(step), ha="center", size=8)
    for step in (3, 6):
        box(ax, x(step) - 0.17, 1.9, 0.34, 0.3, "", face=DEVICE[2], style="square,pad=0.0")
    ax.text(x(4.5), 2.38, "checkpoints (--save-every 3)", ha="center", size=8, color=DEVICE[2])
    ax.plot([x(8)], [1.7], marker="x", color=DEVICE[3], ms=12, mew=2.5)
    ax.text(x(8), 2.05, "p1 killed\n(--crash-at-step 8)", ha="center", size=8, color=DEVICE[3])
    ax.plot([x(6), x(8)], [1.15, 1.15], color=DEVICE[3], lw=3, alpha=0.5)
    ax.text(x(7), 0.9, "steps 7-8 lost", ha="center", size=8, color=DEVICE[3])
    arrow(ax, (x(6), 0.55), (x(12), 0.55), color=DEVICE[0], lw=1.6)
    ax.text(x(6) - 0.1, 0.55, "--resume: restore step 6, recompute 7-8, go on", ha="right",
            va="center", size=8, color=DEVICE[0])
    ax.text(x(12), 0.25, "global step: epoch = step // steps_per_epoch, batch = step % "
            "steps_per_epoch", ha="right", size=8, color="#555555")
    save(fig, "resume_timeline")


def remat_stack():
    """What a stack of 4 blocks holds while the backward pass is at block 3: every block's
    saved activations (left), or only the block inputs and block 3 recomputed (right)."""
    fig, ax = canvas(9.0, 3.6)
    blue, orange = "#4C72B0", "#DD8452"
    for x0, title, remat in ((0.3, "without rematerialisation", False),
                             (4.8, "with rematerialisation", True)):
        ax.text(x0 + 1.8, 3.35, title, ha="center", size=10, weight="bold")
        for b in range(4):
            x = x0 + b * 0.95
            if b == 3:  # the backward pass is done with block 4: its memory is free
                box(ax, x, 1.05, 0.7, 1.65, face="white", edge="#999999",
                    style="square,pad=0.0", lw=0.6)
                ax.text(x + 0.35, 2.0, "freed", ha="center", va="center", size=8,
                        color="#777777")
                ax.text(x + 0.35, 0.8, f"block {b + 1}", ha="center", size=8)
                continue
            box(ax, x, 1.05, 0.7, 0.25, face=blue, style="square,pad=0.0", lw=0.6)
            if not remat or b == 2:
                box(ax, x, 1.3, 0.7, 1.4, face=orange, style="square,pad=0.0", lw=0.6)
                if remat:
                    ax.text(x + 0.35, 2.0, "recom-\nputed\nnow", ha="center",
                            va="center", size=8, color="white")
            ax.text(x + 0.35, 0.8, f"block {b + 1}", ha="center", size=8)
        arrow(ax, (x0, 0.55), (x0 + 3.6, 0.55), color="#555555")
        ax.text(x0 + 1.8, 0.33, "forward", ha="center", size=8, color="#555555")
        arrow(ax, (x0 + 3.6, 3.0), (x0 + 2.2, 3.0), color="#555555")
        ax.text(x0 + 2.1, 3.0, "backward, at block 3", ha="right", va="center", size=8,
                color="#555555")
    legend = ((2.6, "block input", blue), (4.6, "other saved activations", orange))
    for x, name, face in legend:
        box(ax, x, 0.02, 0.22, 0.18, face=face, style="square,pad=0.0", lw=0.6)
        ax.text(x + 0.3, 0.11, name, va="center", size=8)
    save(fig, "remat_stack")


def logical_layout():
    """From logical names to a layout: the MLP's first kernel, named ('embed', 'mlp'),
    the rules, and its 2 x 4 tiles on a ('data', 'model') mesh of 8 devices."""
    fig, ax = canvas(9.0, 3.4)
    ax.text(4.5, 3.2, "logical names + rules = a layout on the mesh", ha="center", size=10,
            weight="bold")
    box(ax, 0.6, 0.6, 2.0, 2.0, "kernel of MLP.up\n(d, 4d)", face=GREY, size=9)
    ax.text(0.35, 1.6, "'embed'", rotation=90, ha="center", va="center", size=9)
    ax.text(1.6, 2.75, "'mlp'", ha="center", size=9)
    box(ax, 3.0, 1.05, 2.3, 1.1,
        "rules\n'embed' -> 'data'\n'mlp' -> 'model'\n= P('data', 'model')", face="#FFF2CC",
        size=8.5)
    arrow(ax, (2.7, 1.6), (3.0, 1.6))
    arrow(ax, (5.3, 1.6), (5.75, 1.6))
    x0, y0, w, h = 6.1, 0.6, 0.5, 1.0
    for r in range(2):
        for c in range(4):
            box(ax, x0 + c * w, y0 + (1 - r) * h, w, h, f"{4 * r + c}", face=LIGHT[r],
                size=9, style="square,pad=0.0", lw=0.8)
    ax.text(x0 - 0.25, 1.6, "'data' (2)", rotation=90, ha="center", va="center", size=9)
    ax.text(x0 + 1.0, 2.75, "'model' (4)", ha="center", size=9)
    ax.text(x0 + 1.0, 0.3, "tile on device k", ha="center", size=8, color="#555555")
    save(fig, "logical_layout")


FIGURES += [checkpoint_layout, grain_pipeline, processes_and_devices, resume_timeline,
            remat_stack, logical_layout]


def step_timeline():
    """A data-parallel step on one device: the compute of its share, then the allreduce; with
    overlap, the gradients of the last layers travel while the earlier ones are computed."""
    fig, ax = canvas(8.6, 2.6)
    x0, unit, length = 1.3, 1.2, 1.9   # inches: start, a third of the compute, the allreduce

    def row(y, label, start, formula):
        ax.text(0.1, y + 0.2, label, size=9, va="center")
        box(ax, x0, y, unit, 0.4, r"forward $t_F$", face=LIGHT[0], size=8,
            style="square,pad=0.0")
        box(ax, x0 + unit, y, 2 * unit, 0.4, r"backward (gradients) $t_B$", face=DEVICE[0],
            color="white", size=8, style="square,pad=0.0")
        below = start < x0 + 3 * unit
        y_ar = y - 0.45 if below else y
        box(ax, start, y_ar, length, 0.4, "allreduce", face="#FFF2CC", size=8,
            style="square,pad=0.0")
        end = start + length
        ax.plot([end, end], [y_ar - 0.1, y + 0.5], color="#777777", lw=0.8, ls=":")
        ax.text(end + 0.12, y_ar + 0.2, formula, size=9, va="center")

    row(1.75, "no overlap", x0 + 3 * unit, r"$T = t_F + t_B + T_{\mathrm{allreduce}}$")
    row(0.6, "overlap", x0 + 2.2 * unit, r"$T = t_F + \max(t_B,\ T_{\mathrm{allreduce}})$")
    ax.text(x0 + 1.5 * unit, 2.35, r"compute of the share of $b = B/k$ examples: "
            r"$t(b) = t_F + t_B$", ha="center", size=9)
    save(fig, "step_timeline")


FIGURES += [step_timeline, batchnorm_statistics]


def float_formats():
    """The bits of float32, float16 and bfloat16: sign, exponent, fraction."""
    fig, ax = canvas(8.4, 2.6)
    unit = 0.2
    rows = [("float32", 8, 23), ("float16", 5, 10), ("bfloat16", 8, 7)]
    for r, (name, exp, frac) in enumerate(rows):
        y = 2.05 - r * 0.65
        ax.text(1.25, y + 0.15, name, ha="right", va="center", size=9, weight="bold")
        x = 1.4
        for width, face, label in ((1, "#C44E52", "sign"), (exp, "#4C72B0", f"exponent {exp}"),
                                   (frac, "#55A868", f"fraction {frac}")):
            box(ax, x, y, width * unit, 0.3, label if width > 3 else "", face=face,
                color="white", size=7.5, style="square,pad=0.0", lw=0.6)
            x += width * unit
        ax.text(x + 0.1, y + 0.15, f"{1 + exp + frac} bits", va="center", size=8,
                color="#555555")
    ax.text(4.2, 0.2, "bfloat16: the range of float32 (8 exponent bits), "
            "8 significant bits instead of 24", ha="center", size=8.5, color="#444444")
    save(fig, "float_formats")


def mixed_precision_step():
    """One mixed-precision data-parallel step: float32 master weights, a bfloat16 compute copy,
    bfloat16 gradients allreduced, a float32 update."""
    fig, ax = canvas(8.6, 2.3)
    f32, bf16 = "#4C72B0", "#DD8452"
    steps = [("master weights\nfloat32", f32), ("compute copy\nbfloat16", bf16),
             ("forward, backward\nbfloat16", bf16), ("allreduce\ngradients, bfloat16", bf16),
             ("cast gradients\nto float32", f32), ("optimizer update\nfloat32 state", f32)]
    for i, (text, face) in enumerate(steps):
        x = 0.2 + i * 1.4
        box(ax, x, 0.95, 1.15, 0.7, text, face=face, color="white", size=7.5)
        if i:
            arrow(ax, (x - 0.25, 1.3), (x, 1.3))
    arrow(ax, (7.6, 0.95), (0.78, 0.95), rad=-0.2)
    ax.text(4.3, 0.6, "the update is added in float32, where a small one survives",
            ha="center", size=8, color="#444444")
    ax.text(4.3, 2.0, "blue: float32, orange: bfloat16", ha="center", size=8, color="#444444")
    save(fig, "mixed_precision_step")


def overlap_timeline():
    """FSDP forward over 4 layers: gathering each layer's weights before computing it (serial)
    versus gathering layer i+1 while layer i computes (overlapped)."""
    fig, ax = canvas(8.6, 2.9)
    unit, comm, comp, x0 = 0.5, 1.0, 1.6, 1.15   # time units: a gather, a layer
    rows = (("synchronous: gather the weights, then compute", False),
            ("asynchronous: gather the next layer's weights during this layer", True))
    for row, (title, overlap) in enumerate(rows):
        y = 1.7 - row * 1.3
        ax.text(0.2, y + 0.7, title, size=9, weight="bold")
        ax.text(x0 - 0.1, y + 0.43, "compute", ha="right", va="center", size=7.5)
        ax.text(x0 - 0.1, y + 0.09, "network", ha="right", va="center", size=7.5)
        gather_start, layer_end = 0.0, 0.0
        for i in range(4):
            gather_end = gather_start + comm
            layer_start = max(gather_end, layer_end)
            box(ax, x0 + gather_start * unit, y - 0.04, comm * unit, 0.26,
                f"gather {i + 1}", face="#FFF2CC", size=6.5, style="square,pad=0.0", lw=0.5)
            box(ax, x0 + layer_start * unit, y + 0.3, comp * unit, 0.26, f"layer {i + 1}",
                face=DEVICE[0], color="white", size=6.5, style="square,pad=0.0", lw=0.5)
            layer_end = layer_start + comp
            gather_start = layer_start if overlap else layer_end
        ax.plot([x0 + layer_end * unit] * 2, [y - 0.08, y + 0.6], color=INK, lw=0.8, ls=":")
        ax.text(x0 + layer_end * unit + 0.08, y + 0.25, "done", va="center", size=7.5)
    save(fig, "overlap_timeline")


FIGURES += [float_formats, mixed_precision_step, overlap_timeline]


def collective_hang():
    """Two ways an allreduce waits forever: a device that never reaches it, and (XLA:CPU)
    a thread pool with no thread left to run the last device's part."""
    fig, ax = canvas(8.6, 3.6)
    ax.text(0.15, 3.38, "a device skips the collective", size=9, weight="bold")
    ax.text(4.5, 3.38, "XLA:CPU's 8 threads: none left for device 7", size=9, weight="bold")
    for d in range(8):
        y = 2.95 - d * 0.34
        ax.text(0.15, y + 0.13, f"device {d}", size=7.5, va="center")
        box(ax, 0.9, y, 0.8, 0.26, "compute", face=LIGHT[0], size=6.5,
            style="square,pad=0.0", lw=0.5)
        if d < 7:
            box(ax, 1.75, y, 2.4, 0.26, "allreduce: waits for device 7", face="#FFF2CC",
                size=6.5, style="square,pad=0.0", lw=0.5)
        else:
            box(ax, 1.75, y, 0.9, 0.26, "other branch", face=LIGHT[3], size=6.5,
                style="square,pad=0.0", lw=0.5)
            ax.text(2.75, y + 0.13, "goes on", size=6.5, va="center", color=DEVICE[3])
        label = (f"thread {d}: device {d}'s allreduce, waiting" if d < 7 else
                 "thread 7: launching a step, blocked (32 in flight)")
        box(ax, 4.5, y, 3.0, 0.26, label, face="#FFF2CC" if d < 7 else LIGHT[3], size=6.5,
            style="square,pad=0.0", lw=0.5)
    box(ax, 7.6, 0.57, 0.9, 0.26, "device 7's part:\nno thread", face=GREY, size=6,
        style="square,pad=0.0", lw=0.5)
    ax.text(4.3, 0.12, "either way XLA sees 7 of 8 devices arrive: it warns that a thread "
            "may be stuck, then aborts the process", ha="center", size=8, color="#444444")
    save(fig, "collective_hang")


FIGURES += [collective_hang]


def the_launcher():
    """The launcher, its watchdog and two workers, each in its own process group."""
    fig, ax = canvas(8.6, 3.7)
    box(ax, 0.15, 1.75, 3.0, 1.75, "", face="#F7F7F7", edge="#999999")
    ax.text(0.3, 3.25, "python -m d2l_multi launch -n 2", size=9, weight="bold")
    for i, line in enumerate(["picks a free port on 127.0.0.1",
                              "and a secret for this launch",
                              "prefixes the output: [p0] ..., [p1] ...",
                              "stops every worker at the first failure,",
                              "a signal (Ctrl-C) or --timeout"]):
        ax.text(0.3, 2.9 - 0.25 * i, line, size=8)
    box(ax, 0.15, 0.3, 3.0, 0.95, "watchdog: kills the workers' process\n"
        "groups if the launcher dies (even SIGKILL)", face="#FFF2CC", size=8)
    arrow(ax, (1.65, 1.75), (1.65, 1.25), color="#777777", lw=0.8)
    ax.text(1.75, 1.45, "process groups", size=7.5, color="#555555")
    for p in range(2):
        y0 = 2.0 - p * 1.7
        box(ax, 4.3, y0, 4.1, 1.45, "", face=LIGHT[p], edge=DEVICE[p])
        ax.text(4.42, y0 + 1.22, f"process group of worker p{p}", size=8.5,
                weight="bold", color=DEVICE[p])
        ax.text(4.42, y0 + 0.9, f"D2L_MULTI_PROCESS_ID={p}, ..._NUM_PROCESSES=2,",
                size=7.5)
        ax.text(4.42, y0 + 0.68, "..._COORDINATOR_ADDRESS=127.0.0.1:PORT,", size=7.5)
        ax.text(4.42, y0 + 0.46, "..._JOB_SECRET, ..._DEVICES_PER_PROCESS", size=7.5)
        ax.text(4.42, y0 + 0.16, "coordinator service (process 0 only)" if p == 0 else
                "joins; shows HMAC(secret, its id)", size=7.5, color="#555555")
        arrow(ax, (3.15, 2.6), (4.3, y0 + 1.0), color=INK, lw=1.0)
        arrow(ax, (4.3, y0 + 0.45), (3.15, 2.0), color="#777777", lw=0.8, ls="--")
    ax.text(3.3, 2.95, "start with\nsettings", size=7.5)
    ax.text(3.25, 1.55, "output\nlines", size=7.5, color="#555555")
    arrow(ax, (6.9, 0.3 + 1.45), (6.9, 2.0), color=DEVICE[1], lw=1.0, style="<|-|>")
    ax.text(7.0, 1.875, "coordinator: 127.0.0.1 only", size=7.5, va="center", color="#555555")
    save(fig, "the_launcher")


FIGURES += [the_launcher]

def _blocks(ax, x, y, w, h, split, k=4):
    """An array drawn as a w x h rectangle (rows go down); split: None (replicated, grey),
    'rows' or 'cols' (one colour per device), or 'sum' (every device a partial sum)."""
    if split in (None, "sum"):
        box(ax, x, y, w, h, "", face=GREY if split is None else "#FFF2CC",
            style="square,pad=0.0", lw=0.8)
        return
    for d in range(k):
        if split == "rows":
            box(ax, x, y + h - (d + 1) * h / k, w, h / k, "", face=LIGHT[d],
                style="square,pad=0.0", lw=0.5)
        else:
            box(ax, x + d * w / k, y, w / k, h, "", face=LIGHT[d], style="square,pad=0.0",
                lw=0.5)


def sharded_matmul_cases():
    """Notebook 09: Y[I,K] = X[I,J] W[J,K] with I, J or K split over 4 devices (one colour
    each; grey: replicated; yellow: partial sums), and the collective each case needs."""
    cases = [  # title, splits of X, W, Y, what it needs
        ("nothing split", None, None, None, "no communication"),
        ("I split", "rows", None, "rows", "no communication"),
        ("K split", None, "cols", "cols", "no communication"),
        ("J split", "cols", "rows", "sum", r"allreduce: $2\,\frac{k-1}{k}\,n_Y$ per device"),
        ("J split, scattered", "cols", "rows", "rows",
         r"reduce-scatter: $\frac{k-1}{k}\,n_Y$ per device"),
        ("I and K split", "rows", "cols", "rows", r"all-gather of W: $\frac{k-1}{k}\,n_W$"),
    ]
    fig, ax = canvas(9.0, 4.5)
    for n, (title, sx, sw, sy, needs) in enumerate(cases):
        x0, y0 = 0.15 + (n % 3) * 3.0, 2.45 - (n // 3) * 2.1
        ax.text(x0 + 1.35, y0 + 1.6, title, ha="center", size=9.5, weight="bold")
        _blocks(ax, x0, y0 + 0.55, 1.0, 0.8, sx)          # X: I x J
        ax.text(x0 + 1.15, y0 + 0.95, "·", ha="center", va="center", size=14)
        _blocks(ax, x0 + 1.3, y0 + 0.45, 0.5, 1.0, sw)    # W: J x K
        ax.text(x0 + 1.98, y0 + 0.95, "=", ha="center", va="center", size=12)
        _blocks(ax, x0 + 2.15, y0 + 0.55, 0.5, 0.8, sy)   # Y: I x K
        for cx, name in ((x0 + 0.5, "X"), (x0 + 1.55, "W"), (x0 + 2.4, "Y")):
            ax.text(cx, y0 + 0.3, name, ha="center", size=8.5, color="#555555")
        if sy == "sum":
            ax.text(x0 + 2.4, y0 + 0.95, "Σ", ha="center", va="center", size=11)
        ax.text(x0 + 1.35, y0 - 0.05, needs, ha="center", size=8,
                color=INK if needs[0] != "n" else "#555555")
    for d in range(4):
        box(ax, 0.2 + d * 0.95, 0.0, 0.2, 0.16, "", face=LIGHT[d], style="square,pad=0.0",
            lw=0.5)
        ax.text(0.45 + d * 0.95, 0.08, f"device {d}", va="center", size=7.5)
    box(ax, 4.1, 0.0, 0.2, 0.16, "", face=GREY, style="square,pad=0.0", lw=0.5)
    ax.text(4.35, 0.08, "replicated", va="center", size=7.5)
    box(ax, 5.3, 0.0, 0.2, 0.16, "", face="#FFF2CC", style="square,pad=0.0", lw=0.5)
    ax.text(5.55, 0.08, "a partial sum on each device", va="center", size=7.5)
    save(fig, "sharded_matmul_cases")


FIGURES += [sharded_matmul_cases]


def mesh_2d_layout():
    """The capstone's layout on a 2 x 4 ('data', 'model') mesh: the MLP's first kernel,
    named ('embed', 'mlp'), in 2 x 4 tiles (FSDP over 'data', Megatron over 'model') and the
    batch in 2 halves over 'data'; one colour per row of the mesh."""
    fig, ax = canvas(9.0, 2.95)
    y0, h = 0.75, 0.62                 # the bottom of the three drawings, a row's height
    # the mesh: device ids, row-major
    ax.text(1.8, 2.72, "the mesh: 2 × 4 devices", ha="center", size=10, weight="bold")
    for r in range(2):
        for c in range(4):
            box(ax, 0.55 + c * 0.65, y0 + (1 - r) * 0.72 + 0.06, 0.5, 0.5, f"{4 * r + c}",
                face=LIGHT[r], size=10)
    ax.text(1.8, 2.38, "'model' (4)", ha="center", size=9)
    arrow(ax, (0.55, 2.25), (3.05, 2.25), lw=0.9)
    ax.text(0.2, y0 + 0.67, "'data' (2)", rotation=90, ha="center", va="center", size=9)
    arrow(ax, (0.38, y0 + 1.4), (0.38, y0 - 0.05), lw=0.9)
    ax.text(1.8, 0.35, "device 4i + j: row i, column j", ha="center", size=8, color="#555555")
    # the MLP's first kernel W (d, 4d): rows over 'data', columns over 'model'
    x0, w = 3.95, 0.6
    ax.text(x0 + 2 * w, 2.72, "first MLP kernel W, (d, 4d)", ha="center", size=10, weight="bold")
    for r in range(2):
        for c in range(4):
            box(ax, x0 + c * w, y0 + (1 - r) * h, w, h, f"{4 * r + c}", face=LIGHT[r],
                size=10, style="square,pad=0.0", lw=0.8)
    ax.text(x0 + 2 * w, 2.38, "columns over 'model' (Megatron)", ha="center", size=9)
    ax.text(x0 - 0.25, y0 + h, "rows over 'data'\n(FSDP)", rotation=90, ha="center",
            va="center", size=9)
    ax.text(x0 + 2 * w, 0.35, "a tile (d/2, d) per device: an eighth", ha="center", size=8,
            color="#555555")
    # the batch of sequences (B, T): two halves over 'data'
    x0, w = 7.2, 1.4
    ax.text(x0 + w / 2, 2.72, "batch, (B, T)", ha="center", size=10, weight="bold")
    for r in range(2):
        box(ax, x0, y0 + (1 - r) * h, w, h, f"B/2 sequences\ndevices {4 * r}-{4 * r + 3}",
            face=LIGHT[r], size=8.5, style="square,pad=0.0", lw=0.8)
    ax.text(x0 + w / 2, 2.38, "T characters each", ha="center", size=9)
    ax.text(x0 - 0.25, y0 + h, "rows over 'data'", rotation=90, ha="center", va="center",
            size=9)
    ax.text(x0 + w / 2, 0.35, "a half per row of the mesh", ha="center", size=8,
            color="#555555")
    save(fig, "mesh_2d_layout")


FIGURES += [mesh_2d_layout]


def im2col():
    """Appendix A1: a 'valid' convolution with a 3 x 3 kernel as one matrix product. The
    9 slices X[:, i:i+oh, j:j+ow, :], stacked along the channels in the order (i, j), are
    the patches; the kernel (s, s, C_in, C_out) reshaped has its rows in the same order."""
    s, n = 3, 5                                   # kernel size; H = W = 5, so oh = ow = 3
    faces = LIGHT + ["#DCD0EA", "#E9DAC6", "#F6D3E8", "#CBE7E7", "#FFF2CC"]   # one per slice
    cin, cout = r"$C_\mathrm{in}$", r"$C_\mathrm{out}$"
    fig, ax = canvas(8.2, 3.5)
    top, below, mid = 3.22, 0.5, 1.75             # the baselines of the labels, the middle

    def grid(x, y, cell, window=None, face=None):
        """An n x n map of pixels from (x, y) up; window (i, j) fills an oh x ow slice."""
        if window:
            i, j = window
            box(ax, x + j * cell, y + (s - 1 - i) * cell, (n - s + 1) * cell,
                (n - s + 1) * cell, face=face, edge="none", style="square,pad=0.0")
        xs, ys = [], []
        for k in range(n + 1):                    # the borders of the pixels, one path
            xs += [x, x + n * cell, None, x + k * cell, x + k * cell, None]
            ys += [y + k * cell, y + k * cell, None, y, y + n * cell, None]
        ax.plot(xs, ys, color=INK, lw=0.4)

    grid(0.2, mid - 0.6, 0.24)                    # the input
    ax.text(0.8, top, "input X", ha="center", size=9, weight="bold")
    ax.text(0.8, below, "(B, H, W, " + cin + ")", ha="center", size=8, color="#555555")
    arrow(ax, (1.5, mid), (1.85, mid))
    x0, y0, cell, step = 2.2, mid - 0.83, 0.1, 0.58   # the 9 slices, one thumbnail each
    for i in range(s):
        ax.text(x0 - 0.08, y0 + (s - 1 - i) * step + 0.25, f"i={i}", ha="right",
                va="center", size=7)
        for j in range(s):
            grid(x0 + j * step, y0 + (s - 1 - i) * step, cell, (i, j), faces[s * i + j])
            if i == 0:
                ax.text(x0 + j * step + 0.25, y0 + s * step, f"j={j}", ha="center", size=7)
    ax.text(3.03, top, "9 shifted slices", ha="center", size=9, weight="bold")
    ax.text(3.03, top - 0.3, "X[:, i:i+oh, j:j+ow, :]", ha="center", size=8,
            family="DejaVu Sans Mono")
    ax.text(3.03, below, "each (B, oh, ow, " + cin + ")", ha="center", size=8,
            color="#555555")
    arrow(ax, (3.98, mid), (4.38, mid))
    ax.text(4.18, mid + 0.15, "stack", ha="center", size=7.5)
    x0, w = 4.5, 0.17                             # the patches: 9 blocks of C_in columns
    for k in range(s * s):
        box(ax, x0 + k * w, mid - 0.65, w, 1.3, face=faces[k], style="square,pad=0.0",
            lw=0.5)
    ax.text(x0 + w / 2, mid + 0.7, cin, ha="center", size=7)
    ax.text(x0 + 4.5 * w, top, "patches", ha="center", size=9, weight="bold")
    ax.text(x0 + 4.5 * w, below, "(B·oh·ow, " + r"$s^2 C_\mathrm{in}$)", ha="center",
            size=8, color="#555555")
    ax.text(6.25, mid, "×", ha="center", va="center", size=14)
    x0 = 6.45                                     # the kernel: 9 blocks of C_in rows
    for k in range(s * s):
        box(ax, x0, mid + 4.5 * w - (k + 1) * w, 0.4, w, face=faces[k],
            style="square,pad=0.0", lw=0.5)
    ax.text(x0 + 0.2, top, "kernel", ha="center", size=9, weight="bold")
    ax.text(x0 + 0.2, top - 0.3, "reshaped", ha="center", size=8)
    ax.text(x0 + 0.2, below, r"($s^2 C_\mathrm{in}$, " + cout + ")", ha="center", size=8,
            color="#555555")
    ax.text(7.15, mid, "=", ha="center", va="center", size=12)
    box(ax, 7.45, mid - 0.65, 0.4, 1.3, face=GREY, style="square,pad=0.0", lw=0.5)
    ax.text(7.65, top, "output", ha="center", size=9, weight="bold")
    ax.text(7.65, below, "(B·oh·ow, " + cout + ")", ha="center", size=8, color="#555555")
    ax.text(4.1, 0.12, "oh = H - s + 1, ow = W - s + 1; one colour per shift (i, j): its "
            "slice, " + cin + " columns of the patches, " + cin + " rows of the kernel",
            ha="center", size=8, color="#555555")
    save(fig, "im2col")


FIGURES += [im2col]

if __name__ == "__main__":
    wanted = sys.argv[1:]
    for make in FIGURES:
        if not wanted or any(w in make.__name__ for w in wanted):
            make()
            print(OUT / f"{make.__name__}.svg")

