"""Sphinx directives that write pages from the live package, so that they cannot go stale.

``.. ka-vocabulary::`` lists every name of the registries (kernels, positions, filters, backends) with
its parameters, their types, defaults and rules, and the entry's documentation.

``.. ka-weights:: EXPR`` lists ``named_parameters()`` (name and shape) of the module that the Python
expression ``EXPR`` builds (``ka`` is the package).
"""

from __future__ import annotations

import textwrap

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def _literal(text: str) -> str:
    return "``" + text.replace("`", "'") + "``"


def _type_name(param) -> str:
    types = param.type if isinstance(param.type, tuple) else (param.type,)
    name = " | ".join(t.__name__ for t in types)
    return name + (" | None" if param.optional else "")


def _one_line(text: str) -> str:
    """Registry docs as one line of reStructuredText: a ``|`` outside inline literals is escaped (it is
    plain text, e.g. ``|p - j| <= window``, not a substitution)."""
    parts = " ".join(textwrap.dedent(text or "").split()).split("``")
    return "``".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _registries():
    import kernel_attention as ka
    from kernel_attention import backends

    return [("Kernels", "kernel", ka.KERNELS), ("Positional schemes", "position", ka.POSITIONS),
            ("Set filters", "filter", ka.FILTERS), ("Backends", "backend", backends.BACKENDS)]


def _ordered_names(keyword: str, reg) -> tuple[list[str], list[str]]:
    """The registry's names, backends in the order ``auto`` tries them (the rest after, by name)."""
    names = reg.names()
    if keyword != "backend":
        return names, []
    from kernel_attention import backends

    order = [n for n in getattr(backends, "ORDER", ()) if n in names]
    return order + [n for n in names if n not in order], order


def vocabulary_rst() -> list[str]:
    lines: list[str] = []
    for title, keyword, reg in _registries():
        lines += [title, "-" * len(title), "",
                  f"Chosen with ``{keyword}=`` (Python), ``{keyword}:`` (YAML) or ``{keyword}=`` on the command "
                  f"line, as ``name`` or ``name:key=value,key=value``.", ""]
        names, order = _ordered_names(keyword, reg)
        if order:
            lines += ["``backend=\"auto\"`` (the default) tries them in this order and takes the first that "
                      "supports the call: " + ", ".join(f"``{n}``" for n in order) + ".", ""]
        for name in names:
            entry = reg.entry(name)
            lines += [f".. rubric:: {name}", ""]
            doc = _one_line(entry.doc)
            if doc:
                lines += [doc, ""]
            if not entry.params:
                lines += ["No parameters.", ""]
                continue
            lines += [".. list-table::", "   :header-rows: 1", "",
                      "   * - parameter", "     - type", "     - default", "     - accepted", "     - doc"]
            for p in entry.params:
                default = "required" if p.required else _literal(repr(p.default))
                accepted = []
                if p.choices:
                    accepted.append("one of " + ", ".join(_literal(repr(c)) for c in p.choices))
                if p.rule:
                    accepted.append(_one_line(p.rule))
                lines += [f"   * - ``{p.name}``", f"     - {_type_name(p)}", f"     - {default}",
                          f"     - {'; '.join(accepted) or 'any'}", f"     - {_one_line(p.doc)}"]
            lines.append("")
    return lines


def weights_rst(expr: str) -> list[str]:
    import torch

    import kernel_attention as ka

    torch.manual_seed(0)
    module = eval(expr, {"ka": ka, "torch": torch})  # noqa: S307 -- expressions written in these pages
    lines = [".. list-table::", "   :header-rows: 1", "", "   * - parameter", "     - shape"]
    for name, param in module.named_parameters():
        lines += [f"   * - ``{name}``", f"     - {tuple(param.shape)}"]
    return lines + [""]


class _Generated(SphinxDirective):
    def _parse(self, lines: list[str]) -> list[nodes.Node]:
        node = nodes.section() if self.name == "ka-vocabulary" else nodes.container()
        node.document = self.state.document
        source = self.get_source_info()[0]
        text = StringList(lines, source=source)
        nested_parse_with_titles(self.state, text, node)
        return node.children


class Vocabulary(_Generated):
    has_content = False

    def run(self):
        return self._parse(vocabulary_rst())


class Weights(_Generated):
    required_arguments = 1
    final_argument_whitespace = True
    option_spec = {"caption": directives.unchanged}

    def run(self):
        return self._parse(weights_rst(self.arguments[0]))


def setup(app):
    app.add_directive("ka-vocabulary", Vocabulary)
    app.add_directive("ka-weights", Weights)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
