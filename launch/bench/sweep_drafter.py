"""Cache drafter settings for the gated regime: train and evaluate a gate per setting.

    python launch/bench/sweep_drafter.py dev.jsonl.gz --tokenizer qwen3 \
        --grid max_spec_factor=1,2,4 [--grid min_token_prob=0.1,0.05] [-- extra hvd train flags]

For every combination of the ``--grid`` values (DrafterConfig fields, e.g.
max_spec_factor, max_spec_offset, min_token_prob, max_spec_tokens, or cache_siblings: the
tree-draft nodes a cache row adds to its chain) it runs, in a work
folder: ``hvd train TRACES --split-by task --test-fraction 0.2 --max-spec-factor ...``
(the gate is retrained and recalibrated for the setting: the verify shape and EAGLE3
curve are hvd train's defaults unless given after ``--``) and ``hvd eval --held-out``,
then prints per source, on the held-out tasks: hvd, the best score rule, cache_only,
eagle3_only, the choose-one oracle and (topk > 1) the tree oracle, cycles per 1,000 tokens,
and the ratios of hvd to the oracles. ``--json PATH`` writes every figure. Takes about 1.5
minutes per setting on 2 cores for all of ../shared/data.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

SOURCES = ("tau-bench", "swe-agent", "alpaca_eval")


def _grid(text: str) -> tuple[str, list[str]]:
    name, sep, values = text.partition("=")
    if not sep or not values:
        raise argparse.ArgumentTypeError(f"expected FIELD=V1,V2,..., got {text!r}")
    return name.strip(), [v.strip() for v in values.split(",") if v.strip()]


def _hvd(args: list[str], log: str) -> None:
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", "sglang_hvd.cli.main", *args], stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"hvd {args[0]} failed (exit {done.returncode}); see {log}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", help="token trace files (hvd import)")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="the tokenizer of the traces (a folder, or qwen3: hvd train resolves it)")
    p.add_argument("--grid", type=_grid, action="append", required=True, metavar="FIELD=V1,V2",
                   help="a DrafterConfig field (or cache_siblings) and its values (repeat for more fields)")
    p.add_argument("--work", default="sweep-drafter", metavar="DIR",
                   help="folder for gates and logs (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    names = [name for name, _ in args.grid]
    results = []
    for values in itertools.product(*[vals for _, vals in args.grid]):
        setting = dict(zip(names, values))
        tag = "_".join(f"{k}{v}" for k, v in setting.items())
        gate, flags = os.path.join(args.work, f"gate_{tag}"), []
        for k, v in setting.items():
            flags += [f"--{k.replace('_', '-')}", v]
        start = time.perf_counter()
        _hvd(["train", *args.traces, "--tokenizer", args.tokenizer, "-o", gate, "--split-by", "task", "--test-fraction",
              "0.2", *flags, *extra], os.path.join(args.work, f"train_{tag}.log"))
        out = os.path.join(args.work, f"eval_{tag}.json")
        _hvd(["eval", *args.traces, "--gate", gate, "--held-out", "--json", out],
             os.path.join(args.work, f"eval_{tag}.log"))
        with open(out) as f:
            ev = json.load(f)
        row = {"setting": setting, "seconds": time.perf_counter() - start, "threshold": ev["threshold"],
               "eagle_reserve": ev["eagle_reserve"], "cache_siblings": ev["cache_siblings"], "sources": {}}
        for src in (*SOURCES, "overall"):
            part = ev["overall"] if src == "overall" else ev["sources"].get(src)
            if part is None:
                continue
            pol = {k: v["cycles_per_1k"] for k, v in part["policies"].items()}
            rules = [v for k, v in pol.items() if k.startswith("rule")]
            row["sources"][src] = {"hvd": pol["hvd"], "best_rule": min(rules) if rules else None,
                                   "cache_only": pol["cache_only"], "eagle3_only": pol["eagle3_only"],
                                   "oracle": pol["oracle"], "hvd_over_oracle": pol["hvd"] / pol["oracle"],
                                   "tree_oracle": pol.get("tree_oracle", pol["oracle"])}
        results.append(row)
        print(f"{tag}: done in {row['seconds']:.0f} s", file=sys.stderr)
    print("held-out tasks, verify cycles per 1k tokens (hvd / rule / cache_only / eagle3_only / oracle / tree oracle)")
    for row in results:
        label = ", ".join(f"{k}={v}" for k, v in row["setting"].items())
        print(f"\n{label} (threshold {row['threshold']:g}, EAGLE3 reserve {row['eagle_reserve']}, "
              f"cache siblings {row['cache_siblings']})")
        for src, r in row["sources"].items():
            print(f"  {src:12s} {r['hvd']:7.1f} {r['best_rule']:7.1f} {r['cache_only']:7.1f} {r['eagle3_only']:7.1f} "
                  f"{r['oracle']:7.1f} {r['tree_oracle']:7.1f}   hvd/oracle {r['hvd_over_oracle']:.3f}, "
                  f"hvd/tree oracle {r['hvd'] / r['tree_oracle']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
