"""``hvd eval --concurrency C,...``: every policy by fleet replay at each load, timed by a
step-time profile (replay/by_load.py), and what cost-aware HVD gains."""

from __future__ import annotations

import argparse

from ..errors import HvdInputError
from ..jsonl import write_json
from ..replay.by_load import COST_AWARE, LoadSettings, by_concurrency_json, parse_policy, policy_names, run_by_load
from ..replay.fleet import conversations_of
from ..report import format_table, progress
from ..step_profile import DEFAULT_PROFILE, ESTIMATES, EXTEND_EVERY_STEP, EXTEND_WHEN_DRAFTED, load_profile
from ..tiers import STATIC_TIERS, ladder, parse_tiers
from .common import int_list_in

MAX_CONCURRENCY = 100_000
REQUESTS = ("conversations", "turns")


def tiers_flag(text: str):
    try:
        return parse_tiers(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_load_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("by load (fleet replay timed by a step-time profile)",
                             "--profile, --tiers, --static-tiers, --extend and --requests need --concurrency")
    g.add_argument("--concurrency", type=int_list_in(1, MAX_CONCURRENCY), metavar="C,...",
                   help="instead of sequential replay, fleet replay at each concurrency (requests in flight) of: "
                        "greedy, eagle3@T, cache_only@T and hvd@T at each static tier, eagle3_adaptive (SGLang's "
                        "--speculative-adaptive rule) and hvd (cost-aware: the tier picked per step), or those "
                        "--policies names; prints tokens/s and time per 1k tokens under --profile beside cycles")
    g.add_argument("--profile", default=DEFAULT_PROFILE, metavar="P",
                   help=f"step-time profile: a profile JSON file (sglang_hvd/step_profile.py), or a shipped estimate "
                        f"({', '.join(ESTIMATES)}; default: %(default)s)")
    g.add_argument("--tiers", type=tiers_flag, metavar="T,...",
                   help="the tiers cost-aware hvd chooses from, off or TOPK-STEPS-NODES, none wider than the gate's "
                        "verify shape; one server serves tiers of its own topk only (default: off, the gate's shape "
                        "halved down to 2 nodes, the shape and, at topk > 1, the widest tree of each fewer step count, "
                        "e.g. off,4-1-2,4-1-4,4-1-5,4-2-8,4-2-16,4-3-16 for a 4-3-16 gate)")
    g.add_argument("--static-tiers", type=tiers_flag, metavar="T,...",
                   help=f"the tiers of the static policies eagle3@T, cache_only@T, hvd@T (default: those of "
                        f"{STATIC_TIERS} no wider than the gate, and hvd's --tiers)")
    g.add_argument("--extend", choices=(EXTEND_EVERY_STEP, EXTEND_WHEN_DRAFTED), default=EXTEND_EVERY_STEP,
                   help="when HVD's server pays EAGLE3's draft extend: every-step (SGLang's rule, and the HVD "
                        "server's default: at steps without an EAGLE3 draft too) or when-drafted (on drafting steps "
                        "only: a server with --hvd-skip-idle-extend; replay does not model the lower yield of a draft "
                        "made after skipped extends) (default: %(default)s)")
    g.add_argument("--requests", choices=REQUESTS, default=REQUESTS[0],
                   help="conversations: each conversation's turns in order, one after another (a conversation holds a "
                        "slot); turns: every turn its own request, in file order (fills a load higher than the number "
                        "of conversations; a turn may then start before the turn it follows has ended) "
                        "(default: %(default)s)")


def check_tiers(args: argparse.Namespace, shape) -> None:
    """Defaults filled in from the gate's ``shape``, then every tier checked against it."""
    if args.tiers is None:
        args.tiers = ladder(shape)
    if args.static_tiers is None:
        fits = [t for t in parse_tiers(STATIC_TIERS) if t.shape.nodes <= shape.nodes]
        args.static_tiers = tuple(dict.fromkeys(fits + [t for t in args.tiers if t.speculates]))
    for t in list(args.tiers) + list(args.static_tiers):
        if t.shape is not None and t.shape.nodes > shape.nodes:
            raise HvdInputError(f"tier {t.name} verifies {t.shape.nodes} tokens per row, more than the gate's "
                                f"{shape.describe()}; name tiers of at most {shape.nodes} nodes")


def check(args: argparse.Namespace, shape):
    """The load flags checked before any work: the tiers against the gate's shape, and the
    profile read. Returns the profile (None without --concurrency, where a load flag given
    would do nothing and is refused)."""
    if not args.concurrency:
        given = [flag for flag, unset in (("--profile", args.profile == DEFAULT_PROFILE),
                                          ("--tiers", args.tiers is None),
                                          ("--static-tiers", args.static_tiers is None),
                                          ("--extend", args.extend == EXTEND_EVERY_STEP),
                                          ("--requests", args.requests == REQUESTS[0])) if not unset]
        if given:
            one = len(given) == 1
            raise HvdInputError(f"{', '.join(given)} {'applies' if one else 'apply'} to fleet replay by load: add "
                                f"--concurrency C,... or leave {'it' if one else 'them'} out")
        return None
    check_tiers(args, shape)
    for name in getattr(args, "policies", None) or ():
        try:
            _, tier = parse_policy(name)
        except ValueError as e:
            raise HvdInputError(f"--policies: {e}") from None
        if tier is not None and tier.shape is not None and tier.shape.nodes > shape.nodes:
            raise HvdInputError(f"--policies: {name} verifies {tier.shape.nodes} tokens per row, more than the gate's "
                                f"{shape.describe()}")
    return load_profile(args.profile)


def run(args: argparse.Namespace, gate, model, profile, records, extra: dict) -> dict:
    static = args.static_tiers
    topks = sorted({t.shape.topk for t in args.tiers if t.speculates})
    if len(topks) > 1:
        print(f"note: --tiers mixes topk {', '.join(map(str, topks))}: no one server verifies at more than one topk "
              "(SGLang's EAGLE3 drafts at the topk it was started with); a what-if, not a servable set")
    convs = conversations_of(records) if args.requests == "conversations" else [[r] for r in records]
    top = max(args.concurrency)
    if top > len(convs):
        hint = " (--requests turns serves every turn as its own request)" if args.requests == "conversations" else ""
        print(f"note: concurrency {top} > {len(convs)} {args.requests}: at most {len(convs)} run at once{hint}")
    names = list(args.policies) if getattr(args, "policies", None) else policy_names(static)
    settings = LoadSettings(gate, model, profile, tuple(args.tiers), extend=args.extend)
    print(f"profile {profile.describe()}; cost-aware hvd chooses from {', '.join(t.name for t in args.tiers)}; "
          f"{len(records):,} requests as {len(convs):,} {args.requests}", flush=True)
    with progress(total=len(names) * len(args.concurrency), desc="by load", unit="run") as bar:
        runs = run_by_load(convs, names, args.concurrency, settings, on_run=lambda r: bar.update(1))
    out = {"by_concurrency": by_concurrency_json(runs), "profile": profile.to_json(),
           "tiers": [t.name for t in args.tiers], "static_tiers": [t.name for t in static], "extend": args.extend,
           "requests": args.requests, **extra}
    for c, level in out["by_concurrency"].items():
        print_level(int(c), level["policies"])
    return out


def best_other(policies: dict, families: tuple[str, ...]) -> tuple[str, float]:
    """The best tokens/s among policies whose name starts with none of ``families``."""
    others = {n: p["tokens_per_s"] for n, p in policies.items() if not n.startswith(families)}
    name = max(others, key=others.get)
    return name, others[name]


def print_level(c: int, policies: dict) -> None:
    greedy = policies["greedy"]["tokens_per_s"] if "greedy" in policies else float("nan")
    rows = []
    for name, p in policies.items():
        top = sorted(p["modes"].items(), key=lambda kv: -kv[1])[:3]
        rows.append((name, p["tokens_per_s"], p["time_per_1k"], p["cycles_per_1k"], p["tokens_per_s"] / greedy,
                     " ".join(f"{m} {100 * s:.0f}%" for m, s in top)))
    print(format_table(("policy", "tokens/s", "ms/1k", "cycles/1k", "x greedy", "steps by tier"), rows,
                       title=f"\nconcurrency {c}"))
    if COST_AWARE not in policies or all(n.startswith("hvd") for n in policies):
        return  # --policies left out cost-aware hvd, or every policy to compare it with
    hvd = policies[COST_AWARE]["tokens_per_s"]
    other, other_tps = best_other(policies, ("hvd",))
    static, static_tps = max(((n, p["tokens_per_s"]) for n, p in policies.items() if n.startswith("hvd@")),
                             key=lambda kv: kv[1], default=("-", float("nan")))
    ratios = [f"{hvd / other_tps:.3f}x the best other policy ({other})"]
    if "greedy" in policies:  # (--policies may leave it out)
        ratios.append(f"{hvd / greedy:.3f}x greedy")
    if static != "-":
        ratios.append(f"{hvd / static_tps:.3f}x the best static hvd ({static})")
    print(f"cost-aware hvd: {', '.join(ratios)}")


def write(path: str | None, out: dict) -> None:
    if path:
        write_json(path, out)
