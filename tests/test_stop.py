"""SIGTERM ends a command with exit 143 wherever it lands, inside a finaliser too (issue 35, item 4).

A handler that raises loses the signal when it runs inside a ``__del__`` (Python prints "Exception ignored" and the
sweep runs on): here a finaliser sends the signal itself, from inside the tokenizer's call or a forward pass, which
is where ``regex``'s ``Group.__del__`` delivered it in the issue."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from interp_bayes import cli
from interp_bayes.model.testing import make_tiny_model

PROBE = dict(kind="manifold", per_bin=4, n_boot=50, n_null=10, n_resample=10)


class _SignalsWhenFinalised:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)


def _finalise_with_signal() -> None:
    _SignalsWhenFinalised()  # dropped at once: its __del__ runs here, and the signal's handler inside it


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama3")
    make_tiny_model("llama3", folder)
    return folder


def _sweep_args(model: Path, tmp_path: Path) -> list[str]:
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text(yaml.safe_dump(PROBE))
    return ["sweep", "--model", str(model), "--out", str(tmp_path / "runs"), "--prompts", "basic", "--quiet",
            "--probes", str(recipe)]


def _signal_on_calls(monkeypatch, owner, name: str, calls: set[int] | None) -> list[int]:
    """Wrap ``owner.name`` so that its calls numbered in ``calls`` (1-based; None: every call) send SIGTERM from a
    finaliser; returns the call counter."""
    original = getattr(owner, name)
    count = [0]

    def wrapped(*args, **kwargs):
        count[0] += 1
        if calls is None or count[0] in calls:
            _finalise_with_signal()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)
    return count


@pytest.mark.parametrize("calls", [{1}, {7}, None], ids=["first", "seventh", "every"])
@pytest.mark.parametrize("where", ["tokenisation", "collection"])
def test_sigterm_inside_a_finaliser_ends_the_sweep_with_143(tiny_model, tmp_path, monkeypatch, capsys, where,
                                                             calls):
    from transformers import AutoTokenizer

    import interp_bayes.model.read as reader

    if where == "tokenisation":  # every tokenizer of the checkpoint: the sweep's and the collector's
        count = _signal_on_calls(monkeypatch, type(AutoTokenizer.from_pretrained(tiny_model)), "__call__", calls)
    else:  # one forward pass per batch of the reader
        count = _signal_on_calls(monkeypatch, reader, "final_logits", calls)
    before = signal.getsignal(signal.SIGTERM)
    code = cli.main(_sweep_args(tiny_model, tmp_path))
    err = capsys.readouterr().err
    assert code == 128 + signal.SIGTERM, err
    assert "Exception ignored" not in err and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "terminated (SIGTERM): interrupted after 0 of 1 probes; rerun" in lines[0], err
    assert count[0] >= min(calls or {1})  # the signal was sent
    assert not list((tmp_path / "runs").glob("*/*/probes/mixed/stage.json"))  # it stopped before the end
    assert signal.getsignal(signal.SIGTERM) == before  # in-process callers get their handler back


def test_sigterm_after_the_last_safe_point_still_ends_with_143(monkeypatch, capsys):
    """A command that finishes after the signal arrived (no check after it) is still reported as terminated."""
    signals = [True]

    def finishes_anyway(args):
        if signals.pop():
            _finalise_with_signal()
        return 0

    monkeypatch.setitem(cli.COMMANDS, "models", ("list", None, finishes_anyway))
    assert cli.main(["models"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "interp-bayes: terminated (SIGTERM): interrupted\n"
    signals.append(False)
    assert cli.main(["models"]) == 0  # the request is forgotten once the command has ended


def test_sigterms_sent_from_outside_during_collection_end_the_process(tiny_model, tmp_path):
    """A real process: a sweep collecting many prompts gets SIGTERM every 20 ms until it ends. It stops at once,
    with one line and no traceback, however many signals arrive while it unwinds."""
    prompts = tmp_path / "many.jsonl"
    prompts.write_text("".join(f'{{"text": "The number {i} is followed by", "domain": "d{i % 4}"}}\n'
                               for i in range(3000)))
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text(yaml.safe_dump(PROBE))
    cmd = [sys.executable, "-m", "interp_bayes.cli", "sweep", "--model", str(tiny_model), "--out",
           str(tmp_path / "runs"), "--prompts", str(prompts), "--probes", str(recipe)]
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1]), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    line = ""
    while "collecting" not in line:  # the sweep prints this line as the collection starts
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, proc.communicate()
    sent = 0
    while proc.poll() is None and sent < 500:
        proc.send_signal(signal.SIGTERM)
        sent += 1
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    # 143: the sweep's own exit; -15: a signal that came after it had put the default handler back (a shell
    # reports both as 143)
    assert proc.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), err
    assert sent < 500 and "Traceback" not in err and "Exception ignored" not in err, err
    assert len([x for x in err.splitlines() if "terminated (SIGTERM)" in x]) <= 1, err
    assert not list((tmp_path / "runs").glob("*/*/probes/mixed/stage.json"))  # it did not run to the end


def test_a_stop_is_honoured_while_waiting_for_a_stage_lock(tmp_path):
    """A sweep waiting for another process's stage stops when asked, instead of waiting for it to finish."""
    import threading

    from interp_bayes.core.stop import Stopped, stop_on_signal
    from interp_bayes.core.store import stage_lock

    with stage_lock(tmp_path, "probe-x"), stop_on_signal():  # the holder: another open of the lock file
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        t = time.monotonic()
        with pytest.raises(Stopped):
            with stage_lock(tmp_path, "probe-x"):
                pass
        timer.join()
    assert time.monotonic() - t < 5


def test_a_stop_is_honoured_between_batches_of_a_sequential_null():
    """Nulls and bootstraps are drawn in batches by stats.sequential; a stop asked while one is drawn ends it at the
    next batch instead of at the cap (a decoding stage once ran on for a minute after SIGTERM)."""
    import numpy as np

    from interp_bayes.core.stop import Stopped, stop_on_signal
    from interp_bayes.stats.sequential import sequential_test

    batches = []

    def draw(b):
        batches.append(b)
        if len(batches) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return np.random.default_rng(len(batches)).normal(size=b)

    with stop_on_signal(), pytest.raises(Stopped):
        sequential_test(draw, 1.645, cap=100_000)  # at p near alpha: undecided for many batches
    assert len(batches) == 2


def test_calls_registered_at_safe_points_run_at_each_check_until_the_block_ends():
    from interp_bayes.core.stop import at_safe_points, check_stop

    calls = []
    with at_safe_points(lambda: calls.append(1)):
        check_stop()
        check_stop()
    check_stop()
    assert calls == [1, 1]
