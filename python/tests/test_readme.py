"""README.md's Python example, run from the README's own text: the first two
```python blocks of its "## Python" section (multihead, then the PyTorch
lines that check it), in one namespace."""
import os
import re

from conftest import SOURCE_DIR


def python_blocks():
    text = open(os.path.join(SOURCE_DIR, "README.md"), encoding="utf-8").read()
    section = re.search(r"^## Python\n(.*?)^## ", text, flags=re.S | re.M)
    assert section, "README.md has no '## Python' section"
    return re.findall(r"```python\n(.*?)```", section.group(1), flags=re.S)


def test_readme_example_runs_and_matches_pytorch():
    blocks = python_blocks()
    assert len(blocks) >= 2, f"expected the example and its PyTorch lines, found {len(blocks)} python blocks"
    ns = {}
    exec(compile(blocks[0], "README.md (Python: multihead)", "exec"), ns)
    assert ns["out"].shape == (2, 10, 64) and ns["w"].shape == (2, 10, 10)
    exec(compile(blocks[1], "README.md (Python: PyTorch)", "exec"), ns)


def test_readme_bfloat16_example_runs():
    """The section's bfloat16 block, after the first one (its x and mha)."""
    import numpy as np
    import torch
    blocks = python_blocks()
    narrow = [b for b in blocks if 'dtype="bfloat16"' in b]
    assert len(narrow) == 1, "expected one bfloat16 example in README's Python section"
    ns = {}
    exec(compile(blocks[0], "README.md (Python: multihead)", "exec"), ns)
    exec(compile(narrow[0], "README.md (Python: bfloat16)", "exec"), ns)
    assert ns["out32"].dtype == np.float32 and ns["out_bits"].dtype == np.uint16
    widened = torch.from_numpy(ns["out_bits"].view(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(widened, ns["out32"])


def test_readme_rest_of_the_library_examples_run():
    """The python blocks of the section's "The rest of the library" part (up
    to "**Speed.**"), in one namespace."""
    text = open(os.path.join(SOURCE_DIR, "README.md"), encoding="utf-8").read()
    part = re.search(r"^\*\*The rest of the library\.\*\*(.*?)^\*\*Speed\.\*\*", text, flags=re.S | re.M)
    assert part, "README.md's Python section has no 'The rest of the library.' part"
    blocks = re.findall(r"```python\n(.*?)```", part.group(1), flags=re.S)
    assert len(blocks) == 2, f"expected the GQA and the trainer examples, found {len(blocks)} python blocks"
    ns = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md (Python: the rest of the library, block {i + 1})", "exec"), ns)
    assert ns["page"].startswith("<!DOCTYPE html>") and ns["pe"].shape == (12, 64)
