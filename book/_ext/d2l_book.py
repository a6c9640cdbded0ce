"""The book's own Sphinx extension.

* Solutions: the content of a section titled "Solutions" goes into one ``<details>`` element,
  closed until the reader opens it. Native HTML: it works without JavaScript, shows nothing
  before scripts run, and the browser opens it for find-in-page and for links into it.
* Offline math: MathJax 3 is served from ``_static/mathjax``, copied from the
  ``sphinx-mathjax-offline`` package (PyPI), which ships MathJax 3.2.2 with its fonts; no page
  asks a CDN for anything.
* Every notebook page starts with a link to its ``.ipynb`` and how to run it.
* ``d2l_book_mode`` ('full', 'smoke' or 'off') puts a banner on builds that are not full runs.
* Citations read as in d2l: (Goyal et al., 2017; He et al., 2016), the reference style
  ``author_year_round``.
"""
import dataclasses
import importlib.util
import pathlib
import shutil

from docutils import nodes
from sphinx.errors import ExtensionError

SOLUTIONS_TITLE = "Solutions"
SOLUTIONS_HINT = "Show the worked solutions"
MATHJAX_ENTRY = "mathjax/tex-chtml.js"
# MathJax's single-file TeX + CommonHTML build and what it may load on demand (fonts, TeX
# extensions via autoload, menu, accessibility); the other combined builds are left out.
MATHJAX_PARTS = ["tex-chtml.js", "input", "output", "ui", "a11y", "sre", "adaptors"]
BANNERS = {
    "smoke": "Smoke build (D2L_MULTI_SMOKE=1): outputs come from shrunken runs; "
             "their numbers are not results.",
    "off": "Built without executing the notebooks: code is shown without outputs.",
}


def round_brackets():
    from sphinxcontrib.bibtex.style.referencing import BracketStyle
    return BracketStyle(left="(", right=")", sep="; ")


def register_reference_style():
    import sphinxcontrib.bibtex.plugin
    from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

    @dataclasses.dataclass
    class RoundAuthorYear(AuthorYearReferenceStyle):
        bracket_parenthetical: object = dataclasses.field(default_factory=round_brackets)
        bracket_textual: object = dataclasses.field(default_factory=round_brackets)

    sphinxcontrib.bibtex.plugin.register_plugin(
        "sphinxcontrib.bibtex.style.referencing", "author_year_round", RoundAuthorYear)


class solutions(nodes.General, nodes.Element):
    """The collapsed body of a Solutions section."""


def visit_solutions_html(self, node):
    self.body.append('<details class="d2l-solutions">'
                     f'<summary>{SOLUTIONS_HINT}</summary>\n')


def depart_solutions_html(self, node):
    self.body.append("</details>\n")


def skip(self, node):
    pass


def collapse_solutions(app, doctree):
    """Move everything after the title of each "Solutions" section into a ``solutions`` node."""
    for section in list(doctree.findall(nodes.section)):
        title = section.next_node(nodes.title)
        if title is None or title.parent is not section:
            continue
        if title.astext().strip() != SOLUTIONS_TITLE:
            continue
        body = [child for child in section.children if child is not title]
        if not body:
            continue
        box = solutions()
        for child in body:
            section.remove(child)
            box += child
        section += box


def add_notebook_link(app, doctree):
    """Put a download link and the way to run the notebook under a notebook page's title."""
    docname = app.env.docname
    source = pathlib.Path(app.env.doc2path(docname))
    if source.suffix != ".ipynb":
        return
    top = doctree.next_node(nodes.section)
    if top is None:
        return
    href = "../" * docname.count("/") + f"_sources/{docname}.ipynb"
    para = nodes.paragraph(classes=["d2l-notebook-link"])
    para += nodes.Text("This page is the notebook ")
    para += nodes.reference("", "", nodes.literal(text=source.name), refuri=href,
                            classes=["d2l-download-notebook"])
    para += nodes.Text(": download it (without outputs) and open it with ")
    para += nodes.literal(text="jupyter lab")
    para += nodes.Text(". Its first cell gives a CPU-only machine 8 simulated devices.")
    title = top.next_node(nodes.title)
    top.insert(top.index(title) + 1, para)


def mathjax_source():
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None or not spec.submodule_search_locations:
        raise ExtensionError("MathJax for offline reading is missing: "
                             "pip install -e \".[book]\" (it installs sphinx-mathjax-offline)")
    return pathlib.Path(next(iter(spec.submodule_search_locations))) / "static" / "mathjax"


def copy_mathjax(app, exc):
    if exc is not None or app.builder.format != "html":
        return
    src, dst = mathjax_source(), pathlib.Path(app.outdir) / "_static" / "mathjax"
    for part in MATHJAX_PARTS:
        if (src / part).is_dir():
            shutil.copytree(src / part, dst / part, dirs_exist_ok=True)
        else:
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / part, dst / part)


def configure(app, config):
    mode = config.d2l_book_mode
    if mode not in {"full", "smoke", "off"}:
        raise ExtensionError(f"d2l_book_mode is {mode!r}; use 'full', 'smoke' or 'off'")
    if mode in BANNERS:
        config.html_theme_options = {**config.html_theme_options, "announcement": BANNERS[mode]}
    mathjax_source()  # fail early, not after the build, when MathJax is not installed
    config.mathjax_path = MATHJAX_ENTRY


def setup(app):
    register_reference_style()
    app.add_config_value("d2l_book_mode", "full", "html")
    app.add_node(solutions, html=(visit_solutions_html, depart_solutions_html),
                 latex=(skip, skip), text=(skip, skip), man=(skip, skip),
                 texinfo=(skip, skip))
    app.connect("config-inited", configure)
    app.connect("doctree-read", collapse_solutions)
    app.connect("doctree-read", add_notebook_link)
    app.connect("build-finished", copy_mathjax)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
