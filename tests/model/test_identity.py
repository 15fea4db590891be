"""A cached number belongs to the model that made it: a local model is identified by the whole contents of its
files (memoised by size, mtime and inode, in the process and on disk), and a wind-tunnel checkpoint named in a recipe
enters its stage key by content."""

import json
import os
import shutil
import struct
import time
from pathlib import Path

import pytest
import torch

from interp_bayes.model import loading
from interp_bayes.model.loading import model_identity
from interp_bayes.run.config import SweepConfig
from interp_bayes.run.sweep import run_folder, run_sweep


def _tensor_span(weights: Path, name: str) -> tuple[int, int]:
    """(start, end) byte offsets of one tensor's data in a safetensors file (8-byte header length, JSON header)."""
    with weights.open("rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    start, end = header[name]["data_offsets"]
    return 8 + n + start, 8 + n + end


def _overwrite(weights: Path, start: int, end: int, seed: int) -> None:
    """Write other float32 values over bytes [start, end) in place: same size, same header."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn((end - start) // 4, generator=g).numpy().astype("<f4").tobytes()
    with weights.open("r+b") as f:
        f.seek(start)
        f.write(values)


@pytest.fixture
def wide_model(tmp_path):
    """A tiny Llama whose MLPs make model.safetensors about 6 MiB, so layer 0's key projection lies in the middle
    of the file, more than a MiB from either end."""
    from transformers import AutoModelForCausalLM

    from interp_bayes.model.testing import make_tokenizer, tiny_config

    config = tiny_config("llama3")
    config.intermediate_size = 4096
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    folder = tmp_path / "wide"
    make_tokenizer(folder)
    model.save_pretrained(folder)
    return folder


def test_a_same_size_edit_in_the_middle_of_the_weights_is_a_new_model(wide_model, tmp_path, capsys):
    def layer0(run):
        return next(r.value for r in run.rows if r.metric == "key_orthogonality" and r.scope.get("layer") == 0)

    weights = wide_model / "model.safetensors"
    start, end = _tensor_span(weights, "model.layers.0.self_attn.k_proj.weight")
    size = weights.stat().st_size
    assert size > 4 * 2**20 and start > 2**20 and end < size - 2**20  # where sampling the ends would not look
    config = SweepConfig(model=str(wide_model), out=str(tmp_path / "out"), probes=["keys"], layers=[0, 1])
    first = run_sweep(config)
    assert first.computed == ["keys"]
    before = layer0(first)  # rows are read from the folder
    identity, folder = model_identity(wide_model), run_folder(config)
    assert run_sweep(config).computed == []  # unchanged: cached

    _overwrite(weights, start, end, seed=1)  # edit one attention projection and save in place
    assert weights.stat().st_size == size
    assert model_identity(wide_model) != identity
    assert run_folder(config) != folder  # a new run key, so nothing of the old model is served
    capsys.readouterr()
    second = run_sweep(config)
    assert second.computed == ["keys"] and "[cached]" not in capsys.readouterr().out

    assert layer0(second) != before


def _settled(path: Path) -> None:
    """Date a file a minute back, as a model saved a while ago is (``RACY_SECONDS``)."""
    t = time.time_ns() - 60 * 10**9
    os.utime(path, ns=(t, t))


def test_whole_file_digests_are_memoised_in_the_process_and_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_BAYES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "_DIGESTS", {})
    big = tmp_path / "big.safetensors"
    big.write_bytes(os.urandom(loading.DISK_MEMO_BYTES + 4096))
    _settled(big)
    digest = loading._file_digest(big)
    import hashlib

    assert digest == hashlib.sha256(big.read_bytes()).hexdigest()  # the whole file
    memo = json.loads((tmp_path / "cache" / loading.DIGESTS_FILE).read_text())
    assert memo[str(big.resolve())][3] == digest

    reads = []
    monkeypatch.setattr(loading, "file_digest", lambda p: reads.append(p) or "recomputed")
    assert loading._file_digest(big) == digest  # this process's memo
    monkeypatch.setattr(loading, "_DIGESTS", {})  # a new process: the disk's memo
    assert loading._file_digest(big) == digest and reads == []

    with big.open("r+b") as f:  # an edit in place: a new mtime
        f.seek(loading.DISK_MEMO_BYTES // 2)
        f.write(b"edited")
    assert loading._file_digest(big) == "recomputed" and len(reads) == 1
    _settled(big)
    moved = tmp_path / "moved"
    shutil.copy2(big, moved)  # same size and mtime, another inode, then renamed over the original
    os.replace(moved, big)
    assert loading._file_digest(big) == "recomputed" and len(reads) == 2


def test_a_file_modified_just_now_is_not_memoised(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "_DIGESTS", {})
    f = tmp_path / "config.json"
    f.write_text("{}")
    loading._file_digest(f)
    assert str(f.resolve()) not in loading._DIGESTS  # a second edit within the clock's tick would keep its mtime
    _settled(f)
    loading._file_digest(f)
    assert str(f.resolve()) in loading._DIGESTS


def test_a_tunnel_retrained_in_place_is_computed_again(tiny_dirs, tmp_path, capsys):
    """A recipe's ``tunnel:`` enters the stage key by content: new weights at the same path are a new stage (before,
    the key held the path alone, and the old tunnel's numbers were served as ``[cached]``)."""
    import yaml
    from safetensors.torch import load_file, save_file

    from interp_bayes.windtunnel.tunnels import checkpoint_folder

    tunnel = tmp_path / "tunnel"
    shutil.copytree(checkpoint_folder("bijection-cpu"), tunnel, ignore=shutil.ignore_patterns("checkpoints"))
    recipe = tmp_path / "mart.yaml"
    recipe.write_text(yaml.safe_dump(dict(kind="martingale", tunnel=str(tunnel), per_k=3, ks=[2, 6], n_perms=2,
                                          n_draws=2, n_null=3, n_boot=20)))
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), probes=[str(recipe)])

    def gaps(run):
        return [r.value for r in run.rows if r.metric == "martingale_gap_kl_bits"]

    first = run_sweep(config)
    before = gaps(first)  # rows are read from the folder: keep them before it changes
    assert first.computed == ["mart"] and run_sweep(config).computed == []
    weights = tunnel / "model.safetensors"
    tensors = load_file(weights)
    g = torch.Generator().manual_seed(1)
    save_file({k: v + 0.5 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
               for k, v in tensors.items()}, weights, metadata={"format": "pt"})  # "retrained" into the same folder
    capsys.readouterr()
    second = run_sweep(config)
    assert second.computed == ["mart"] and "[cached]" not in capsys.readouterr().out
    assert second.folder == first.folder  # the sweep's model did not change: the same run, a new stage
    assert gaps(second) != before


