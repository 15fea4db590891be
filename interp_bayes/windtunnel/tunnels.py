"""Opening a trained wind tunnel: ``open_tunnel(name_or_folder)``, the one way to open a checkpoint of any
architecture, and ``load_model`` (``ib.load_model``), which opens a wind-tunnel folder through it and any other
checkpoint as an LLM.

A wind tunnel is a folder written by ``interp-bayes train`` (``train.save_folder``): weights, config.json, a
tokenizer and windtunnel.json (the TrainConfig it was trained with, its step and final evaluation). What it boots
into depends on the architecture (``TrainConfig.arch``):

- ``transformer`` (GPT-2, or GPT-NeoX with rotary / no positions) and ``mamba`` (HF's ``Mamba2ForCausalLM``): HF
  checkpoints, booted into TransformerLens's ``TransformerBridge`` by ``model.loading.load_model`` like any LLM, with
  TransformerLens's hook names (``blocks.{L}.attn.hook_v`` etc. for the transformer; ``blocks.{L}.hook_resid_pre`` /
  ``hook_resid_post`` for Mamba, whose mixer has no attention hooks);
- ``mlp``, ``mlp-context`` and ``lstm``: no TransformerBridge adapter exists for them (they are no HF
  architectures), so they boot as their own TransformerLens ``HookedRootModule`` (``archs``), with the same
  ``run_with_cache`` / ``hooks()`` interface and the hook points ``hook_embed``, ``hook_pos_embed`` (where there
  is a position table) and ``blocks.{L}.hook_resid_pre`` / ``blocks.{L}.hook_resid_post``.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..core.errors import CacheError, ConfigError, ModelLoadError
from ..core.model_ref import ModelRef
from ..core.store import read_json
from ..model.loading import DEFAULT_MODEL, ModelInfo, model_identity
from ..model.loading import load_model as load_llm
from .configs import TrainConfig, make_task, n_params

PACKAGED = Path(__file__).resolve().parent / "checkpoints"  # the wind tunnels shipped with the package


def checkpoint_folder(name: str | os.PathLike) -> Path:
    """The folder of a packaged wind tunnel's name, else ``name`` as a folder."""
    return PACKAGED / name if isinstance(name, str) and (PACKAGED / name).is_dir() else Path(name)


def saved_checkpoints(folder: str | os.PathLike) -> dict[int, Path]:
    """The checkpoints a training run saved on its way (``RUN/checkpoints/step_NNNNNN``, ``train.py``), by step in
    order of step; {} when it saved none."""
    saved = (checkpoint_folder(folder) / "checkpoints").glob("step_*")
    return dict(sorted((int(f.name.split("_")[1]), f) for f in saved if f.is_dir()))


def read_meta(folder: str | os.PathLike) -> dict | None:
    """A wind-tunnel folder's windtunnel.json (its ``config`` naming a task), None when the folder holds none (no
    file, unreadable, or no task named): the one reader of that file."""
    try:
        meta = read_json(Path(folder) / "windtunnel.json")
    except (OSError, CacheError):
        return None
    config = meta.get("config") if isinstance(meta, dict) else None
    return meta if isinstance(config, dict) and isinstance(config.get("task"), str) else None


def tunnel_config(folder: str | os.PathLike) -> dict | None:
    """The training config a wind-tunnel folder was saved with (as saved: a dict), None when it holds none."""
    meta = read_meta(folder)
    return None if meta is None else meta["config"]


def is_tunnel(name_or_folder: str | os.PathLike) -> bool:
    """Whether ``name_or_folder`` names a packaged wind tunnel or a folder holding one."""
    return tunnel_config(checkpoint_folder(name_or_folder)) is not None


