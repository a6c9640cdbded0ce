"""Plotting: d2l's Animator (one live figure in Jupyter, a PNG elsewhere) and image grids."""
import os
from collections.abc import Sequence
from typing import Any

from . import _checks as check


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where figures display inline)."""
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def use_svg_display() -> None:
    """Use the svg format to display a plot in Jupyter."""
    from matplotlib_inline import backend_inline
    backend_inline.set_matplotlib_formats("svg")


def set_axes(axes: Any, xlabel: str | None, ylabel: str | None,
             xlim: Sequence[float] | None, ylim: Sequence[float] | None, xscale: str,
             yscale: str, legend: Sequence[str] | None) -> None:
    """Set the axes for matplotlib."""
    if xlim is not None and xlim[0] == xlim[1]:  # one epoch: a point, not a range
        xlim = [xlim[0] - 0.5, xlim[1] + 0.5]
    axes.set_xlabel(xlabel), axes.set_ylabel(ylabel)
    axes.set_xscale(xscale), axes.set_yscale(yscale)
    axes.set_xlim(xlim), axes.set_ylim(ylim)
    if legend:
        axes.legend(legend)
    axes.grid()


def _figure(figsize, nrows=1, ncols=1):
    import matplotlib.pyplot as plt
    return plt.subplots(nrows, ncols, figsize=figsize)


class Animator:
    """For plotting data in animation: one figure, updated in place on every ``add``."""

    def __init__(self, xlabel: str | None = None, ylabel: str | None = None,
                 legend: Sequence[str] | None = None, xlim: Sequence[float] | None = None,
                 ylim: Sequence[float] | None = None, xscale: str = "linear",
                 yscale: str = "linear", fmts: Sequence[str] = ("-", "m--", "g-.", "r:"),
                 nrows: int = 1, ncols: int = 1,
                 figsize: tuple[float, float] = (3.5, 2.5)) -> None:
        check.integer(1, nrows=nrows, ncols=ncols)
        legend = legend or []
        self.fig, self.axes = _figure(figsize, nrows, ncols)
        if nrows * ncols == 1:
            self.axes = [self.axes]
        self.config_axes = lambda: set_axes(self.axes[0], xlabel, ylabel, xlim, ylim,
                                            xscale, yscale, legend)
        self.X, self.Y, self.fmts = None, None, fmts
        self._handle = None

    def add(self, x: float | Sequence[float], y: float | Sequence[float]) -> None:
        """Add one or more points (one per line) and redraw."""
        if not hasattr(y, "__len__"):
            y = [y]
        n = len(y)
        if not hasattr(x, "__len__"):
            x = [x] * n
        if not self.X:
            self.X = [[] for _ in range(n)]
        if not self.Y:
            self.Y = [[] for _ in range(n)]
        for i, (a, b) in enumerate(zip(x, y)):
            if a is not None and b is not None:
                self.X[i].append(float(a))
                self.Y[i].append(float(b))
        self.axes[0].cla()
        for x, y, fmt in zip(self.X, self.Y, self.fmts):
            self.axes[0].plot(x, y, fmt)
        self.config_axes()
        self.show()

    def show(self) -> None:
        """Display the figure in Jupyter, replacing its previous drawing."""
        if not in_notebook():
            return
        import io

        from IPython import display
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png", bbox_inches="tight", dpi=100)
        image = display.Image(data=buf.getvalue(), format="png")
        if self._handle is None:
            import matplotlib.pyplot as plt
            plt.close(self.fig)  # stop the inline backend from showing it a second time
            self._handle = display.display(image, display_id=True)
        else:
            self._handle.update(image)

    def save(self, path: str | os.PathLike) -> str | os.PathLike:
        """Save the figure as an image file (PNG by its extension); returns the path."""
        self.fig.savefig(path, bbox_inches="tight", dpi=120)
        return path


def show_images(imgs: Sequence[Any], num_rows: int, num_cols: int,
                titles: Sequence[str] | None = None, scale: float = 1.5) -> Any:
    """Plot a grid of images (2-D arrays) with optional titles."""
    import numpy as np
    check.integer(1, num_rows=num_rows, num_cols=num_cols)
    check.positive(scale=scale)
    fig, axes = _figure((num_cols * scale, num_rows * scale), num_rows, num_cols)
    axes = np.atleast_1d(axes).flatten()
    for i, (ax, img) in enumerate(zip(axes, imgs)):
        ax.imshow(np.asarray(img), cmap="gray")
        ax.axes.get_xaxis().set_visible(False)
        ax.axes.get_yaxis().set_visible(False)
        if titles is not None and i < len(titles):
            ax.set_title(titles[i])
    return axes
