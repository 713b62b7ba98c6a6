"""Power of the sampling-losslessness test (tests/sglang_cpu/test_e2e_sampling.py).

    python launch/bench/sampling_power.py [--draws 3000] [--alpha 1e-4] [--trials 300]

That test compares the 5-token outputs of an HVD server and of the non-speculative server
(DRAWS each, per prompt and sampling setting) with two-sample chi-square tests of
homogeneity on two statistics: the whole output (outputs seen fewer than 10 times pooled:
an omnibus test) and its number of cycle steps (how many of its tokens follow their
predecessor on the digit cycle, 0..5: what a verify biased towards or against the
draft, which proposes the cycle, changes). This script asks how large a difference they
find: outputs are drawn from the test model's shape at temperature 1 (a Markov chain over
ten digits: the next digit 0.73, the one after 0.22, the other eight 0.05 in all), and
from the same distribution with ``shift`` of probability moved onto the likeliest output
(the others scaled down), as a verify biased towards the draft would. Prints, per shift,
the share of trials each test rejects at ``alpha`` (the shift 0 row is the false-alarm
rate). Needs numpy and scipy (both in the sglang extra).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np

DIGITS, LENGTH = 10, 5


def homogeneity_pvalue(a: dict, b: dict, min_count: int = 10) -> tuple[float, int]:
    """p-value of the chi-square test that the counts ``a`` and ``b`` (output -> count) are
    draws of one distribution, and the number of categories used (outputs seen fewer than
    ``min_count`` times in both together pooled into one)."""
    from scipy.stats import chi2_contingency

    keys = sorted(set(a) | set(b))
    kept = [k for k in keys if a.get(k, 0) + b.get(k, 0) >= min_count]
    rows = [[a.get(k, 0) for k in kept], [b.get(k, 0) for k in kept]]
    rest = [sum(c.values()) - sum(r) for c, r in zip((a, b), rows)]
    if sum(rest) >= min_count:
        rows[0].append(rest[0])
        rows[1].append(rest[1])
    if len(rows[0]) < 2:
        return 1.0, len(rows[0])
    return float(chi2_contingency(rows, correction=False).pvalue), len(rows[0])


def cycle_steps(prev: int, output) -> int:
    """How many tokens of ``output`` follow their predecessor on the cycle (``prev``
    before the first), positions in the cycle given by ``cycle`` order 0..9."""
    steps = 0
    for t in output:
        steps += t == (prev + 1) % DIGITS
        prev = t
    return steps


def output_distribution() -> np.ndarray:
    """Probabilities of every 5-digit output after a prompt ending in digit 0."""
    step = np.full((DIGITS, DIGITS), 0.05 / 8)
    for i in range(DIGITS):
        step[i, (i + 1) % DIGITS], step[i, (i + 2) % DIGITS] = 0.73, 0.22
    probs = np.empty(DIGITS ** LENGTH)
    for n, seq in enumerate(itertools.product(range(DIGITS), repeat=LENGTH)):
        p, prev = 1.0, 0
        for t in seq:
            p, prev = p * step[prev, t], t
        probs[n] = p
    return probs / probs.sum()


def shifted(probs: np.ndarray, shift: float) -> np.ndarray:
    top = int(np.argmax(probs))
    out = probs * (1 - probs[top] - shift) / (1 - probs[top])
    out[top] = probs[top] + shift
    return out


def rejection_rates(probs: np.ndarray, other: np.ndarray, draws: int, alpha: float, trials: int,
                    seed: int) -> tuple[float, float]:
    """Share of trials rejected by the whole-output test and by the cycle-steps test."""
    rng = np.random.default_rng(seed)
    steps = np.array([cycle_steps(0, seq) for seq in itertools.product(range(DIGITS), repeat=LENGTH)])
    rejected = np.zeros(2)
    for _ in range(trials):
        a, b = (rng.multinomial(draws, p) for p in (probs, other))
        ca = {int(i): int(a[i]) for i in np.nonzero(a)[0]}
        cb = {int(i): int(b[i]) for i in np.nonzero(b)[0]}
        sa = {k: int(a[steps == k].sum()) for k in range(LENGTH + 1)}
        sb = {k: int(b[steps == k].sum()) for k in range(LENGTH + 1)}
        rejected += [homogeneity_pvalue(ca, cb)[0] <= alpha, homogeneity_pvalue(sa, sb)[0] <= alpha]
    return tuple(rejected / trials)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draws", type=int, default=3000, metavar="N",
                   help="outputs per server, prompt and setting (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=1e-4, metavar="A",
                   help="significance level per test (default: %(default)s)")
    p.add_argument("--trials", type=int, default=300, metavar="T",
                   help="simulated tests per shift (default: %(default)s)")
    p.add_argument("--shifts", default="0,0.02,0.03,0.04,0.05,0.06", metavar="S1,S2",
                   help="probability moved onto the likeliest output (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    args = p.parse_args(argv)
    if args.draws < 10 or args.trials < 1 or not 0 < args.alpha < 1:
        p.error("--draws must be >= 10, --trials >= 1 and --alpha in (0, 1)")
    try:
        shifts = [float(s) for s in args.shifts.split(",")]
    except ValueError:
        p.error(f"--shifts takes numbers separated by commas, got {args.shifts!r}")
    try:
        import scipy  # noqa: F401
    except ImportError:
        print("sampling_power.py needs scipy: pip install scipy (the sglang extra has it)", file=sys.stderr)
        return 2
    probs = output_distribution()
    print(f"likeliest output p = {probs.max():.3f}; {args.draws} draws per side, alpha {args.alpha:g}, "
          f"{args.trials} trials per shift")
    print("shift  likeliest  rejected: outputs  cycle steps")
    for shift in shifts:
        whole, steps = rejection_rates(probs, shifted(probs, shift), args.draws, args.alpha, args.trials, args.seed)
        print(f"{shift:5.3f}  {probs.max() + shift:9.3f}  {whole:17.3f}  {steps:11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
