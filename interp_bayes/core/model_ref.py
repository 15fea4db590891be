"""A model reference: what a run's model resolves to, computed once per run (``model.loading.model_ref``) and passed to
everything that needs it (the run's id, its context's cache keys, the loader), so that none of them resolves the name,
digests the folder or asks the Hub for the commit again."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelRef:
    """An alias, local folder, .gguf file or Hub id as resolved: where the weights are and what determines them."""

    name: str  # as asked: alias, folder, .gguf file or Hub id
    source: str  # the folder (absolute; an alias or .gguf file converted) or the Hub id it resolves to
    local: bool  # ``source`` is a folder
    revision: str | None = None  # the Hub revision as asked (None: the default branch); always None for a folder
    commit: str | None = None  # the Hub commit ``revision`` names (None for a folder, or where nothing resolves it)
    digest: str | None = None  # of the folder's top-level files, names and whole contents (None for a Hub id)
    dtype: str | None = None  # as asked (None: the size-based default); it enters cache keys beside ``identity``

    @property
    def identity(self) -> dict:
        """What determines the model's numbers, however its name was spelled: the folder's digest, or the Hub id with
        its commit (a revision that cannot be resolved keeps its name, with ``commit: None``, and cannot load). The
        bytes of every cache key hold this dict as it was before there was a ``ModelRef``: keys stay valid."""
        if self.local:
            return dict(folder_digest=self.digest, revision=self.revision)
        if self.commit:
            return dict(hub=self.source, commit=self.commit)
        return dict(hub=self.source, revision=self.revision, commit=None)

    @property
    def load_revision(self) -> str | None:
        """The revision a config or tokenizer read passes on: for a Hub id its commit, so what is read is what
        ``identity`` names (the revision as asked while unresolved: ``load_model`` refuses that), for a folder None."""
        return self.commit or self.revision
