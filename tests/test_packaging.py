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
