"""Tiny random models of every supported family, saved as real HF folders: for tests, examples and smoke runs.

One config factory for all families (argument names drift between transformers versions; a typo here would build
a full-size model silently, so ``make_tiny_model`` checks the parameter count against the config).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import ConfigError

TINY_FAMILIES = ("pythia", "phi2", "llama3", "mistral", "gpt2")
_TEXTS = [
    "the cat sat on the mat", "in context learning with induction heads", "hello world 0 1 2 3",
    "The capital of France is Paris.", "def f(x): return x + 1", "a b c d e f g h i j k l m n o p",
    "happy: dax, sad: lug. calm: mip, grim: zorb.",  # single-token label words for the in-context task
] * 20
_COMMON = dict(vocab_size=420, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               max_position_embeddings=256, bos_token_id=0, eos_token_id=0, pad_token_id=1, tie_word_embeddings=False)


def tiny_config(family: str):
    """A small config exercising the family's quirks: NeoX fused qkv and partial rotary; Phi partial rotary;
    Llama GQA with head_dim != hidden/heads; Mistral one KV head and a sliding window; GPT-2 (the wind tunnels'
    architecture) fused Conv1D qkv and learned positions."""
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig, MistralConfig, PhiConfig

    if family == "pythia":
        return GPTNeoXConfig(**_COMMON, rotary_pct=0.25, use_parallel_residual=True, hidden_act="gelu")
    if family == "phi2":
        return PhiConfig(**_COMMON, partial_rotary_factor=0.4, hidden_act="gelu_new", num_key_value_heads=4)
    if family == "llama3":
        return LlamaConfig(**_COMMON, num_key_value_heads=2, head_dim=24, rope_theta=500000.0, rms_norm_eps=1e-5)
    if family == "mistral":
        return MistralConfig(**_COMMON, num_key_value_heads=1, sliding_window=16)
    if family == "gpt2":
        c = _COMMON
        return GPT2Config(vocab_size=c["vocab_size"], n_embd=c["hidden_size"], n_layer=c["num_hidden_layers"],
                          n_head=c["num_attention_heads"], n_inner=c["intermediate_size"],
                          n_positions=c["max_position_embeddings"], bos_token_id=0, eos_token_id=0, pad_token_id=1,
                          tie_word_embeddings=False, activation_function="gelu")
    raise ConfigError(f"Unknown tiny family '{family}'; choose one of {', '.join(TINY_FAMILIES)}.")


def expected_parameters(config) -> int:
    """Parameter count implied by a tiny config, computed by hand (guards against ignored config keys)."""
    d, L, V = config.hidden_size, config.num_hidden_layers, config.vocab_size
    f = getattr(config, "n_inner", None) or getattr(config, "intermediate_size", None)
    h = config.num_attention_heads
    dh = getattr(config, "head_dim", None) or d // h
    kv = getattr(config, "num_key_value_heads", None) or h
    embed = 2 * V * d  # untied embedding and unembedding
    if config.model_type == "gpt_neox":  # LN (w,b) x2, fused qkv + dense with bias, MLP with bias; final LN; no lm_head bias
        per = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
        return embed + L * per + 2 * d
    if config.model_type == "gpt2":  # learned positions; LN x2, Conv1D qkv / proj / fc / proj with bias; final LN
        per = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
        return embed + config.n_positions * d + L * per + 2 * d
    if config.model_type == "phi":  # one LN (w,b), q/k/v/dense with bias, fc1/fc2 with bias; final LN; lm_head bias
        per = 2 * d + (d * h * dh + h * dh) + 2 * (d * kv * dh + kv * dh) + (h * dh * d + d) + (d * f + f) + (f * d + d)
        return embed + L * per + 2 * d + V
    # llama / mistral: two RMSNorm weights, bias-free q/k/v/o, gated MLP, final norm
    per = 2 * d + d * h * dh + 2 * d * kv * dh + h * dh * d + 3 * d * f
    return embed + L * per + d


def make_tokenizer(out_dir: str | Path, vocab_size: int = 400):
    """A byte-level BPE tokenizer trained on a few fixed sentences, saved to disk and reloaded (the bridge needs that)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_TEXTS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<pad>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                            unk_token="<|endoftext|>", pad_token="<pad>").save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def make_tiny_model(family: str, out_dir: str | Path, seed: int = 0):
    """Build, save (model and tokenizer) and return a seeded fp32 tiny HF model of ``family`` in eval mode."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    n = sum(p.numel() for p in model.parameters())
    if n != expected_parameters(config):
        raise AssertionError(f"tiny {family}: {n} parameters, expected {expected_parameters(config)} (config ignored?)")
    with torch.no_grad():  # the default std-0.02 init gives near-uniform logits; widen it so edits show
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    out_dir = Path(out_dir)
    make_tokenizer(out_dir)
    model.save_pretrained(out_dir)  # before any bridge wraps (and mutates) the module
    return model.eval()


# Probe recipes small enough for a tiny model to finish each in about a second, covering every headline of the grid
# page (manifold, icl, axis, interventions) and the weights-only keys probe: the grid tests' and benchmark's cells.
TOY_PROBES = {
    "keys": dict(kind="keys", n_null=10),
    "mixed": dict(kind="manifold", per_bin=4, n_boot=100, n_null=30, n_resample=30),
    "icl": dict(kind="icl", conditions=["main"], per_k=4, layers=[1], n_boot=50, n_null=10),
    "axis": dict(kind="axis", per_k=4, layers=[1], folds=3),
    "cut": dict(kind="interventions", per_k=4, layers=[1], layer_sets=[[1]], ops=["cut"],
                controls={"isotropic": 1, "matched": 1}),
}


def write_toy_recipes(folder: str | Path, scale: int = 1) -> list[str]:
    """Write ``TOY_PROBES`` as YAML recipes into ``folder`` and return their paths (in order). ``scale`` multiplies
    the manifold probe's resampling counts, to make a cell longer."""
    import yaml

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, body in TOY_PROBES.items():
        if body["kind"] == "manifold":
            body = dict(body, **{k: body[k] * scale for k in ("n_boot", "n_null", "n_resample")})
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(body))
        paths.append(str(folder / f"{name}.yaml"))
    return paths

