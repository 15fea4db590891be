"""``python -m interp_bayes.dynamics``: the same as ``interp-bayes dynamics``."""

import argparse

from .cli import add_dynamics_arguments, dynamics_main

parser = add_dynamics_arguments(argparse.ArgumentParser(prog="interp-bayes dynamics"))
raise SystemExit(dynamics_main(parser.parse_args()))
