"""Tiny random models of every supported family, saved as real HF folders: for tests, examples and smoke runs.

One config factory for all families (argument names drift between transformers versions; a typo here would build
a full-size model silently, so ``make_tiny_model`` checks the parameter count against the config).
"""

from __future__ import annotations

# transformers and tokenizers are imported inside the builders: the recipes and the float32 bounds below serve tests
# that build no model
import math
from pathlib import Path

import torch
import yaml

from ..core.errors import ConfigError
from .numerics import IEEE, ONEDNN, onednn_rounds_to_bf16

TINY_FAMILIES = ("pythia", "phi2", "llama3", "mistral", "gpt2")
POST_NORM_FAMILIES = ("gemma2", "gemma3")  # a norm after the MLP (post_feedforward_layernorm); not in every fixture
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
    if family in POST_NORM_FAMILIES:  # Gemma 2 soft-caps its logits (final 30, attention 50); Gemma 3 does not
        from transformers import Gemma2Config, Gemma3TextConfig

        kw = dict(_COMMON, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=16)
        return Gemma2Config(**kw) if family == "gemma2" else Gemma3TextConfig(**kw)
    raise ConfigError(f"Unknown tiny family '{family}'; choose one of "
                      f"{', '.join(TINY_FAMILIES + POST_NORM_FAMILIES)}.")


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
    if config.model_type in ("gemma2", "gemma3_text"):  # four RMSNorms (Gemma 3 also q/k norms), gated MLP
        per = 4 * d + (2 * dh if config.model_type == "gemma3_text" else 0) + d * h * dh + 2 * d * kv * dh \
            + h * dh * d + 3 * d * f
        return embed + L * per + d
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
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, body in TOY_PROBES.items():
        if body["kind"] == "manifold":
            body = dict(body, **{k: body[k] * scale for k in ("n_boot", "n_null", "n_resample")})
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(body))
        paths.append(str(folder / f"{name}.yaml"))
    return paths


# ---------------------------------------------------------------------------------------------------------------
# Float32 rounding bounds for tests that compare two float32 evaluations of one computation whose kernels or shapes
# differ (batched vs single, logits at one position vs all, sdpa vs eager): the bound comes from the arithmetic, so
# it holds for every BLAS kernel and summation order, not for one machine's rounding.
#
# The model (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019; Ipsen & Zhou, SIAM J. Sci. Comput. 42(1), 2020): each
# rounding is x(1 + d) with |d| <= u, the d independent, zero-mean. To first order the error of an evaluation is a
# sum of one term per rounding, d_i v_i, and a sum of independent bounded terms concentrates (Hoeffding; Pinelis 1994
# for vectors): ||sum d_i v_i|| < lam u sqrt(sum ||v_i||^2) but with probability 2 exp(-lam^2 / 2). A sum of k terms
# t_j in any order takes at most 2k roundings (k products, k additions), each multiplying a partial sum or a product
# of size <= sum |t_j|, so sum ||v_i||^2 <= 2k (sum |t_j|)^2 whatever the order; two evaluations round
# independently, so their difference has sqrt(2) times that spread.
# ---------------------------------------------------------------------------------------------------------------

U32 = 2.0 ** -24  # float32 unit roundoff: fl(x) = x (1 + d), |d| <= U32


def float32_lambda(n_bounds: int, p_fail: float = 1e-6) -> float:
    """The lam at which ``n_bounds`` tail bounds P(|X| >= lam sigma) <= 2 exp(-lam^2/2) all hold but with
    probability ``p_fail`` (union bound): about 6 for tens of bounds, 7 for 50,000."""
    return math.sqrt(2 * math.log(2 * n_bounds / p_fail))


def float32_bound(k: int, abs_sum, *, lam: float):
    """Bound on |a - b| for two float32 evaluations, in any order and by any kernel, of one sum of ``k`` terms
    whose absolute values sum to ``abs_sum`` (a number or a tensor of them): lam * sqrt(2) * u * sqrt(2k) * abs_sum
    (the model above)."""
    return lam * 2 * U32 * math.sqrt(k) * abs_sum


U_BF16 = 2.0 ** -9  # bfloat16 unit roundoff (8 significant bits): what an input rounded to bfloat16 may lose


