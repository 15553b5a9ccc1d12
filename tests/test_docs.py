"""The README's reading order names only what exists: every `name` it lists is a top-level function, class or
constant of the module named before it; every file it names exists. And the README stays one page."""
import ast
import re

from conftest import ROOT


def reading_order_rows():
    text = (ROOT / "README.md").read_text()
    table = text.split("## Reading order", 1)[1].split("\n## ", 1)[0]
    return [line for line in table.splitlines() if line.startswith("| ") and "`" in line]


def top_level_names(module):
    tree = ast.parse((ROOT / module).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_every_name_in_the_reading_order_exists():
    rows = reading_order_rows()
    assert len(rows) >= 4  # all, REPR-ALIGN, OPDLM, AR-MAP
    checked = 0
    for row in rows:
        module = None
        for token in re.findall(r"`([^`]+)`", row):
            if ":" in token:  # `diffusion.py: sequence_elbo`
                module, token = (part.strip() for part in token.split(":", 1))
            if token.endswith(".py"):
                module = token
                assert (ROOT / module).is_file(), module
                continue
            assert module is not None, f"{token!r} is listed before any file in: {row}"
            assert token in top_level_names(module), f"README's reading order: {module} has no {token}"
            checked += 1
    assert checked >= 30


def test_the_readme_is_one_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_module_docstrings_are_short():
    """A module's docstring says what it is and how to run it, in at most 15 lines; the reasoning is in
    docs/methods.md."""
    for path in sorted([*ROOT.glob("*.py"), *ROOT.glob("lib/*.py"), *ROOT.glob("worlds/*.py")]):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        assert len(doc.strip("\n").splitlines()) <= 15, path.relative_to(ROOT)
