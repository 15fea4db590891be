"""Prompt sets as ``datasets.Dataset`` with columns ``text``, ``domain`` and ``source``.

Built-in sets live in the top-level ``prompts/`` folder as JSONL; a user's own JSONL file or a Hugging Face dataset
loads the same way.
"""

from __future__ import annotations

# datasets and numpy are imported inside the functions that need them: core is the light bottom layer that every command
# imports
import json
import re
from pathlib import Path

from .errors import PromptError

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # interp_bayes/


def package_data_dir(name: str) -> Path:
    """A top-level data folder (``prompts``, ``probes``): the source tree's, or the copy an installed wheel carries
    as ``interp_bayes/_<name>``."""
    source = PACKAGE_DIR.parent / name
    return source if source.is_dir() else PACKAGE_DIR / f"_{name}"


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
        try:
            row["text"].encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate ("\ud800"): valid JSON, but no text a tokenizer takes
            raise PromptError(f"Line {i + 1} of {origin} holds {row['text'][err.start]!r}, half of a UTF-16 pair, "
                              "which is no character; write the whole pair or the character itself.") from None
    return Dataset.from_dict({c: [str(r.get(c, "unknown" if c == "domain" else origin)) for r in rows] for c in COLUMNS})


def load_prompts(name_or_path: str | Path):
    """A built-in set by name (see ``builtin_prompt_sets()``) or a JSONL file with one ``{"text": ...}`` per line."""
    path = Path(name_or_path)
    if not path.suffix and (PROMPTS_DIR / f"{name_or_path}.jsonl").exists():
        path = PROMPTS_DIR / f"{name_or_path}.jsonl"
    if not path.exists():
        raise PromptError(f"No prompt set '{name_or_path}'; use a built-in one ({', '.join(builtin_prompt_sets())}) "
                          "or a JSONL file path.")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise PromptError(f"Line {number} of {path} is not valid JSON ({err.msg}); every line must be an object "
                              "such as {\"text\": \"...\"}.") from None
        if not isinstance(rows[-1], dict):
            raise PromptError(f"Line {number} of {path} is not a JSON object; write {{\"text\": \"...\"}}.")
    return _rows_to_dataset(rows, str(path))


def load_hf_prompts(dataset: str, *, split: str = "train", text_column: str = "text",
                    domain_column: str | None = None, domain: str | None = None, n: int | None = None,
                    config: str | None = None):
    """Prompts from a Hugging Face dataset: a Hub name (needs the network or the datasets cache), a folder saved
    with ``Dataset.save_to_disk``, or a local data folder/file that ``datasets.load_dataset`` reads (JSON, CSV,
    Parquet, text). ``domain_column`` names a column of domains; otherwise every row gets ``domain`` (default: the
    dataset's name)."""
    import datasets

    path = Path(dataset).expanduser()
    try:
        if (path / "dataset_info.json").exists() or (path / "state.json").exists():
            ds = datasets.load_from_disk(str(path))
            ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
            ds = ds.select(range(min(n, len(ds)))) if n is not None else ds
        elif path.is_file():  # one data file: its format from the suffix
            builder = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}.get(
                path.suffix, "json")
            ds = datasets.load_dataset(builder, data_files=str(path), split=split if n is None else f"{split}[:{n}]")
        else:
            ds = datasets.load_dataset(str(path) if path.exists() else dataset, config,
                                       split=split if n is None else f"{split}[:{n}]")
    except (ConnectionError, FileNotFoundError, OSError, ValueError) as err:
        where = "a local dataset folder" if path.exists() else "the Hugging Face Hub (or its local cache)"
        reason = type(err).__name__
        raise PromptError(f"Cannot load the prompt dataset '{dataset}' (split '{split}') from {where} ({reason}); "
                          "pass a local folder or file, or run where the Hub is reachable.") from err
    for column in (text_column, domain_column):
        if column is not None and column not in ds.column_names:
            raise PromptError(f"Dataset '{dataset}' has no column '{column}' (columns: {ds.column_names}).")
    domains = ds[domain_column] if domain_column else [domain or dataset] * len(ds)
    rows = [dict(text=t, domain=str(d), source=dataset) for t, d in zip(ds[text_column], domains) if t]
    return _rows_to_dataset(rows, dataset)


def load_source(spec):
    """A probe's prompt source: a built-in set name, a JSONL path, or a mapping ``{dataset: NAME_OR_PATH, split,
    column, domain_column, n, config}`` read through ``datasets`` (with its cache)."""
    if isinstance(spec, dict):
        known = {"dataset", "split", "column", "domain_column", "domain", "n", "config"}
        unknown = sorted(set(spec) - known)
        if unknown or "dataset" not in spec:
            raise PromptError(f"A dataset prompt source needs 'dataset' and takes {sorted(known)}; got {sorted(spec)}.")
        return load_hf_prompts(spec["dataset"], split=spec.get("split", "train"), text_column=spec.get("column", "text"),
                               domain_column=spec.get("domain_column"), domain=spec.get("domain"), n=spec.get("n"),
                               config=spec.get("config"))
    return load_prompts(spec)


def source_label(spec) -> str:
    """A short file-name-safe label of a prompt source (for activation-set folders)."""
    name = spec["dataset"] if isinstance(spec, dict) else str(spec)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).stem or name)[:40]


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
