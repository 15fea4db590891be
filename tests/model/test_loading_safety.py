"""Loading and identity: pickle weights only when asked, Hub revisions keyed by the commit they resolve to, the
converted-model cache under the umask, SIGTERM taking Ctrl-C's path, and a shared activation set collected once."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from interp_bayes.core.errors import ConfigError
from interp_bayes.run.config import SweepConfig
from interp_bayes.core.errors import ModelLoadError, ModelNotFoundError
from interp_bayes.model.loading import gguf_folder, load_model, model_identity, model_info
from interp_bayes.model.testing import make_tiny_model

SHA1, SHA2, SHA3 = "1" * 40, "2" * 40, "3" * 40


def _to_pickle(folder: Path) -> None:
    """Replace a saved model's safetensors weights by the same tensors as a pickle (``pytorch_model.bin``), the
    format ``save_pretrained(safe_serialization=False)`` wrote before transformers 5 dropped the option."""
    weights = folder / "model.safetensors"
    torch.save(load_file(weights), folder / "pytorch_model.bin")
    weights.unlink()


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).float()


def _reference_logits(folder, ids):
    """A plain HF forward of the weights in ``folder``: the independent reference (eager attention)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", use_safetensors=None).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits.float()


# 1. safetensors only, unless asked

def test_pickle_only_folder_is_refused_and_loads_with_the_flag(tmp_path, capsys):
    from interp_bayes.cli import main

    safe, folder = tmp_path / "safe", tmp_path / "pickled"
    make_tiny_model("llama3", safe)
    shutil.copytree(safe, folder)
    _to_pickle(folder)
    assert sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".safetensors")) == ["pytorch_model.bin"]

    with pytest.raises(ModelLoadError, match=r"only pickle weights \(pytorch_model\.bin\).*pass --allow-pickle") as e:
        load_model(folder)
    assert str(e.value).count(". ") == 0 and str(e.value).endswith(".")  # one sentence
    ids = [0, 5, 17, 42, 99]
    model = load_model(folder, allow_pickle=True)
    torch.testing.assert_close(_logits(model, ids), _reference_logits(safe, ids), rtol=0, atol=1e-5)

    # the command line: one sentence, exit 2; the flag loads it; the flag is no part of the run's identity
    out = str(tmp_path / "runs")
    capsys.readouterr()  # progress bars of the loads above
    assert main(["sweep", "--model", str(folder), "--out", out, "--probes", "keys", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and [line for line in err.splitlines() if "--allow-pickle" in line] == [
        f"interp-bayes: error: {e.value}"], err
    assert main(["sweep", "--model", str(folder), "--out", out, "--probes", "keys", "--quiet", "--set",
                 "keys.n_null=5", "--allow-pickle"]) == 0
    assert SweepConfig(model=str(folder), allow_pickle=True).digest() == SweepConfig(model=str(folder)).digest()
    with pytest.raises(ConfigError, match="'allow_pickle' must be true or false"):
        SweepConfig(allow_pickle="yes")


def test_folder_without_weights_says_so(tmp_path):
    make_tiny_model("pythia", tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="holds no weights"):
        load_model(tmp_path)


# 2. a Hub id is keyed by the commit its revision resolves to

@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An HF cache folder (the layout huggingface_hub writes) pointed at by HF_HUB_CACHE, and a function that puts
    a snapshot of a tiny model in it under a commit and points ``refs/<ref>`` at it."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read once at import; the loaders read it here
    repo = cache / "models--org--tiny"

    def snapshot(sha: str, seed: int = 0, ref: str | None = "main", pickle: bool = False) -> Path:
        folder = repo / "snapshots" / sha
        if not folder.exists():
            make_tiny_model("llama3", folder, seed=seed)
            if pickle:
                _to_pickle(folder)
        if ref is not None:
            (repo / "refs").mkdir(parents=True, exist_ok=True)
            (repo / "refs" / ref).write_text(sha)  # no newline, as huggingface_hub writes it
        return folder

    return snapshot


def test_hub_identity_is_the_resolved_commit(hub_cache):
    first = hub_cache(SHA1)
    assert model_identity("org/tiny") == dict(hub="org/tiny", commit=SHA1)
    assert model_identity("org/tiny", "main") == model_identity("org/tiny", SHA1) == model_identity("org/tiny")
    run_id = SweepConfig(model="org/tiny").digest()
    ids = [0, 3, 9, 27, 81]
    model = load_model("org/tiny")
    assert model_info(model).commit == SHA1 and model_info(model).revision is None
    torch.testing.assert_close(_logits(model, ids), _reference_logits(first, ids), rtol=0, atol=1e-5)

    second = hub_cache(SHA2, seed=1)  # `main` moves to another commit
    assert model_identity("org/tiny") == dict(hub="org/tiny", commit=SHA2)
    assert SweepConfig(model="org/tiny").digest() != run_id
    assert SweepConfig(model="org/tiny", revision=SHA1).digest() == run_id  # the old commit, named, is the old run
    moved = load_model("org/tiny")  # and the weights loaded are the ones the identity names
    assert model_info(moved).commit == SHA2
    torch.testing.assert_close(_logits(moved, ids), _reference_logits(second, ids), rtol=0, atol=1e-5)
    assert not torch.allclose(_logits(moved, ids), _logits(model, ids))

    hub_cache(SHA1, ref="v1")  # a tag resolves through its own ref
    assert model_identity("org/tiny", "v1") == dict(hub="org/tiny", commit=SHA1)


def test_unresolved_hub_revision_is_marked_and_cannot_load(hub_cache):
    assert model_identity("org/elsewhere") == dict(hub="org/elsewhere", revision=None, commit=None)
    assert model_identity("org/elsewhere", "step1000") == dict(hub="org/elsewhere", revision="step1000", commit=None)
    with pytest.raises(ModelNotFoundError, match=r"Cannot fetch 'org/elsewhere'.*pass that folder"):
        load_model("org/elsewhere")
    with pytest.raises(ModelNotFoundError, match=r"Cannot fetch 'EleutherAI/pythia-410m'"):
        load_model("pythia-410m")  # a registry alias of a Hub model, offline and not cached


def test_a_reachable_hub_is_asked_once_per_process_and_its_errors_are_sentences(hub_cache, monkeypatch):
    """Where the Hub answers, its commit wins over the cache's (the cache may hold an older `main`), it is asked
    once per (repo, revision) in a process, and an unknown revision is one sentence."""
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RevisionNotFoundError

    from interp_bayes.model import loading as models

    hub_cache(SHA1)  # the cache still says main is SHA1
    asked = []

    def model_info(self, repo, revision=None, **kw):
        asked.append((repo, revision))
        if revision == "nope":
            url = f"https://huggingface.co/api/models/{repo}/revision/{revision}"
            raise RevisionNotFoundError("404", response=httpx.Response(404, request=httpx.Request("GET", url)))
        return type("Info", (), {"sha": SHA2})()

    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(HfApi, "model_info", model_info)
    monkeypatch.setattr(models, "_HUB_COMMITS", {})
    assert model_identity("org/tiny") == model_identity("org/tiny", "main") == dict(hub="org/tiny", commit=SHA2)
    assert asked == [("org/tiny", "main")]
    with pytest.raises(ModelNotFoundError, match=r"The Hub model 'org/tiny' has no revision 'nope'; pass one of"):
        model_identity("org/tiny", "nope")


def test_hub_checkpoint_with_pickle_weights_only_needs_the_flag(hub_cache):
    hub_cache(SHA3, pickle=True)
    with pytest.raises(ModelLoadError, match=r"'org/tiny' has no safetensors weights.*--allow-pickle"):
        load_model("org/tiny")
    assert model_info(load_model("org/tiny", allow_pickle=True)).commit == SHA3


@pytest.mark.parametrize("where", ["folder", "hub"])
def test_a_run_resolves_its_model_once(hub_cache, tiny_dirs, tmp_path, monkeypatch, where):
    """A dry run and a real run each resolve the model's name once (``model_ref``) and ask for a Hub commit once:
    the run's id, its cache keys, the tokenizer and the load all use that one reference. Before, a dry run resolved
    the name 3 times (identity twice, commit twice) and a run 4 times (identity twice, commit 3 times)."""
    from interp_bayes.cli import main
    from interp_bayes.model import loading
    from interp_bayes.model.testing import write_toy_recipes

    if where == "hub":
        hub_cache(SHA1)
    model = str(tiny_dirs["llama3"]) if where == "folder" else "org/tiny"
    calls = {"resolve": 0, "hub_commit": 0}

    def counting(name):
        real = getattr(loading, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(loading, name, counted)

    for name in calls:
        counting(name)
    keys, _, icl = write_toy_recipes(tmp_path / "recipes")[:3]
    sweep = ["sweep", "--model", model, "--out", str(tmp_path / "out"), "--quiet"]
    assert main([*sweep, "--probes", keys, icl, "--dry-run"]) == 0  # icl's set is timed: the model loads
    assert calls == dict(resolve=1, hub_commit=int(where == "hub"))
    calls.update(resolve=0, hub_commit=0)
    assert main([*sweep, "--probes", keys]) == 0  # keys loads the weights
    assert calls == dict(resolve=1, hub_commit=int(where == "hub"))


def test_a_model_reference_loads_what_it_resolved_without_resolving_again(tiny_dirs, monkeypatch):
    """``load_model(ref)`` (and ``ib.load_model(ref)``) takes the reference's source and dtype and resolves
    nothing; ``ib.load_model`` boots a wind tunnel's reference as a tunnel; a revision beside a reference is
    refused, since the reference carries its own."""
    import interp_bayes as ib
    from interp_bayes.model import loading
    from interp_bayes.windtunnel.tunnels import open_tunnel

    tunnel = open_tunnel("bijection-repl-cpu-lstm")  # not a transformers model: the LLM loader would refuse it
    assert type(ib.load_model(loading.model_ref(str(tunnel.folder)))) is type(tunnel.model)
    ref = loading.model_ref(str(tiny_dirs["llama3"]), dtype="bfloat16")
    monkeypatch.setattr(loading, "resolve", lambda *a: pytest.fail("resolved again"))
    info = model_info(ib.load_model(ref))
    assert (info.name, info.source, info.dtype) == (ref.name, ref.source, "bfloat16")
    with pytest.raises(ModelLoadError, match="carries its revision"):
        load_model(ref, revision="main")


def test_cache_keys_keep_their_bytes(hub_cache, tmp_path):
    """The identity, and so every run id and cache key, is the one computed before models were resolved once
    (values computed by the code of commit 51baa47): a folder of fixed bytes, a Hub id at a commit (however its
    revision is spelled) and an unresolved Hub revision."""
    from interp_bayes.model.loading import model_ref

    folder = tmp_path / "fixed"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}\n')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    sha = "0123456789abcdef0123456789abcdef01234567"
    hub_cache(sha)  # the snapshot's own files do not enter a Hub id's identity
    cases = {(str(folder), None): (dict(folder_digest="65954466116171c5", revision=None), "7699831b24", "93570b50f4"),
             ("org/tiny", None): (dict(hub="org/tiny", commit=sha), "8bc0267a26", "20a8a703d8"),
             ("org/tiny", "main"): (dict(hub="org/tiny", commit=sha), "8bc0267a26", "20a8a703d8"),
             ("org/elsewhere", "step1000"): (dict(hub="org/elsewhere", revision="step1000", commit=None),
                                             "882bff7462", "e360686261")}
    for (name, revision), (identity, run_id, other_id) in cases.items():
        assert model_identity(name, revision) == identity
        config = SweepConfig(model=name, revision=revision)
        assert config.digest() == config.digest(config.model_ref()) == run_id
        assert SweepConfig(model=name, revision=revision, dtype="bfloat16", seed=3).digest() == other_id
    with pytest.raises(ValueError, match="not this config's model"):
        SweepConfig(model="org/tiny", dtype="bfloat16").digest(model_ref("org/tiny"))


# 3. the converted-model cache follows the umask

def write_tiny_gguf(path: Path, tokenizer_dir: Path) -> None:
    """A one-layer Llama GGUF (float32 tensors, the tiny BPE tokenizer), in the layout llama.cpp writes and
    transformers reads: enough to exercise the conversion without the 100 MB SmolLM2 file."""
    import gguf
    import numpy as np

    from interp_bayes.model.testing import make_tokenizer

    make_tokenizer(tokenizer_dir)
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    tokens = [t for t, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    d, ff, heads, kv, vocab = 64, 128, 4, 2, len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // heads)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([1] * vocab)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, d), "output.weight": (vocab, d), "blk.0.attn_q.weight": (d, d),
              "blk.0.attn_k.weight": (kv * d // heads, d), "blk.0.attn_v.weight": (kv * d // heads, d),
              "blk.0.attn_output.weight": (d, d), "blk.0.ffn_gate.weight": (ff, d), "blk.0.ffn_up.weight": (ff, d),
              "blk.0.ffn_down.weight": (d, ff)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.normal(0, 0.2, shape).astype(np.float32))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        w.add_tensor(name, np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("umask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o002, 0o775, 0o664)])
def test_converted_model_cache_follows_the_umask(tmp_path, monkeypatch, umask, folder_mode, file_mode):
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, tmp_path / "tok")
    monkeypatch.setenv("INTERP_BAYES_CACHE", str(tmp_path / "cache"))
    old = os.umask(umask)
    try:
        out = gguf_folder(gguf)
    finally:
        os.umask(old)
    assert out.parent == tmp_path / "cache" and (out / "model.safetensors").is_file()
    modes = {str(p.relative_to(out)): p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")]}
    assert modes == {k: folder_mode if (out / k).is_dir() else file_mode for k in modes}, modes
    assert load_model(gguf).cfg.n_layers == 1  # and it loads (from the cache just written)


# 4. SIGTERM takes Ctrl-C's path

PROBES = {  # `keys` finishes first; `mixed` and `icl` take seconds on the tiny model, so the signal lands in one
    "keys": dict(kind="keys", n_null=10),
    "mixed": dict(kind="manifold", per_bin=4, n_boot=2000, n_null=300, n_resample=300),
    "icl": dict(kind="icl", per_k=20, layers=[1], n_boot=300, n_null=50),
}


def _rows(folder: Path) -> dict[str, str]:
    return {p.parent.name: json.dumps(json.loads(p.read_text()), sort_keys=True)
            for p in sorted(folder.glob("probes/*/rows.json"))}


def test_sigterm_stops_like_ctrl_c_and_the_rerun_equals_a_clean_run(tmp_path):
    model = tmp_path / "tiny"
    make_tiny_model("llama3", model)
    probes = []
    for name, body in PROBES.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(body))
        probes.append(str(tmp_path / f"{name}.yaml"))
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "interp_bayes.cli", "sweep", "--model", str(model), "--out", str(out), "--prompts",
           "basic", "--quiet", "--probes", *probes]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while not list(out.glob("*/*/probes/keys/stage.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "interrupt" in line]
    assert len(lines) == 1 and re.search(r"SIGTERM.*interrupted after [12] of 3 probes; rerun the same command", lines[0]), err
    (folder,) = out.glob("*/*")
    assert not (folder / "probes" / "icl" / "stage.json").exists()  # it stopped before the end
    assert "Partial run" in (folder / "report.html").read_text()  # the views show what finished

    from interp_bayes.run.sweep import run_sweep

    config = SweepConfig(model=str(model), out=str(out), prompts="basic", probes=probes, quiet=True)
    rerun = run_sweep(config)  # the same sweep again, in this process: it resumes
    assert rerun.folder == folder and "keys" not in rerun.computed and "icl" in rerun.computed
    clean = run_sweep(dataclasses.replace(config, out=str(tmp_path / "clean")))
    assert clean.folder.name == folder.name and clean.computed == list(PROBES)
    got, want = _rows(folder), _rows(clean.folder)
    assert sorted(got) == sorted(PROBES) and got == want


# 5. one collection of an activation set that two sweeps ask for at once

def test_two_contexts_asking_for_one_activation_set_collect_it_once(tmp_path, monkeypatch):
    from interp_bayes.run import sweep
    from interp_bayes.run.sweep import Context

    folder = tmp_path / "tiny"
    make_tiny_model("llama3", folder)
    bridge = load_model(folder)
    config = SweepConfig(model=str(folder), quiet=True)
    real, calls, inside = sweep.read, [], threading.Event()

    def slow_read(*args, **kwargs):  # holds the set's lock long enough for the second asker to arrive
        calls.append(threading.current_thread().name)
        inside.set()
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "read", slow_read)  # the name Context.activations calls
    messages, results = [], {}
    prompts = [[0, 5, 9, 14], [3, 8, 2, 7], [11, 12, 13, 1]]

    def ask(name):
        ctx = Context(tmp_path / "run", config, messages.append, model=bridge)
        results[name] = ctx.activations("shared", prompts, layers=[0, 1])

    first = threading.Thread(target=ask, args=("first",), name="first")
    second = threading.Thread(target=ask, args=("second",), name="second")
    first.start()
    assert inside.wait(60)
    second.start()
    first.join(120)
    second.join(120)
    assert calls == ["first"], calls
    assert any(m.startswith("[waiting] shared") for m in messages), messages
    for layer in (0, 1):
        assert torch.equal(results["first"].readings["v"][layer], results["second"].readings["v"][layer])
