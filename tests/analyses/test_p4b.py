"""P4b ("decodable but inert"): the embedding-layer reading against the model's own embedding, the decodability
verdicts on planted data where a position axis masquerades as entropy, the ablation verdicts on planted inert and
causal axes, the cluster count against its null, and the analysis end to end on a tiny wind tunnel."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from interp_bayes.analyses.p4b import (_decodability, ablation_rows, ablation_verdicts, cost_tolerance, cut_verdicts,
    readout_sites)
from interp_bayes.analyses.subspaces import ablation_costs
from interp_bayes.model.collect import query_readings
from interp_bayes.model.edits import SubspaceCut, intervene
from interp_bayes.model.loading import load_model
from interp_bayes.stats import covariate_basis
from interp_bayes.stats.clusters import cluster_count
from interp_bayes.windtunnel.configs import build_transformer, make_config, make_task
from interp_bayes.windtunnel.train import save_folder

torch.set_num_threads(1)
EPS32 = float(torch.finfo(torch.float32).eps)


def saved(tmp_path, **overrides):
    cfg = make_config("bijection", "tiny", task_kwargs={"n_symbols": 6}, **overrides)
    task = make_task(cfg)
    torch.manual_seed(0)
    save_folder(build_transformer(cfg, task).eval(), cfg, task, tmp_path, {"step": 0})
    return tmp_path, task


def hf_embedding(hf, ids: torch.Tensor) -> torch.Tensor:
    """[n, T, d] what the model adds up before its first block, from its own modules: GPT-2's token plus position
    tables, GPT-NeoX's token table (its positions are rotary, inside attention)."""
    if hasattr(hf, "transformer"):
        return hf.transformer.wte(ids) + hf.transformer.wpe(torch.arange(ids.shape[1]))[None]
    return hf.gpt_neox.embed_in(ids)


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_embedding_reading_is_the_models_embedding_output(tmp_path, positions):
    folder, task = saved(tmp_path, positions=positions)
    model = load_model(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    batch = task.sample(8, seed=1)
    got = query_readings(model, batch, layers=[0], readings=("resid_pre",))["resid_pre"][0]  # [n * Q, d]
    with torch.no_grad():
        want = hf_embedding(hf, batch.input_ids)[:, batch.query_pos].reshape(len(got), -1)
    # one float32 addition of two table rows: the bridge and the reference round alike, to a few ulps
    assert torch.allclose(got, want, rtol=0, atol=4 * EPS32 * float(want.abs().max()))
    assert readout_sites(model)[0] == ("embed", "resid_pre", 0)


def test_cutting_the_embedding_reading_is_cutting_the_embedding_output(tmp_path):
    folder, task = saved(tmp_path)
    model = load_model(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = task.sample(6, seed=2).input_ids
    d = hf.config.n_embd
    basis = torch.linalg.qr(torch.randn(d, 3, generator=torch.Generator().manual_seed(0)))[0].T  # [3, d]
    op = SubspaceCut(basis)
    with torch.no_grad(), intervene(model, {0: op}, site="resid_pre"):
        edited = model(ids)
    with torch.no_grad():
        plain = model(ids)
        embeds = hf_embedding(hf, ids)
        p = op.basis.double()
        cut = (embeds.double() - embeds.double() @ p.T @ p).float() - hf.transformer.wpe(torch.arange(ids.shape[1]))
        want = hf(inputs_embeds=cut).logits  # GPT-2 adds the position table to inputs_embeds itself
    scale = float(want.abs().max())
    assert (edited - plain).abs().max() > 1e3 * EPS32 * scale  # the edit does something
    # a few float32 roundings per layer, through two blocks
    assert torch.allclose(edited, want, rtol=0, atol=1e3 * EPS32 * scale)


def planted(within: bool, encodes: str, n_seq: int = 40, Q: int = 10, d: int = 16, seed: int = 0):
    """Rows (sequence, position) with an entropy that is a function of position (``within`` False: the bijection
    without replacement) or also varies within a position (True: with replacement), and activations that encode
    either the entropy itself or only the position (a random vector per position, as a learned position table)."""
    rng = np.random.default_rng(seed)
    position = np.tile(np.arange(Q, dtype=float), n_seq)
    entropy = np.log2(Q + 1 - position)
    if within:
        entropy = entropy * (rng.random(len(position)) < 0.6)  # a repeated key: a delta, entropy 0
    x = rng.standard_normal((len(position), d)) * 0.05
    if encodes == "entropy":
        x[:, 0] += entropy
    else:
        x += rng.standard_normal((Q, d))[position.astype(int)]
    return x, entropy, position, np.repeat(np.arange(n_seq), Q)


def verdicts(x, entropy, position, groups) -> dict:
    kw = dict(site="resid", layer=0, n_layers=1, groups=groups, folds=4, n_null=1000, n_boot=100, seed=0)
    return {"decodable": _decodability(x, entropy, shuffle="rows", **kw),
            "within": _decodability(x, entropy, covariates=covariate_basis({"position": position}), **kw)}


def test_a_position_axis_masquerading_as_entropy_is_told_apart_from_an_entropy_axis():
    from interp_bayes.stats.ledger import FAILS, HOLDS, INSEPARABLE, beyond_null

    # without replacement: the entropy is position; decodable, but within position there is nothing to test
    v = verdicts(*planted(within=False, encodes="position"))
    assert v["decodable"].value > 0.99 and beyond_null(v["decodable"]) == HOLDS
    assert beyond_null(v["within"]) == INSEPARABLE
    # with replacement, activations that carry the entropy: it survives within position
    v = verdicts(*planted(within=True, encodes="entropy"))
    assert beyond_null(v["decodable"]) == HOLDS and beyond_null(v["within"]) == HOLDS
    assert v["within"].value > 0.9
    # with replacement, activations that carry only the position: raw R² clears its null, within position fails
    v = verdicts(*planted(within=True, encodes="position"))
    assert beyond_null(v["decodable"]) == HOLDS and v["decodable"].value < 0.5
    assert beyond_null(v["within"]) == FAILS


def test_an_inert_decodable_axis_and_a_causal_one_get_opposite_verdicts():
    """Planted: the 'model' reads its two-way belief from direction 0 only; direction 1 carries an entropy-like
    code nothing reads. Cutting 1 is inert; cutting 0 is load-bearing, both against matched controls."""
    rng = np.random.default_rng(0)
    n_seq, Q, d = 60, 5, 12
    x = torch.from_numpy(rng.standard_normal((n_seq * Q, d)) * np.linspace(2, 0.5, d)).float()
    read = torch.zeros(d)
    read[0] = 1.0

    def losses(xe: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        logp = torch.log_softmax(torch.stack([xe @ read, -(xe @ read)], -1).double(), -1)
        post = torch.softmax(torch.stack([x @ read, -(x @ read)], -1).double(), -1)
        kl = (post * (post.log() - logp)).sum(-1).numpy() / np.log(2)
        h = lambda lp: -(lp.exp() * lp).sum(-1).numpy() / np.log(2)  # noqa: E731
        return np.abs(h(logp) - h(post.log())).reshape(n_seq, Q), kl.reshape(n_seq, Q)

    base = losses(x)
    named = {"read": np.eye(d)[[0]], "code": np.eye(d)[[1]]}
    _, summary = ablation_costs(lambda op: losses(op(x)), x.numpy(), named, base, layer=0, n_isotropic=10,
                                n_matched=10, seed=0)
    rows = ablation_rows(summary, "0", n_seq)
    cut = {r.scope["subspace"]: r for r in rows if r.metric == "cut_kl_bits"}
    assert cut["code"].value == pytest.approx(0.0, abs=1e-12)
    assert cut_verdicts(cut["code"], cost_tolerance(2)) == ("holds", "does not hold")
    assert cut_verdicts(cut["read"], cost_tolerance(2)) == ("does not hold", "holds")
    p = next(r for r in rows if r.metric == "cut_kl_bits_p" and r.scope == dict(cut["read"].scope, family="matched"))
    assert p.value < 0.2  # beyond every one of its 10 matched draws: p = 2 / 11


def test_a_cost_at_float32_rounding_is_never_load_bearing():
    """The per-position MLP's cuts move its KL by 1e-7..1e-5 bits either way: rounding, not an effect."""
    tol = cost_tolerance(20)
    assert 1e-5 < tol < 1e-4
    assert ablation_verdicts(4.7e-7, [-3.0e-7, 2.8e-7], tol) == ("holds", "does not hold")
    assert ablation_verdicts(1e-3, [-3.0e-7, 2.8e-7], tol) == ("does not hold", "holds")
    assert ablation_verdicts(0.03, [0.0, 0.02], tol) == ("does not hold", "holds")
    assert ablation_verdicts(0.01, [0.0, 0.02], tol) == ("holds", "does not hold")


def test_cluster_count_finds_planted_blobs_and_none_in_one_gaussian():
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((3, 6)) * 8
    blobs = np.concatenate([c + rng.standard_normal((100, 6)) for c in centres])
    got = cluster_count(blobs, k_max=5, n_null=8, seed=0)
    assert got["n_clusters"] == 3 and got["silhouette"] > got["null_range"][1]
    one = rng.standard_normal((300, 6)) @ rng.standard_normal((6, 6))
    assert cluster_count(one, k_max=5, n_null=8, seed=0)["n_clusters"] == 1


def test_p4b_end_to_end_on_a_tiny_tunnel(tmp_path):
    from interp_bayes.analyses.p4b import answer, decoding_verdict
    from interp_bayes.core.results import select
    from interp_bayes.kinds.p4b import P4bParams, run, summary

    folder, _ = saved(tmp_path)
    params = P4bParams.from_dict(dict(tunnel=str(folder), n_fit=30, n_eval=20, n_controls=2, n_null=4, n_boot=20,
                                      geometry=False))
    rows = run(None, params).rows
    layers = [r.scope["layer"] for r in select(rows, "decoding_r2")]
    assert layers == ["embed"] * 4 + ["0"] * 4  # the tiny preset has one block; four tests at each reading
    within = select(rows, "decoding_r2", test="within position")
    assert all(decoding_verdict(r) == "inseparable" for r in within)  # without replacement entropy is position
    subspaces = {r.scope["subspace"] for r in select(rows, "cut_kl_bits")}
    assert {"entropy-axis", "position-axis", "frame-embed"} <= subspaces
    assert "entropy-within-position-axis" not in subspaces
    assert answer(rows, folder.name)["reading"] == "position"
    frame = select(rows, "cut_kl_bits", subspace="frame-embed")[0]
    assert frame.scope["k"] == 6  # the six hypothesis tokens
    assert summary(rows, params)[-1].value == answer(rows, folder.name)["line"]


def test_a_negative_r2_never_decodes_even_above_its_null():
    from interp_bayes.analyses.p4b import decoding_verdict
    from interp_bayes.stats.ledger import FAILS, HOLDS

    from interp_bayes.core.results import Row

    row = Row("decoding_r2", -0.0001, null_low=-0.0017, null_high=-0.0003)  # the rotary model's embedding layer
    assert decoding_verdict(row) == FAILS
    assert decoding_verdict(Row("decoding_r2", 0.2, null_low=-0.0017, null_high=-0.0003)) == HOLDS


def test_cluster_alignment_names_the_label_the_clusters_are():
    from interp_bayes.stats.clusters import cluster_alignment

    rng = np.random.default_rng(1)
    state = rng.integers(0, 4, size=400)
    other = rng.integers(0, 4, size=400)  # independent of the clusters
    x = np.eye(4)[state] * 6 + rng.standard_normal((400, 4))  # four blobs, one per state
    got = cluster_alignment(x, {"state": state, "other": other}, 4, seed=0)
    assert got["state"] > 0.95 and abs(got["other"]) < 0.05


def test_tunnel_geometry_end_to_end_on_a_tiny_hmm(tmp_path):
    """The tunnel_geometry kind on a tiny HMM LSTM: a decoding row per (reading, test), the alignment on the HMM, the
    summary's lines; a recall folder, or a name that is no wind tunnel, is refused when the recipe is read."""
    from interp_bayes.core.errors import ConfigError
    from interp_bayes.core.results import select
    from interp_bayes.kinds.tunnel_geometry import TunnelGeometryParams, run, summary
    from interp_bayes.windtunnel.train import train_main

    folder = tmp_path / "hmm"
    assert train_main(["hmm", "--preset", "tiny", "--arch", "lstm", "--steps", "3", "--out", str(folder),
                       "--quiet"]) == 0
    params = TunnelGeometryParams.from_dict(dict(tunnel=str(folder), n=24, n_null=3))
    assert params.checkpoints() == {"tunnel": folder}
    rows = run(None, params).rows
    assert [(r.scope["layer"], r.scope["test"]) for r in select(rows, "decoding_r2")] == [
        (layer, test) for layer in ("embed", "0") for test in ("decodable", "within position")]
    align = {r.scope["label"]: r for r in select(rows, "cluster_alignment")}
    assert set(align) == {"map_state", "last_observation"} and align["map_state"].note == "k-means, k = 5"
    assert select(rows, "pc1_share")[0].n == 24 * 8  # every observation of the tiny preset's 8 steps is a row
    lines = summary(rows, params)
    assert any(f"{align['map_state'].value:.3f}" in line.value for line in lines)
    recall = tmp_path / "recall"
    assert train_main(["recall", "--preset", "tiny", "--steps", "2", "--out", str(recall), "--quiet"]) == 0
    with pytest.raises(ConfigError, match="reads bijection or hmm tunnels"):
        TunnelGeometryParams.from_dict(dict(tunnel=str(recall))).checkpoints()
    with pytest.raises(ConfigError, match="no wind-tunnel checkpoint"):
        TunnelGeometryParams.from_dict(dict(tunnel="no-such-checkpoint")).checkpoints()
