"""The server's online profile refit: what one refit costs on the scheduler's thread.

    python launch/bench/bench_refit.py [--profile qwen3-8b-h200] [--window 2048] [--repeats 5]

A served window of decode steps as a loaded HVD server times them (batch 1-64, mostly
near the top; widths 1-16; EAGLE3 drafts of 0-3 steps; each part drawn from the profile
with +-10-15% noise), then ``step_timing.fit_profile`` over it, as ProfileRefiner runs it
every 512 steps between two decode steps: median and slowest wall time per refit, that
time spread over the 512 steps it comes every, and the fitted profile's step error on the
window (the noise sets its floor).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time

import numpy as np

from sglang_hvd.cli.common import positive_int
from sglang_hvd.errors import HvdInputError
from sglang_hvd.serving.step_timing import StepTiming, errors, fit_profile
from sglang_hvd.step_profile import DEFAULT_PROFILE, load_profile

REFIT_EVERY_STEPS = 512  # ProfileRefiner's default


def served_window(profile, steps: int, seed: int = 0) -> list[StepTiming]:
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        b = rng.randint(40, 64) if rng.random() < 0.8 else rng.randint(1, 64)
        n = rng.choice([1, 2, 4, 8, 16])
        ctx = b * rng.randint(500, 3000)
        s = rng.choice([0, 1, 2, 3])
        k = 4 if s else 1
        verify = profile.verify.ms(b, n, ctx) * rng.uniform(0.9, 1.15)
        draft = profile.eagle3.ms(b, s, k, ctx) * rng.uniform(0.9, 1.1) if s else math.nan
        extend = profile.eagle3.extend(b, ctx) * rng.uniform(0.9, 1.1)
        host = profile.hvd_cpu.ms(b) * rng.uniform(0.8, 1.3)
        out.append(StepTiming(b, n, ctx, verify, s, k, draft, extend, host))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help="the profile the steps are drawn from: a shipped estimate or a file (default: %(default)s)")
    p.add_argument("--window", type=positive_int, default=2048, help="steps in the window (default: %(default)s)")
    p.add_argument("--repeats", type=positive_int, default=5, help="refits timed (default: %(default)s)")
    args = p.parse_args(argv)
    if args.window < 16:
        p.error(f"--window must be >= 16 (a refit needs the steps ProfileRefiner keeps), got {args.window}")
    try:
        base = load_profile(args.profile)
    except HvdInputError as e:
        p.error(str(e))
    window = served_window(base, args.window)
    wall_ms = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        fitted = fit_profile(base, window, f"{base.name}+online")
        wall_ms.append((time.perf_counter() - t) * 1e3)
    distinct = len({t.batch * t.tokens_per_row for t in window})
    print(f"window: {len(window)} steps over {distinct} distinct B x N, drawn from {base.name}")
    print(f"one refit: median {np.median(wall_ms):.1f} ms, slowest {max(wall_ms):.1f} ms ({args.repeats} refits); "
          f"spread over the {REFIT_EVERY_STEPS} steps between refits: {np.median(wall_ms) / REFIT_EVERY_STEPS:.3f} ms "
          "a step")
    print(f"fitted step error on the window: {errors(fitted, window)['step']:.4f} "
          f"(the drawn profile's own: {errors(base, window)['step']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
