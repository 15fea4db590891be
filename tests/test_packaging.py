"""The wheel's package list (explicit in pyproject.toml, because two packages are mapped from top-level folders)
names every package of the source tree, so nothing is silently left out of an install."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_lists_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "interp_bayes").rglob("__init__.py")}
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert config["package-dir"] == {"interp_bayes._prompts": "prompts", "interp_bayes._probes": "probes"}
    assert any((ROOT / "prompts").glob("*.jsonl")) and any((ROOT / "probes").glob("*.yaml"))


def test_every_public_name_resolves():
    import interp_bayes as ib

    for name in ib.__all__:
        assert getattr(ib, name) is not None, name
    assert callable(ib.load_model) and "collect" in dir(ib)


def test_the_docs_use_only_public_names_and_the_api_stays_small():
    """Every ``ib.NAME`` and ``from interp_bayes import NAME`` in the README, docs/ and examples/ (the notebook
    included) is a public name, and the public API is what a notebook needs (57 names; 115 before issue 38), the
    rest reached by module path."""
    import re

    import interp_bayes as ib

    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.*")]
    used = set()
    for path in files:
        text = path.read_text()
        used |= {(path.name, m) for m in re.findall(r"\bib\.([A-Za-z_]\w*)", text)}
        for names in re.findall(r"from interp_bayes import ([\w, ]+)", text):
            used |= {(path.name, n.strip()) for n in names.split(",")}
    assert len(used) > 30  # the pattern finds the docs' uses
    unknown = sorted((f, n) for f, n in used if n not in ib.__all__ and n != "__version__")
    assert not unknown, f"not public (use the module path, or export it): {unknown}"
    assert len(ib.__all__) <= 60
