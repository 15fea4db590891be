"""Prompt sets as ``datasets.Dataset`` with columns ``text``, ``domain`` and ``source``.

Built-in sets live in the top-level ``prompts/`` folder as JSONL; a user's own JSONL file or a Hugging Face dataset
loads the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import PromptError

def package_data_dir(name: str) -> Path:
    """A top-level data folder (``prompts``, ``probes``): the source tree's, or the copy an installed wheel carries
    as ``interp_bayes/_<name>``."""
    source = Path(__file__).resolve().parent.parent / name
    return source if source.is_dir() else Path(__file__).resolve().parent / f"_{name}"


PROMPTS_DIR = package_data_dir("prompts")
COLUMNS = ("text", "domain", "source")


def builtin_prompt_sets() -> list[str]:
    """Names of the prompt sets shipped with the package."""
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl"))


def _rows_to_dataset(rows: list[dict], origin: str):
    from datasets import Dataset

    if not rows:
        raise PromptError(f"No prompts in {origin}; add JSON lines with a 'text' field.")
    for i, row in enumerate(rows):
        if not isinstance(row.get("text"), str) or not row["text"]:
            raise PromptError(f"Line {i + 1} of {origin} has no 'text' string; every line needs one.")
    return Dataset.from_dict({c: [str(r.get(c, "unknown" if c == "domain" else origin)) for r in rows] for c in COLUMNS})


def load_prompts(name_or_path: str | Path):
    """A built-in set by name (see ``builtin_prompt_sets()``) or a JSONL file with one ``{"text": ...}`` per line."""
    path = Path(name_or_path)
    if not path.suffix and (PROMPTS_DIR / f"{name_or_path}.jsonl").exists():
        path = PROMPTS_DIR / f"{name_or_path}.jsonl"
    if not path.exists():
        raise PromptError(f"No prompt set '{name_or_path}'; use a built-in one ({', '.join(builtin_prompt_sets())}) "
                          "or a JSONL file path.")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return _rows_to_dataset(rows, str(path))


def load_hf_prompts(dataset: str, *, split: str = "train", text_column: str = "text", domain: str | None = None,
                    n: int | None = None, config: str | None = None):
    """Prompts from a Hugging Face dataset (needs the network or a local copy), e.g. Wikipedia or news corpora."""
    from datasets import load_dataset

    ds = load_dataset(dataset, config, split=split if n is None else f"{split}[:{n}]")
    if text_column not in ds.column_names:
        raise PromptError(f"Dataset '{dataset}' has no column '{text_column}' (columns: {ds.column_names}); "
                          "pass text_column=.")
    rows = [dict(text=t, domain=domain or dataset, source=dataset) for t in ds[text_column] if t]
    return _rows_to_dataset(rows, dataset)


def stratified_sample(entropy, *, per_bin: int = 15, n_bins: int = 5, seed: int = 0) -> list[int]:
    """Indices of ``per_bin`` prompts drawn without replacement from each entropy quantile bin (Paper III: 15 per
    quintile, 75 prompts), sorted. Bins are the pool's own quantiles, so every bin holds about len/n_bins prompts."""
    import numpy as np

    h = np.asarray(entropy, dtype=np.float64)
    edges = np.quantile(h, np.linspace(0, 1, n_bins + 1))
    bins = np.clip(np.searchsorted(edges, h, side="right") - 1, 0, n_bins - 1)
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n_bins):
        members = np.flatnonzero(bins == b)
        if len(members) < per_bin:
            raise PromptError(f"Entropy bin {b + 1} of {n_bins} holds {len(members)} prompts, fewer than {per_bin}; "
                              "use a larger pool or a smaller per_bin.")
        out.extend(rng.choice(members, size=per_bin, replace=False).tolist())
    return sorted(out)
