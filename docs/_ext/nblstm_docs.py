"""Sphinx extension of the nblstm documentation.

``optional-markdown``
    Includes a Markdown file of the docs directory when it exists (parsed by
    MyST when ``myst_parser`` is available, shown as text otherwise), or a
    note when it does not.
"""

from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def _note(text):
    note = nodes.note()
    note += nodes.paragraph(text=text)
    return [note]


class OptionalMarkdown(SphinxDirective):
    required_arguments = 1

    def run(self):
        rel, path = self.env.relfn2path(self.arguments[0])
        path = Path(path)
        if not path.exists():
            return _note(f"{self.arguments[0]} has not been written yet.")
        self.env.note_dependency(rel)
        if "myst_parser" in self.config.extensions:
            lines = [f".. include:: {self.arguments[0]}", "   :parser: myst_parser.sphinx_"]
            container = nodes.container()
            self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), self.content_offset, container)
            return container.children
        text = path.read_text(encoding="utf-8")
        return [nodes.literal_block(text, text)]


def setup(app):
    app.add_directive("optional-markdown", OptionalMarkdown)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