def float32_mode_bound(k: int, abs_sum, *, lam: float, mode: str = IEEE, bf16_inputs: bool | None = None):
    """Bound on |a - b| for one sum of ``k`` products whose absolute values sum to ``abs_sum``, ``a`` computed under
    the numeric mode ``mode`` (``model.numerics``: ``ieee`` or ``onednn-bf16``), ``b`` under IEEE float32.

    Under ``onednn-bf16`` oneDNN keeps float32 unless the CPU has AMX (``bf16_inputs`` None: this CPU's answer): its
    kernel then rounds as any float32 kernel does, in its own order, and the bound is ``float32_bound`` (issue 37
    measured a largest relative error of 7.5e-7 against float64 there, and 3.7e-7 under IEEE: float32 rounding both).
    Where it rounds both inputs of every product to bfloat16 (AMX; the product of two bfloat16 numbers is exact in
    float32), the term t = a b becomes t (1 + d_a) (1 + d_b), |d| <= U_BF16: two more independent roundings of size
    U_BF16 |t| per term, hence (the model above) at most lam * sqrt(2) * U_BF16 * sqrt(sum t^2) <= lam * sqrt(2) *
    U_BF16 * abs_sum more."""
    if mode not in (IEEE, ONEDNN):
        raise ValueError(f"mode must be {IEEE!r} or {ONEDNN!r}, not {mode!r}")
    bound = float32_bound(k, abs_sum, lam=lam)
    rounds = onednn_rounds_to_bf16() if bf16_inputs is None else bf16_inputs
    return bound + lam * math.sqrt(2) * U_BF16 * abs_sum if mode == ONEDNN and rounds else bound


_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm, torch.bmm,
            torch.Tensor.bmm, torch.nn.functional.linear, torch.einsum}
_ADD_MATMULS = {torch.addmm, torch.Tensor.addmm, torch.baddbmm, torch.Tensor.baddbmm}  # bias + a @ b
_SUMS = {torch.sum, torch.Tensor.sum, torch.mean, torch.Tensor.mean}
_ELEMENTWISE = {  # one rounding each (<= 1 ulp = 2u for exp / tanh / erf in torch's kernels); exact ops are absent
    torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__, torch.Tensor.__iadd__, torch.sub,
    torch.Tensor.sub, torch.Tensor.__sub__, torch.Tensor.__rsub__, torch.mul, torch.Tensor.mul, torch.Tensor.__mul__,
    torch.Tensor.__rmul__, torch.div, torch.Tensor.div, torch.Tensor.__truediv__, torch.Tensor.__rtruediv__,
    torch.exp, torch.Tensor.exp, torch.log, torch.Tensor.log, torch.log2, torch.Tensor.log2, torch.tanh,
    torch.Tensor.tanh, torch.sigmoid, torch.Tensor.sigmoid, torch.rsqrt, torch.Tensor.rsqrt, torch.sqrt,
    torch.Tensor.sqrt, torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.sin, torch.cos, torch.Tensor.sin,
    torch.Tensor.cos, torch.erf, torch.nn.functional.silu, torch.nn.functional.gelu, torch.special.xlogy}


