"""Sphinx configuration of the chapter's book: the landing page plus every notebook in chapters/.

Build it with ``python -m d2l_multi book`` (see ``d2l_multi/commands/book.py``), which stages
this folder and the notebooks into one source tree and sets the execution mode and cache.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "_ext"))

project = "Training Neural Networks on Multiple Devices with JAX"
author = "The d2l_multi authors"
copyright = "the d2l_multi authors, MIT License"

extensions = [
    "myst_nb",                 # notebooks and MyST markdown
    "sphinxcontrib.bibtex",    # one references.bib, cited with {cite:p}`key`
    "sphinx.ext.mathjax",      # from a local copy, see below
    "d2l_book",                # solutions behind a toggle, offline MathJax, source links
]

root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
nitpicky = True

# Notebooks: the pages show the outputs stored in them, those of a full run (`python -m
# d2l_multi book --rerun` refreshes them), so nothing is executed. `python -m d2l_multi book
# --smoke` executes copies through jupyter-cache instead (it sets the mode and the cache
# folder, and the timeout, d2l_multi.commands.book.KERNEL_TIMEOUT).
nb_execution_mode = "off"
nb_execution_timeout = 1800            # seconds a cell may run when executing
nb_execution_raise_on_error = False    # a failing notebook is a warning, which -W makes fatal
nb_execution_show_tb = True
nb_merge_streams = True
nb_ipywidgets_js = {}                  # never load the widget manager from a CDN
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
# Math: MathJax 3.2.2 from the sphinx-mathjax-offline wheel (PyPI), copied into _static/mathjax
# by _ext/d2l_book.py, which also sets mathjax_path. The renderer Jupyter uses, installed by pip
# like everything else, and no page needs a CDN (KaTeX's assets would come from npm).
myst_heading_anchors = 3

# References: a page lists what it cites (```{bibliography}``` with
# ":filter: docname in docnames"), numbered [1], [2], ... on that page; the text cites by
# author and year. A work cited on several pages is listed on each, and a citation links to
# the list on its own page, so the warnings about the same key, or the same number, in two
# pages' lists do not apply. An unknown key still fails the build.
bibtex_bibfiles = ["references.bib"]
bibtex_reference_style = "author_year_round"   # defined in _ext/d2l_book.py
bibtex_default_style = "plain"
suppress_warnings = ["bibtex.duplicate_citation", "bibtex.duplicate_label"]

html_theme = "sphinx_book_theme"
html_title = "Multiple devices with JAX"
html_static_path = ["_static"]
html_css_files = ["d2l_book.css"]
html_favicon = "_static/favicon.svg"      # a page without one makes browsers ask for /favicon.ico
html_context = {"default_mode": "auto"}   # pydata-sphinx-theme logs an error when it is unset
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": True,       # the notebook as .ipynb, and the page as PDF
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "launch_buttons": {},
    "show_toc_level": 2,
}
