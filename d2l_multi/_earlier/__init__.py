"""The name ``d2l`` in the library's ``#@save`` code.

A notebook's ``#@save`` cell calls a function of an earlier notebook as ``d2l.NAME``, and the
library keeps that text verbatim. Module ``d2l_multi.M`` binds ``d2l`` to ``_earlier.M``, which
imports exactly those names from the modules that define them: readers and IDEs can follow
``d2l.NAME`` to its definition, and no module imports the package that imports it.
"""