def test_model_json_is_a_record_not_a_source_of_depth_and_a_damaged_one_is_written_again(tiny_dirs, tmp_path,
                                                                                        capsys):
    """The depth that resolves ``-1`` / ``middle`` / ``spread5`` comes from the model's config (part of its identity),
    not from the run folder's ``model.json``; an edited or truncated ``model.json`` is written again by the next sweep,
    as the report's warning advises, even when every probe is cached."""
    from interp_bayes.model.testing import write_toy_recipes
    from interp_bayes.run.sweep import Context

    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"),
                         probes=write_toy_recipes(tmp_path / "recipes")[:1])  # keys: loads the weights
    folder = run_sweep(config).folder
    meta = folder / "model.json"
    good = json.loads(meta.read_text())
    assert good["n_layers"] == 2

    meta.write_text(json.dumps(dict(good, n_layers=5)))  # edited: a deeper model than the folder holds
    ctx = Context(folder, config, print)
    assert ctx.n_layers() == 2 and ctx.layers("middle") == [1] and ctx.layers([-1]) == [1]
    assert run_sweep(config).computed == []
    assert json.loads(meta.read_text()) == good

    meta.write_text(meta.read_text()[:40])  # truncated
    capsys.readouterr()
    assert run_sweep(config).computed == []
    assert json.loads(meta.read_text()) == good and "write it again" in capsys.readouterr().out
    from interp_bayes.report.view import RunView

    assert RunView.load(folder).model["n_layers"] == 2 and "damaged" not in capsys.readouterr().err
