"""The README's CPU examples run, in order, in one namespace (as a reader would paste them); those of its
GPU section need a GPU and CuPy."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_examples_run():
    cpu_part = README.read_text().split("\n## GPUs")[0]
    blocks = re.findall(r"```python\n(.*?)```", cpu_part, flags=re.S)
    assert blocks, "the README has Python examples"
    namespace = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - the examples are the test
    assert namespace["h_t"].shape == (namespace["B"], 64)