class _Roundoff(torch.overrides.TorchFunctionMode):
    """Adds to the result of every floating-point operation a random perturbation of the size of its float32
    rounding under the model above, times ``amplify``: +-sqrt(2k) u (|a| |b|) for a product accumulating k terms
    (+-sqrt(2k) u (|x| summed) for a sum), +-2u |y| for an elementwise function, and for softmax, log_softmax and
    layer_norm the rounding of their row sums. Signs are drawn independently per element (Rademacher), so the
    response of the output, divided by ``amplify``, has second moment sum ||v_i||^2 / u^2 * u^2."""

    def __init__(self, generator: torch.Generator, amplify: float, active: bool = True):
        super().__init__()
        self.gen, self.amplify, self.active = generator, amplify, active

    def _noise(self, like: torch.Tensor, shape=None) -> torch.Tensor:
        shape = like.shape if shape is None else shape
        signs = torch.randint(0, 2, shape, generator=self.gen, dtype=like.dtype) * 2 - 1
        return signs * (self.amplify * U32)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        F = torch.nn.functional
        if not self.active:
            return func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:  # unfused, so that both its products and its softmax count
            return self._sdpa(*args, **kwargs)
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        if func in _MATMULS or func in _ADD_MATMULS:
            if func is torch.einsum:
                eq, ops = args[0], [a.abs() for a in args[1:]]
                mag, k = torch.einsum(eq, *ops), torch.einsum(eq, *[torch.ones_like(a) for a in ops]).max().item()
            elif func is F.linear:
                x, w = args[0], args[1]
                b = args[2] if len(args) > 2 else kwargs.get("bias")
                mag, k = F.linear(x.abs(), w.abs(), None if b is None else b.abs()), w.shape[-1] + (b is not None)
            else:
                a, b = (args[1], args[2]) if func in _ADD_MATMULS else (args[0], args[1])
                mag = torch.matmul(a.abs(), b.abs()) + (args[0].abs() if func in _ADD_MATMULS else 0)
                k = a.shape[-1] + (func in _ADD_MATMULS)
            return out + mag * math.sqrt(2 * k) * self._noise(out)
        if func in _SUMS:
            x = args[0]
            k = max(x.numel() // max(out.numel(), 1), 1)
            return out + func(x.abs(), *args[1:], **kwargs) * math.sqrt(2 * k) * self._noise(out)
        if func in _ELEMENTWISE:  # masks' sentinels (dtype minimum) stay as they are
            big = out.abs() > torch.finfo(out.dtype).max / 4
            return torch.where(big, out, out + out.abs() * 2 * self._noise(out))
        if func in (torch.softmax, torch.Tensor.softmax, F.softmax, torch.log_softmax, torch.Tensor.log_softmax,
                    F.log_softmax):
            dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
            n = out.shape[dim]
            row = list(out.shape)
            row[dim] = 1
            rel = math.sqrt(2 * n) * self._noise(out, row)  # the row's sum of exponentials, relative error
            log = func in (torch.log_softmax, torch.Tensor.log_softmax, F.log_softmax)
            return (out - rel if log else out * (1 - rel)) + out.abs().nan_to_num(0, 0, 0) * 2 * self._noise(out)
        if func is F.layer_norm:
            x, shape = args[0], args[1]
            dims = tuple(range(-len(shape), 0))
            n = math.prod(shape)
            xc = x - x.mean(dims, keepdim=True)
            sd = xc.pow(2).mean(dims, keepdim=True).add(kwargs.get("eps", args[4] if len(args) > 4 else 1e-5)).sqrt()
            row = x.shape[:-len(shape)] + (1,) * len(shape)
            d_mu = x.abs().mean(dims, keepdim=True) * math.sqrt(2 * n) * self._noise(x, row)
            d_sd = 0.5 * math.sqrt(2 * n) * self._noise(x, row)  # relative; its terms are squares, all positive
            w = kwargs.get("weight", args[2] if len(args) > 2 else None)
            dy = -(d_mu + xc * d_sd) / sd
            return out + (dy * w if w is not None else dy)
        return out

    def _sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        """scaled_dot_product_attention in its unfused form (its math backend), for ``_Roundoff`` to see."""
        L, S = q.shape[-2], k.shape[-2]
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        if enable_gqa:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
        scores = self.__torch_function__(torch.mul, (), (self.__torch_function__(torch.matmul, (), (q, k.mT)), scale))
        if is_causal:
            scores = scores.masked_fill(torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L).logical_not(),
                                        float("-inf"))
        if attn_mask is not None:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf")) if attn_mask.dtype == torch.bool \
                else scores + attn_mask
        probs = self.__torch_function__(torch.softmax, (), (scores, -1))
        return self.__torch_function__(torch.matmul, (), (probs, v))


def float32_spread(run, *, start: torch.nn.Module | None = None, n_probes: int = 8, amplify: float = 64.0,
                   seed: int = 0) -> list[torch.Tensor]:
    """Mean-square float32 rounding error (an upper estimate, per element) of each tensor that ``run()`` returns;
    ``run`` evaluates a float64 copy of the model.

    ``run`` is evaluated once plainly and ``n_probes`` times under ``_Roundoff``, which gives every operation a
    random error of its float32 rounding's size times ``amplify`` (so that the response stands far above the
    resolution of float32 outputs and, at ~1e-4 relative, stays first order). The mean square response estimates
    sum ||v_i||^2 of the model above; summed over a vector's elements its relative standard error is at most
    sqrt(2 / n_probes) (one dominant direction), so it is raised by three of those. Errors compound through the
    network's depth as the float64 forward propagates them: no per-layer growth factor is assumed. With ``start``,
    operations count from the first call of that module on (earlier ones run the same kernels on the same shapes
    in both evaluations, so they round identically)."""
    clean = [t.double() for t in run()]
    gen = torch.Generator().manual_seed(seed)
    sq = [torch.zeros_like(c) for c in clean]
    for _ in range(n_probes):
        mode = _Roundoff(gen, amplify, active=start is None)
        hook = start.register_forward_pre_hook(lambda *_: setattr(mode, "active", True)) if start else None
        try:
            with mode:
                got = run()
        finally:
            if hook is not None:
                hook.remove()
        for s, g, c in zip(sq, got, clean):
            s += ((g.double() - c) / amplify).pow(2) / n_probes
    return [s * (1 + 3 * math.sqrt(2 / n_probes)) for s in sq]
