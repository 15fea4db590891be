"""Run configuration: a dataclass that round-trips through YAML; command-line flags override the YAML."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from ..core.checks import device_problem, path_problem, refuse, seed_problem
from ..core.errors import ConfigError
from ..core.model_ref import ModelRef
from ..core.plugin import is_int
from ..core.store import parse_yaml, read_yaml
from ..model.loading import DEFAULT_MODEL, model_ref
from ..model.numerics import IEEE, REQUESTS, resolve_float32

# fields that do not change any number a run computes, so they do not enter its id; the probe list is left out too,
# so that adding a probe reuses the run folder and everything already collected in it
# (recipe overrides, like the probe list, act through each probe's own cache key)
_NOT_IN_DIGEST = {"out", "quiet", "device", "batch_size", "threads", "workers", "probes", "overrides", "allow_pickle"}


@dataclass
class SweepConfig:
    """What a sweep measures and where it writes. Every field is a YAML key and a ``--flag``."""

    model: str = DEFAULT_MODEL  # registry alias, local HF folder, .gguf file or Hub id
    revision: str | None = None  # Hub revision (branch, tag or commit; e.g. Pythia's step1000)
    out: str = "reports"  # root of run folders
    prompts: str = "pool"  # prompt pool of the manifold and focusing probes: built-in set or JSONL path
    probes: list[str] | None = None  # probe names (probes/*.yaml) or YAML paths; None: every built-in probe
    # layers of the probes that name none of their own (the prompt pool's; negative: from the end); a recipe's
    # ``layers:`` names the layers it collects instead
    layers: list[int] = field(default_factory=lambda: [-1])
    seed: int = 0
    dtype: str | None = None  # None: float32 up to ~3B parameters, bfloat16 above
    # float32 matrix products on the CPU: auto (oneDNN's path where it keeps float32 and is faster), ieee or fast;
    # the mode it resolves to enters the run's id (``digest``) and its activation sets' keys (model.numerics)
    float32: str = "auto"
    device: str | None = None
    batch_size: int | None = None  # None: about 2048 tokens per forward pass
    threads: int | None = None  # torch CPU threads (None: torch's default; 1 per worker with several workers)
    # processes the probes run in, each computing whole stages (None: two on a CPU with two or more cores where RAM
    # holds the model twice, else one; ``run.sweep.sweep_workers``)
    workers: int | None = None
    quiet: bool = False
    allow_pickle: bool = False  # load pickle weights (pytorch_model.bin, *.pt) when a checkpoint has no safetensors
    # recipe parameters by probe name, merged over the recipe (nested mappings key by key): ``--set probe.key=value``
    overrides: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse values of the wrong type or range with one sentence, before anything is written."""
        def bad(name: str, want: str):
            return ConfigError(f"Config key '{name}' must be {want}, not {getattr(self, name)!r}.")

        for name in ("model", "out", "prompts"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise bad(name, "a non-empty string")
        refuse(path_problem(self.out, folder=True), "Config key 'out' (--out)", self.out)
        if self.revision is not None and not isinstance(self.revision, str):
            raise bad("revision", "a string (branch, tag or commit)")
        if isinstance(self.layers, int) and not isinstance(self.layers, bool):
            self.layers = [self.layers]
        if not isinstance(self.layers, (list, tuple)) or not self.layers or not all(is_int(x) for x in self.layers):
            raise bad("layers", "a non-empty list of layer indices (e.g. [-1] or [6, 12])")
        self.layers = [int(x) for x in self.layers]
        refuse(seed_problem(self.seed), "Config key 'seed' (--seed)", self.seed)
        if self.dtype not in (None, *DTYPES):
            raise bad("dtype", f"one of {', '.join(DTYPES)} (or null for the size-based default)")
        if self.float32 not in REQUESTS:
            raise bad("float32", f"one of {', '.join(REQUESTS)}")
        for name in ("batch_size", "threads", "workers"):
            if getattr(self, name) is not None and (not is_int(getattr(self, name)) or getattr(self, name) < 1):
                raise bad(name, "a positive integer (or null for the default)")
        if self.device is not None:
            # any device torch names: a config may run elsewhere (a grid's workers); `sweep --device` checks here
            refuse(device_problem(self.device, here=False) if isinstance(self.device, str) else "a device name",
                   "Config key 'device' (--device)", self.device)
        if not isinstance(self.quiet, bool):
            raise bad("quiet", "true or false")
        if not isinstance(self.allow_pickle, bool):
            raise bad("allow_pickle", "true or false")
        if self.probes is not None and (not isinstance(self.probes, (list, tuple)) or
                                        not all(isinstance(p, str) and p for p in self.probes)):
            raise bad("probes", "a list of probe names or recipe paths")
        if not isinstance(self.overrides, dict) or not all(isinstance(v, dict) for v in self.overrides.values()):
            raise bad("overrides", "a mapping of probe name to parameters (e.g. {icl: {per_k: 20}})")

    def model_ref(self) -> ModelRef:
        """The model resolved (``model.loading.model_ref``): a run calls this once and passes the result on."""
        return model_ref(self.model, self.revision, self.dtype)

    def float32_resolved(self) -> str:
        """The numeric mode ``float32`` resolves to on this machine and device (``model.numerics``)."""
        return resolve_float32(self.float32, self.device)

    def digest(self, ref: ModelRef | None = None) -> str:
        """Short hash of what determines results: the run id, so a rerun finds its own folder. The model enters by
        its resolved identity (``ref``, else ``model_ref()`` now), so an alias, a relative path, an absolute path and
        a path with a trailing slash give one id, and a folder whose weights changed gives a new one."""
        ref = ref or self.model_ref()
        if (ref.name, ref.revision, ref.dtype) != (self.model, self.revision, self.dtype):
            raise ValueError(f"The model reference {ref.name!r} (revision {ref.revision!r}, dtype {ref.dtype!r}) is "
                             "not this config's model; pass config.model_ref().")
        d = {k: v for k, v in asdict(self).items() if k not in _NOT_IN_DIGEST | {"model", "revision", "float32"}}
        d["model"] = ref.identity
        if (mode := self.float32_resolved()) != IEEE:  # absent under IEEE: the ids of runs before the switch hold
            d["float32"] = mode
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]

    def to_yaml(self) -> str:
        return yaml.safe_dump(asdict(self), sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict) -> "SweepConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"Unknown config key(s) {unknown}; known keys: {sorted(known)}.")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "SweepConfig":
        data = read_yaml(path, "Config file") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a YAML mapping of config keys.")
        return cls.from_dict(data)

    def override(self, **flags) -> "SweepConfig":
        """A copy with every flag that is not None applied (``overrides`` merge into the existing ones)."""
        data = {**asdict(self), **{k: v for k, v in flags.items() if v is not None and k != "overrides"}}
        data["overrides"] = merge(self.overrides, flags.get("overrides") or {})
        return SweepConfig.from_dict(data)


DTYPES = ("float32", "bfloat16", "float16")


def merge(base: dict, extra: dict) -> dict:
    """``base`` updated by ``extra``, nested mappings merged key by key (new objects; neither input changes)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_set(assignments: list[str]) -> dict[str, dict]:
    """``["interventions.controls.isotropic=3", "icl.per_k=20"]`` -> nested overrides by probe name; values are
    YAML (``3``, ``[cut, only]``, ``{isotropic: 3, pcs: 1}``)."""
    out: dict = {}
    for item in assignments:
        path, sep, text = item.partition("=")
        keys = path.strip().split(".")
        if not sep or len(keys) < 2 or not all(keys):
            raise ConfigError(f"--set takes PROBE.PARAMETER=VALUE (e.g. interventions.controls.isotropic=3), "
                              f"not {item!r}.")
        value = parse_yaml(text, f"The value of --set {item!r}")
        for key in reversed(keys[1:]):
            value = {key: value}
        out = merge(out, {keys[0]: value})
    return out
