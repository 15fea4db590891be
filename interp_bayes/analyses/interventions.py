"""Interventions on the entropy axis during in-context learning, against control axes, and what they change in the
geometry and in the Bayesian behaviour (Paper III §4.6, methods §3.8). The operators are ``model.edits``; the controls
``analyses.controls``.

Beside the linear edits (cut / only / shift), two on-manifold ablations (``model.edits.ONMANIFOLD_OPS``) set the
component along an axis to values the data gives: ``resample``, another evaluation prompt's component of the same
stratum (task column ``k``: the number of examples for SULA, the query position for a wind tunnel; donors from
``stats.donors_within``, seeded, never the prompt itself, never a prompt the axes were fitted on), and ``mean``, the
stratum's mean component over the evaluation prompts. A control direction is ablated the same way along itself."""

from __future__ import annotations

# pandas and plotly are imported inside the methods that build a table or a figure: computing rows needs neither
from dataclasses import dataclass, field

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.progress import progress_bar
from ..core.results import Row
from ..model.collect import token_values
from ..model.edits import ONMANIFOLD_OPS, OPS, make_op, onmanifold_op, resolve_edits
from ..model.prefix import EditedRun, edited_runs
from ..stats import as_float64, bootstrap, donors_within, interval, percentile_of
from ..stats.calibration import compare_to_bayes
from ..stats.pca import correlations
from ..stats.resample import group_ids, paired_excess_draws
from ..stats.sequential import UNDECIDED, beyond_redraw, sequential_test, sequential_tests
from .controls import CONTROL_FAMILIES, FULL_CONTROLS, RANDOM_FAMILIES, control_directions

MEASURES = ("mae_k_ge_1", "corr_bayes", "kl_bits", "geom_downstream")  # what ``summarize`` reports by default
MIN_DRAWS = 10  # below this many control draws a percentile takes too few values to read, and no range is shown
CONTROL_MEASURE = "mae_k_ge_1"  # the measure the claims read (``kinds.interventions.readout_claim``) stops draws
# random control axes drawn between two looks at the true edit's rank: the fewest at which a rank can settle (the
# true effect below 4 of 5 controls accepts at the toolkit's level and resampling risk)
CONTROL_BATCH = 5
# the ablations (the linear cut and the on-manifold ones) whose readout excess over matched controls is decided
# (``readout_excess``): their matched family runs to its cap, whatever the rank test decided
ABLATION_OPS = ("cut", *ONMANIFOLD_OPS)


def measure_unit(metric: str) -> str:
    """The unit of an intervention measure and of its change: bits for an entropy MAE or a KL divergence, a
    fraction for label accuracy, Pearson r for a correlation (corr_*, and geom_*: r(v·u, model H) at a layer)."""
    if metric.startswith(("mae", "kl")):
        return "bits"
    if metric == "accuracy":
        return "fraction"
    if metric.startswith(("corr", "geom")):
        return "r"
    raise ConfigError(f"No unit is known for the intervention measure {metric!r}; add it to measure_unit.")