@dataclass(frozen=True)
class Tunnel:
    """An opened wind tunnel: its folder, its training config and the rest of its windtunnel.json (``meta``:
    step, final evaluation, ...); the task, the booted model and its identity are built on first use (a plan or a
    check needs the task alone)."""

    folder: Path
    config: TrainConfig
    meta: dict

    @cached_property
    def task(self):
        """The task object the tunnel was trained on (after any curriculum) and is evaluated on."""
        return make_task(self.config)

    @cached_property
    def model(self):
        """The booted model in eval mode (``boot``): a TransformerBridge or the architecture's hooked module."""
        return boot(self.folder, self.config)

    @cached_property
    def identity(self) -> dict:
        """What determines the tunnel's numbers (``model.loading.model_identity``: a digest of the folder's files)."""
        return model_identity(self.folder)

    @property
    def step(self) -> int:
        """The training step the weights were saved at (the configured ``steps`` where none is recorded)."""
        return int(self.meta.get("step", self.config.steps))


def open_tunnel(name_or_folder: str | os.PathLike) -> Tunnel:
    """The wind tunnel of a packaged checkpoint's name (``ls interp_bayes/windtunnel/checkpoints``) or of a folder
    written by ``interp-bayes train``; ConfigError naming the fix when it holds none."""
    folder = checkpoint_folder(name_or_folder)
    meta = read_meta(folder)
    if meta is None:
        packaged = ", ".join(d.name for d in sorted(PACKAGED.iterdir()) if d.is_dir())
        raise ConfigError(f"{os.fspath(name_or_folder)!r} is no wind-tunnel checkpoint (no readable windtunnel.json "
                          f"in {folder}); name a packaged one ({packaged}) or a folder written by "
                          "`interp-bayes train`.")
    return Tunnel(folder, TrainConfig.from_dict(meta.pop("config")), meta)


def boot(folder: Path, config: TrainConfig, **load: Any):
    """The model saved in ``folder``: an HF checkpoint (transformer, Mamba) through ``model.loading.load_model``
    (``load``: its keyword arguments), one of ``archs.MODEL_TYPES`` (the MLPs, the LSTM) as its hooked module with
    the folder's tokenizer (``load`` may then only give ``dtype`` and ``device``)."""
    model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    if model_type is None or not model_type.startswith("windtunnel_"):
        return load_llm(folder, **load)
    from transformers import PreTrainedTokenizerFast  # heavy (~4 s): only a tunnel that boots needs it

    from .archs import MODEL_TYPES  # imports TransformerLens: only for these architectures

    if model_type not in MODEL_TYPES:
        raise ConfigError(f"{folder} holds a model of type {model_type!r}, which this version cannot build; "
                          f"known: {', '.join(sorted(MODEL_TYPES))}.")
    other = sorted(k for k, v in load.items() if k not in ("dtype", "device") and v not in (None, False))
    if other:
        raise ModelLoadError(f"The {config.arch} wind tunnel in {folder} is no Hugging Face checkpoint and loads whole "
                             f"on one device: {', '.join(other)} do not apply; pass dtype= and device= only.")
    model = MODEL_TYPES[model_type].from_pretrained(folder).eval()
    if load.get("dtype") is not None or load.get("device") is not None:
        model.to(device=load.get("device"), dtype=load.get("dtype"))
    model._ib_tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)  # read by collect, as a bridge's
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    model._ib_info = ModelInfo(name=str(folder), source=str(folder), family=model_type, dtype=dtype,
                               n_params=n_params(model))
    return model


def load_model(name_or_path: str | os.PathLike | ModelRef = DEFAULT_MODEL, **kwargs: Any):
    """``ib.load_model``: an alias, a local HF folder or a Hub id as a raw-weight ``TransformerBridge``
    (``model.loading.load_model``, which documents ``kwargs``), and a wind tunnel (a folder holding windtunnel.json,
    or a packaged one's name) booted through ``open_tunnel``, whatever its architecture: a bridge for the
    transformer and Mamba, the architecture's own TransformerLens-hooked module for the MLPs and the LSTM (see this
    module's docstring for their hook points). A ``ModelRef`` (``model.loading.model_ref``) loads what it resolved."""
    where = name_or_path.source if isinstance(name_or_path, ModelRef) else name_or_path
    if not is_tunnel(where):
        return load_llm(name_or_path, **kwargs)
    tunnel = open_tunnel(where)
    return boot(tunnel.folder, tunnel.config, **kwargs)


load_model.__signature__ = inspect.signature(load_llm)  # help() and completion show the loader's keywords
