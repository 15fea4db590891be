"""The dynamics page: both figures from a results dict, plotly.js once (packed), nothing external."""

import base64
import gzip
import re

from interp_bayes.report.dynamics_page import build_dynamics_page


def test_dynamics_page_has_both_figures(tmp_path):
    results = dict(
        sticky=dict(entropy_floor=1.829, loss_curves=dict(sgd=[2.1, 2.0, 1.95], em_like=[2.1, 1.9, 1.85])),
        frames=[dict(run="runs/<b>x</b>", steps=[50, 100, 200], ratio=0.8,
                     curves=dict(attention_similarity=[0.1, 0.9, 1.0], entropy_mae=[1.0, 0.5, 0.1]))],
        frames_summary=dict(geomean=0.8, lo=0.5, hi=1.3, n=1))
    text = build_dynamics_page(results, tmp_path / "d.html").read_text()
    assert 'id="fig-losses"' in text and 'id="fig-frames"' in text and "0.80 (95% CI 0.50-1.30)" in text
    (packed,) = re.findall(r'id="ib-plotly">([A-Za-z0-9+/=]+)</script>', text)
    assert gzip.decompress(base64.b64decode(packed)).decode().count("plotly.js v") == 1
    assert 'src="http' not in text and "<b>x</b>" not in text