@dataclass(frozen=True)
class EditProtocol:
    """The edits of the protocol: every operator (``model.edits.OPS`` and ``ONMANIFOLD_OPS``) on every layer set (its layers edited
    together, each along its own axis), for the true axis and for ``controls`` (control family of
    ``CONTROL_FAMILIES`` -> number of draws; by default ``FULL_CONTROLS``, the paper's), drawn with ``seed``. For
    the random families (``controls.RANDOM_FAMILIES``) the number is a cap: they are drawn ``batch`` at a time until
    the true edit's rank among them is settled (``run_interventions``)."""

    layer_sets: tuple[tuple[int, ...], ...]
    ops: tuple[str, ...] = OPS
    controls: dict[str, int] = field(default_factory=lambda: dict(FULL_CONTROLS))
    seed: int = 0
    batch: int = CONTROL_BATCH

    def __post_init__(self) -> None:
        unknown = sorted(set(self.controls) - set(CONTROL_FAMILIES))
        if unknown:
            raise ConfigError(f"Unknown control family {', '.join(unknown)}; families: {', '.join(CONTROL_FAMILIES)}.")
        counts = {f: n for f, n in self.controls.items() if isinstance(n, bool) or not isinstance(n, int) or n < 0}
        if counts:
            raise ConfigError(f"Control draws must be whole numbers of at least 0 (0: no such control), not "
                              f"{', '.join(f'{f}: {n!r}' for f, n in counts.items())}.")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ConfigError(f"Control axes are drawn in batches of at least 1, not {self.batch!r}.")
        bad = sorted(set(self.ops) - set(OPS + ONMANIFOLD_OPS))
        if bad:
            raise ConfigError(f"Unknown intervention {', '.join(bad)}; choose from {', '.join(OPS + ONMANIFOLD_OPS)}.")
        object.__setattr__(self, "layer_sets", tuple(tuple(s) for s in self.layer_sets))
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "controls", dict(self.controls))

    @property
    def layers(self) -> list[int]:
        """Every layer some set edits: the layers that need an axis."""
        return sorted({layer for s in self.layer_sets for layer in s})

    @property
    def onmanifold(self) -> bool:
        """Whether some operator sets per-prompt values (and so needs every prompt's values at every position)."""
        return any(op in ONMANIFOLD_OPS for op in self.ops)


def layer_set_name(layer_set) -> str:
    """A layer set as its rows name it: its layers joined by "+" ("10+15+20")."""
    return "+".join(map(str, layer_set))


