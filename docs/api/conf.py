"""Sphinx configuration of the API reference: ``python -m sphinx -W --keep-going -b html docs/api docs/api/_build``."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "src")))

import kernel_attention  # noqa: E402

project = "kernel-attention"
release = version = kernel_attention.__version__
author = "kernel-attention contributors"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "ka_registries"]
exclude_patterns = ["_build"]
autodoc_default_options = {"members": False}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
add_module_names = False
html_theme = "alabaster"
html_static_path = []
