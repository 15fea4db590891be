"""The sweep's progress lines: "probe i/N: NAME" with an ETA that comes from the seconds an earlier run recorded
(unknown on a first run; nothing for probes that are cached)."""

import re

import yaml

from interp_bayes.config import SweepConfig
from interp_bayes.sweep import run_sweep


def test_progress_says_probe_i_of_n_with_an_eta(tiny_dirs, tmp_path, capsys):
    probes = []
    for name, spec in (("keys", dict(kind="keys", n_null=5)), ("focusing", dict(kind="focusing", per_bin=2,
                                                                                n_boot=20))):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        probes.append(str(tmp_path / f"{name}.yaml"))
    config = SweepConfig(model=str(tiny_dirs["llama3"]), out=str(tmp_path / "runs"), prompts="basic", quiet=False,
                         probes=probes)
    run_sweep(config)
    first = capsys.readouterr().out
    assert re.search(r"^probe 1/2: keys \(ETA unknown \(first run here\); 0s so far\)$", first, re.M), first
    assert re.search(r"^probe 2/2: focusing \(ETA \d+s for this and the rest; ", first, re.M), first
    # a second model under the same --out: the probes' recorded seconds give the ETA from the start
    run_sweep(config.override(seed=1))
    second = capsys.readouterr().out
    assert re.search(r"^probe 1/2: keys \(ETA \d+s for this and the rest; 0s so far\)$", second, re.M), second
    run_sweep(config)  # all cached: nothing left to wait for
    assert re.search(r"^probe 1/2: keys \(ETA 0s for this and the rest", capsys.readouterr().out, re.M)