@dataclass
class InterventionResult:
    """One row per (layer set, operator, axis kind, draw), the per-prompt baseline, the prompts run forward (the
    unperturbed run once per call of ``edited_runs``, and every edit), and per (layer set, op, random family) the
    sequential test of the true edit's rank among the controls (``Decision.as_dict``: decision, p, draws, ...)."""

    rows: list[dict]
    baseline: dict
    n_forward_prompts: int
    true_entropy: dict  # (layer set, op) -> [n] model entropy under the true-axis edit, for bootstrap intervals
    donors: np.ndarray | None = None  # [n] the resample ablation's donor of each prompt (an index into the prompts)
    tests: dict = field(default_factory=dict)  # (layer set, op, family) -> the sequential test's decision
    # (layer set, op) -> [matched draws, prompts at k >= 1] |entropy - Bayes| per prompt under each matched
    # control's ablation (``ABLATION_OPS`` only), for the readout excess' two-level bootstrap
    matched_errors: dict = field(default_factory=dict)

    def table(self):
        """The rows as a pandas DataFrame (tidy: one measurement set per row)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def figure(self, metric: str = "mae_k_ge_1"):
        """Plotly strip of ``metric`` per layer set and operator: every control draw, and the true axis."""
        import plotly.express as px

        df = self.table()
        df["edit"] = df.layer_set.map("L{}".format) + " " + df.op
        return px.strip(df, x="edit", y=metric, color="kind", template="plotly_white",
                        title=f"{metric}: true axis vs control draws (baseline {self.baseline[metric]:.4f})")

    def _repr_html_(self) -> str:
        cols = ["layer_set", "op", "kind", "draw", "mae_k_ge_1", "corr_bayes", "kl_bits", "accuracy"]
        return self.table()[cols].to_html(index=False, float_format="%.4f", max_rows=40)


def calibration_measures(entropy: np.ndarray, label_logprobs: np.ndarray, task: dict) -> dict:
    """Calibration of a run against the exact posterior: MAE per k, for k >= 1 and overall; correlation with
    Bayes entropy and label accuracy for k >= 1."""
    cmp = compare_to_bayes(entropy, task["bayes_entropy"], by=task["k"], predicted=label_logprobs.argmax(-1),
                           latent=task["latent"])
    pos = cmp["k_ge_1"]
    out = dict(mae=cmp["all"]["mae"], mae_k_ge_1=pos["mae"], corr_bayes=pos["corr_with_bayes"]["pearson"],
               accuracy=pos["accuracy"])
    out.update({f"mae_k{k}": b["mae"] for k, b in cmp["per_group"].items()})
    return out


def _geometry(run: EditedRun, directions: dict[int, np.ndarray], spread: dict[int, float] | None = None) -> dict:
    """corr(v_L . u_L, model entropy) at every collected layer L (on the values this run actually computed).

    Where the projection has lost its spread (below 1e-6 of ``spread[L]``, the unperturbed one: after a cut on
    that axis) the correlation would be one of rounding noise, so it is NaN.
    """
    h = as_float64(run.entropy)
    out = {}
    for layer, u in directions.items():
        proj = as_float64(run.values[layer]) @ u
        flat = spread is not None and proj.std() < 1e-6 * spread[layer]
        out[f"geom_L{layer}"] = float("nan") if flat else correlations(proj, h)["pearson"]
    return out


def run_interventions(model, prompts: list[str], axes: dict, fit_values: dict, task: dict, protocol: EditProtocol, *,
                      label_tokens: list[int], batch_size: int | None = None, fast: bool = True,
                      progress: bool = True) -> InterventionResult:
    """Every edit of ``protocol``: the value axis of each layer set edited with each operator, for the true axes and
    the control draws.

    axes: layer -> EntropyAxis (fitted on other prompts: cross-fitting); fit_values: layer -> the values the axes
    were fitted on (for the matched and PC controls); task: columns ``k``, ``latent``, ``bayes_entropy`` of the
    evaluation ``prompts``.
    Geometry is read at every axis layer from the values each run computes: at an edited layer it sees the edited
    values (nearly tautological after a cut, as in the paper), at later layers values computed downstream of the edit.

    The true edits and the fixed families (``pcs``) run first; the random families (``controls.RANDOM_FAMILIES``)
    are then drawn ``protocol.batch`` axes at a time, every open (layer set, op) of every family in one call of
    ``edited_runs``, and a (layer set, op, family) stops once the true edit's rank among its controls on
    ``CONTROL_MEASURE`` is settled (``stats.sequential_tests``, one-tailed: the true effect beyond the controls, at
    the toolkit's level with its resampling risk) or at the family's count, its cap (undecided: "borderline"). Draw
    i of a family is the same axis whatever the cap, so a larger cap extends a run. ``InterventionResult.tests``
    holds each decision, with the draws used. The matched family of an ablation (``ABLATION_OPS``) runs to its cap
    whatever its rank test decided: the readout excess (``readout_excess``) averages over its draws and resamples
    them, and a rank settled after 5 draws leaves too few for that; its per-prompt errors are kept
    (``InterventionResult.matched_errors``).

    fast: reuse what an edit cannot change (the blocks before its first edited layer) and stack several edits into
    one forward (``prefix.edited_runs``); the same numbers as ``fast=False``, a whole forward pass per edit (bit for
    bit on CPU with MKL; the tests check 1e-5 relative on every model family and on SmolLM2).
    """
    layers = sorted(axes)
    true_dirs = {layer: as_float64(axes[layer].direction) for layer in layers}
    onmanifold = {}
    if protocol.onmanifold:  # donors among these (evaluation) prompts only, of the same k
        strata = np.asarray(task["k"])
        onmanifold = dict(token_vals=token_values(model, prompts, protocol.layers, batch_size=batch_size),
                          strata=strata, donors=donors_within(strata, protocol.seed))
    controls = {fam: n for fam, n in protocol.controls.items() if n > 0}
    fixed = {fam: n for fam, n in controls.items() if fam not in RANDOM_FAMILIES}
    random = {fam: n for fam, n in controls.items() if fam in RANDOM_FAMILIES}
    edits_of = [(layer_set, op) for layer_set in protocol.layer_sets for op in protocol.ops]
    rows, true_entropy, matched_errors, state = [], {}, {}, dict(baseline=None, spread=None, forwards=0)
    pos = np.flatnonzero(np.asarray(task["k"]) >= 1)
    bayes = np.asarray(task["bayes_entropy"], dtype=np.float64)[pos]

    def op_of(op: str, layer: int, u: np.ndarray):
        u = torch.tensor(u)
        if op in ONMANIFOLD_OPS:
            return onmanifold_op(op, u, onmanifold["token_vals"][layer], onmanifold["strata"], onmanifold["donors"])
        return make_op(op, u, axes[layer].sigma)

    def directions(families: dict[str, int], start: int) -> dict:
        """layer -> family -> (directions, variance ratios) of draws start .. start + n - 1."""
        return {layer: control_directions(fit_values[layer], axes[layer].direction, families, layer=layer,
                                          seed=protocol.seed, start=start) for layer in layers if families}

    def run(entries: list[tuple], drawn: dict, start: int) -> list[dict]:
        """Run (layer set, op, kind, draw) edits (controls from ``drawn``, its draw 0 being draw ``start``) and
        append their rows."""
        def u(layer, kind, draw):
            return true_dirs[layer] if kind == "true" else drawn[layer][kind][0][draw - start]

        edits = [resolve_edits(model, {layer: op_of(op, layer, u(layer, kind, draw)) for layer in layer_set})
                 for layer_set, op, kind, draw in entries]
        base, *runs = edited_runs(model, prompts, edits, layers=layers, label_tokens=label_tokens,
                                  batch_size=batch_size, fast=fast, tick=bar.update)
        state["forwards"] += (1 + len(edits)) * len(prompts)
        if state["baseline"] is None:  # the unperturbed run: the same in every call
            state["spread"] = {layer: float((as_float64(base.values[layer]) @ u).std())
                               for layer, u in true_dirs.items()}
            state["baseline"] = dict(calibration_measures(as_float64(base.entropy), base.label_logprobs.numpy(), task),
                                     **_geometry(base, true_dirs), entropy=as_float64(base.entropy).tolist())
        baseline, new = state["baseline"], []
        for (layer_set, op, kind, draw), r in zip(entries, runs):
            h = as_float64(r.entropy)
            row = dict(layer_set=layer_set_name(layer_set), op=op, kind=kind, draw=draw,
                       kl_bits=float(r.kl.mean()),
                       corr_entropy_baseline=correlations(h, baseline["entropy"])["pearson"],
                       **calibration_measures(h, r.label_logprobs.numpy(), task),
                       **_geometry(r, true_dirs, state["spread"]))
            later = [row[f"geom_L{layer}"] for layer in layers if layer > max(layer_set)]
            row["geom_downstream"] = float(np.nanmean(later)) if later else float("nan")
            if kind != "true" and drawn[layer_set[0]][kind][1] is not None:  # a family matching variance
                row["variance_ratio"] = float(np.mean([drawn[layer][kind][1][draw - start] for layer in layer_set]))
            if kind == "true":
                true_entropy[(row["layer_set"], op)] = h
            elif kind == "matched" and op in ABLATION_OPS:
                matched_errors.setdefault((row["layer_set"], op), {})[draw] = np.abs(h[pos] - bayes)
            new.append(row)
        rows.extend(new)
        return new

    cap_edits = len(edits_of) * (1 + sum(controls.values()))  # every control drawn up to its family's count
    bar = progress_bar(total=cap_edits * len(prompts), desc="interventions", unit="prompt", disable=not progress)
    with bar:
        first = run([(ls, op, "true", 0) for ls, op in edits_of]
                    + [(ls, op, fam, i) for ls, op in edits_of for fam, n in fixed.items() for i in range(n)],
                    directions(fixed, 0), 0)
        effect = {(ls, op): r[CONTROL_MEASURE] - state["baseline"][CONTROL_MEASURE]
                  for (ls, op), r in zip(edits_of, first)}
        columns = [(fam, ls, op) for fam in random for ls, op in edits_of]
        to_cap = np.array([fam == "matched" and op in ABLATION_OPS for fam, _, op in columns], dtype=bool)
        tests = {}
        if columns:
            drawn_so_far = [0]

            def draw(b: int, open_: np.ndarray) -> np.ndarray:
                start = drawn_so_far[0]
                drawn_so_far[0] += b
                entries = [(ls, op, fam, i) for (fam, ls, op), live in zip(columns, open_ | to_cap) if live
                           for i in range(start, min(start + b, random[fam]))]
                out = np.full((b, len(columns)), np.nan)
                if not entries:
                    return out
                families = {fam: min(b, random[fam] - start) for fam in {e[2] for e in entries}}
                at = {key: j for j, key in enumerate(columns)}
                for row, (ls, op, fam, i) in zip(run(entries, directions(families, start), start), entries):
                    out[i - start, at[(fam, ls, op)]] = row[CONTROL_MEASURE] - state["baseline"][CONTROL_MEASURE]
                return out

            cap = max(random.values())
            decisions = sequential_tests(draw, [effect[(ls, op)] for _, ls, op in columns], alternative="greater",
                                         batch=min(protocol.batch, cap), cap=cap, open_columns=True)
            while to_cap.any() and drawn_so_far[0] < random.get("matched", 0):  # every test settled before the cap
                draw(min(protocol.batch, random["matched"] - drawn_so_far[0]), np.zeros(len(columns), dtype=bool))
            tests = {(layer_set_name(ls), op, fam): d.as_dict() for (fam, ls, op), d in zip(columns, decisions)}
    # the rows in the protocol's order: edit, then true axis, then the families in their order, then draw
    order = {kind: i for i, kind in enumerate(["true", *controls])}
    position = {(layer_set_name(ls), op): i for i, (ls, op) in enumerate(edits_of)}
    rows.sort(key=lambda r: (position[(r["layer_set"], r["op"])], order[r["kind"]], r["draw"]))
    return InterventionResult(rows, state["baseline"], state["forwards"], true_entropy, onmanifold.get("donors"),
                              tests, {key: np.stack([errs[i] for i in sorted(errs)])
                                      for key, errs in matched_errors.items()})


@dataclass(frozen=True)
class ReadoutErrors:
    """Per-prompt |entropy - Bayes| at k >= 1 under one ablation of the true axis and of each matched control axis,
    on prompts beyond the evaluation set (``readout_errors``), pooled with it by ``summarize``."""

    true: np.ndarray  # [n]
    matched: np.ndarray  # [m, n], draw i the axis ``run_interventions`` draws as matched control i
    n_forward_prompts: int


def readout_errors(model, prompts: list, axes: dict, fit_values: dict, task: dict, protocol: EditProtocol,
                   layer_set, *, label_tokens: list[int], batch_size: int | None = None,
                   progress: bool = True) -> ReadoutErrors:
    """The cut at ``layer_set`` of the true axes and of the matched control axes ``run_interventions`` cuts with
    ``protocol`` (its seed, draws 0 .. controls["matched"] - 1, from the same ``fit_values``), run on other
    evaluation ``prompts`` (task columns ``k``, ``bayes_entropy``) so that the readout excess pools their errors
    with the evaluation set's: more prompts narrow its interval, the axes stay the same. The unperturbed run and
    these 1 + m edits are all that is run."""
    m = protocol.controls.get("matched", 0)
    drawn = {layer: control_directions(fit_values[layer], axes[layer].direction, {"matched": m}, layer=layer,
                                       seed=protocol.seed)["matched"][0] for layer in layer_set}
    directions = [{layer: as_float64(axes[layer].direction) for layer in layer_set},
                  *({layer: drawn[layer][i] for layer in layer_set} for i in range(m))]
    edits = [resolve_edits(model, {layer: make_op("cut", torch.tensor(u[layer]), axes[layer].sigma)
                                   for layer in layer_set}) for u in directions]
    with progress_bar(total=len(edits) * len(prompts), desc="readout prompts", unit="prompt",
                      disable=not progress) as bar:
        _, *runs = edited_runs(model, prompts, edits, layers=[], label_tokens=label_tokens, batch_size=batch_size,
                               tick=bar.update)
    pos = np.flatnonzero(np.asarray(task["k"]) >= 1)
    bayes = np.asarray(task["bayes_entropy"], dtype=np.float64)[pos]
    err = np.stack([np.abs(as_float64(r.entropy)[pos] - bayes) for r in runs])
    return ReadoutErrors(err[0], err[1:], (1 + len(edits)) * len(prompts))


def readout_excess(true_err, control_err, groups=None, *, delta: float, seed=0, scope: dict | None = None,
                   beside: int = 0) -> Row:
    """How much more an ablation of the true axis harms calibration than ablating matched control axes: the paired
    excess D = mean over prompts of (true error - mean control error), in bits (``true_err`` [n]: each prompt's
    |entropy - Bayes| under the true ablation; ``control_err`` [m, n]: under each of m control ablations; the
    unperturbed error cancels from the difference). Its 95% interval is a two-level bootstrap: each draw resamples
    the prompts (whole ``groups`` where given: a wind tunnel's sequences) and, independently, the m control draws,
    so the interval carries both the prompts' noise and the spread between control axes. Drawn until the interval is
    settled on one side of ``delta`` (``stats.sequential_test``, two-sided at the toolkit's level: each end against
    ``delta`` with half the resampling risk) or at the default cap. Row ``readout_excess``: the value, the draws'
    interval, n prompts, the decision in ``Row.test`` (``ledger.below_margin`` reads it).

    Against a range of the control draws, a true axis that is itself one more control lies beyond all m of them
    with chance 1 / (m + 1) (9% at m = 10), and a seed of the draws flips the verdict of a true effect near the
    range's edge; the interval of D is settled against ``delta`` and not against the controls' extremes. Another
    set of control axes still moves D (by the sd of the axes' mean errors over sqrt(m)): a decision is kept only
    where the interval's end lies farther from ``delta`` than that times the normal quantile at the resampling risk
    (``test["control_shift"]``), else it is undecided ("borderline"). ``beside``: how many of the n prompts were
    drawn beside the evaluation set (``readout_errors``), for the note."""
    true_err, control_err = as_float64(true_err).reshape(-1), as_float64(control_err)
    m, n = control_err.shape
    if m < 2 or control_err.shape[1] != len(true_err):
        raise ConfigError(f"The readout excess needs at least 2 control draws over the true ablation's {len(true_err)} "
                          f"prompts (got {m} over {n}).")
    value = float(true_err.mean() - control_err.mean())
    test = sequential_test(paired_excess_draws(true_err, control_err, groups, seed=seed), delta,
                           alternative="two-sided")
    # another set of m control axes (another --seed) moves the excess and its interval with it
    test, shift = beyond_redraw(test, delta, control_err.mean(axis=1))
    return Row("readout_excess", value, "bits", dict(scope or {}), *test.null, "two-level bootstrap 95%", n=n,
               note=f"true ablation minus the mean of {m} matched ones"
                    + (f" over {n} prompts ({n - beside} evaluation, {beside} drawn beside them)" if beside else "")
                    + f"; decided against {delta:g} bits, at least "
                    f"{shift:.2g} from it (another set of controls moves it that far at the resampling risk)",
               test=dict(test.as_dict(), control_shift=shift))


def summarize(result: InterventionResult, task: dict, *, metrics=MEASURES, n_boot: int = 1000,
              seed: int = 0, readout_delta: float | None = None,
              more: dict[tuple[str, str], ReadoutErrors] | None = None) -> list[Row]:
    """Tidy rows: the unperturbed run's measures (scope ``condition: baseline``); per (layer set, op, measure) the
    true axis' ``effect`` (value minus baseline; KL as is) with, for the MAE, a bootstrap interval over prompts
    (over whole ``task["groups"]`` where given: a wind tunnel's sequences) and the matched controls' 95% range as
    its null, each control family's mean ``effect`` with its 95% range, and the true effect's
    ``percentile_of_true`` within each family (no range or percentile is read from fewer than ``MIN_DRAWS``
    draws, unless the sequential test settled on them: a note says so). On ``CONTROL_MEASURE`` each random family's
    percentile row carries its sequential test (``Row.test``: decision, p, draws used). The true row keeps no test
    (a rejection of its rank needs at least 242 draws at the level and risk, more than the recipes' caps, so a test
    on that row would turn every case beyond its controls "borderline"). With ``readout_delta`` (the readout
    claim's, in bits), each ablation (``ABLATION_OPS``) with at least 2 matched draws gets a ``readout_excess`` row
    (scope ``family: matched``): its excess over the matched controls decided against that delta, which is what
    the readout claim reads; ``more`` ((layer set, op) -> ``readout_errors`` on prompts beside the evaluation set,
    each prompt a unit of its own, as SULA's are) adds their errors to that row's, and changes no other row."""
    import pandas as pd

    df = pd.DataFrame(result.rows)
    base = result.baseline
    n = len(base["entropy"])
    bayes, k = np.asarray(task["bayes_entropy"]), np.asarray(task["k"])
    base_h = np.asarray(base["entropy"])
    pos = np.flatnonzero(k >= 1)
    groups = None if task.get("groups") is None else np.asarray(task["groups"])[pos]
    layers = sorted(int(key[len("geom_L"):]) for key in base if key.startswith("geom_L"))

    def base_metric(metric: str, layer_set: str) -> float:
        if metric != "geom_downstream":
            return base[metric]
        later = [base[f"geom_L{layer}"] for layer in layers if layer > max(map(int, layer_set.split("+")))]
        return float(np.mean(later)) if later else float("nan")

    out = [Row(measure, value, measure_unit(measure), dict(condition="baseline"), n=n)
           for measure, value in base.items() if measure != "entropy"]
    for (layer_set, op), group in df.groupby(["layer_set", "op"], sort=False):
        true = group[group.kind == "true"].iloc[0]
        for metric in metrics:
            ref = 0.0 if metric == "kl_bits" else base_metric(metric, layer_set)
            if np.isnan(ref):  # no layer after the edited ones: no downstream geometry to compare
                continue
            scope, unit = dict(layer_set=layer_set, op=op, measure=metric), measure_unit(metric)
            effect = true[metric] - ref
            # each family's draws in the protocol's order of families
            families = [(fam, g[metric].to_numpy() - ref)
                        for fam, g in group[group.kind != "true"].groupby("kind", sort=False)]
            ci = (None, None)
            if metric == "mae_k_ge_1":
                h = result.true_entropy[(layer_set, op)]
                err = np.abs(h[pos] - bayes[pos]) - np.abs(base_h[pos] - bayes[pos])  # per prompt, paired
                _, low, high = bootstrap(lambda idx: err[idx].mean(), len(pos), groups, n_boot=n_boot, seed=seed)
                ci = (float(low[0]), float(high[0]))
            tests = {fam: result.tests.get((layer_set, op, fam)) if metric == CONTROL_MEASURE else None
                     for fam, _ in families}
            if metric == CONTROL_MEASURE and readout_delta is not None and \
                    len(result.matched_errors.get((layer_set, op), ())) >= 2:
                true_err = np.abs(result.true_entropy[(layer_set, op)][pos] - bayes[pos])
                matched_err, units = result.matched_errors[(layer_set, op)], groups
                beside = (more or {}).get((layer_set, op))
                if beside is not None:
                    true_err = np.concatenate([true_err, beside.true])
                    matched_err = np.concatenate([matched_err, beside.matched], axis=1)
                    if groups is not None:  # each prompt beside the evaluation set a unit of its own
                        ids = group_ids(groups, len(groups))
                        units = np.r_[ids, ids.max(initial=-1) + 1 + np.arange(len(beside.true))]
                out.append(readout_excess(true_err, matched_err, units, delta=readout_delta, seed=seed,
                                          scope=dict(scope, family="matched"),
                                          beside=0 if beside is None else len(beside.true)))

            def enough(fam: str, eff: np.ndarray) -> bool:
                return len(eff) >= MIN_DRAWS or (tests[fam] or {}).get("decision", UNDECIDED) != UNDECIDED

            matched = dict(families).get("matched")
            null = ((*interval(matched), f"matched controls ({len(matched)} draws)")
                    if matched is not None and enough("matched", matched) else (None, None, None))
            out.append(Row("effect", effect, unit, dict(scope, family="true"), *ci,
                           "bootstrap 95%" if ci[0] is not None else None, *null, n=n, note=f"baseline {ref:.4g}"))
            for fam, eff in families:
                draws, ok = len(eff), enough(fam, eff)
                out.append(Row("effect", float(np.nanmean(eff)), unit, dict(scope, family=fam),
                               *(interval(eff) if ok else (None, None)), "controls 95%" if ok else None,
                               n=draws, note=None if ok else f"too few draws for a range ({draws})"))
                out.append(Row("percentile_of_true", percentile_of(effect, eff), "fraction", dict(scope, family=fam),
                               n=draws, note=None if ok else f"too few draws for a percentile ({draws})",
                               test=tests[fam]))
    return out
