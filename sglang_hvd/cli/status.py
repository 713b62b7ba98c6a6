"""``hvd status URL...``: the HVD figures and the gate of running servers, per DP rank and in total."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request

from ..errors import HvdInputError
from ..jsonl import write_json
from ..report import format_table
from ..serving.status import fleet_status
from .common import add_examples, add_json_flag, cli_entry, seconds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd status",
        description=(
            "Reads /server_info of each HVD server given (the replicas behind a router, or one server with "
            "--dp-size N) and prints, per data-parallel rank: the gate it serves (digest, decision, threshold, "
            "EAGLE3 reserve, verify shape) and its figures (steps, cache pick rate, mean accepted tokens of cache "
            "and EAGLE3 rows, CPU per step, errors); then the totals, rates recomputed from the summed counts. "
            "Exit status 1 when the ranks do not all serve the same gate and settings, or a server runs "
            "without HVD (after a gate roll-out, every replica should show one digest)."
        ),
    )
    p.add_argument("servers", nargs="+", metavar="URL", help="server base URL, e.g. http://10.0.0.5:30000")
    p.add_argument("--timeout", type=seconds, default=10.0, metavar="SECONDS",
                   help="per request (default: %(default)s)")
    add_json_flag(p)
    add_examples(
        p,
        "hvd status http://127.0.0.1:30000",
        "hvd status http://10.0.0.5:30000 http://10.0.0.6:30000 --json fleet.json",
    )
    return p


def server_info(url: str, timeout_s: float) -> dict:
    if not url.startswith(("http://", "https://")):
        raise HvdInputError(f"{url!r} is not a server URL: give http://HOST:PORT")
    target = url.rstrip("/") + "/server_info"
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise HvdInputError(f"{target}: HTTP {e.code}; is this an SGLang server?") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
        raise HvdInputError(f"{target}: unreachable ({getattr(e, 'reason', e)}); "
                            "check the URL and that the server is up") from None
    except json.JSONDecodeError:
        raise HvdInputError(f"{target}: the answer is not JSON; is this an SGLang server?") from None


def update_gate(url: str, gate_dir: str, timeout_s: float = 300.0) -> tuple[bool, str]:
    """``POST URL/hvd/update_gate`` (a hot gate swap, patches/gate_endpoint.py): (swapped on
    every rank, the server's one-line answer). Raises HvdInputError when the server
    cannot be reached or has no such endpoint."""
    target = url.rstrip("/") + "/hvd/update_gate"
    req = urllib.request.Request(target, data=json.dumps({"gate_path": gate_dir}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read())
        except ValueError:
            body = None
        if e.code == 404 or not isinstance(body, dict):
            raise HvdInputError(f"{target}: HTTP {e.code}; is this an HVD server (sglang_hvd.launch_server, "
                                "or SGLANG_HVD_ENABLE=1)?") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
        raise HvdInputError(f"{target}: unreachable ({getattr(e, 'reason', e)}); "
                            "check the URL and that the server is up") from None
    except json.JSONDecodeError:
        raise HvdInputError(f"{target}: the answer is not JSON; is this an HVD server?") from None
    return bool(body.get("success")), str(body.get("message", ""))


@cli_entry("status", build_parser)
def main(args: argparse.Namespace) -> int:
    status = fleet_status([(url, server_info(url, args.timeout)) for url in args.servers])
    header = ["server", "DP rank", "gate digest", "decision", "threshold", "shape", "steps", "cache pick",
              "cache accept", "EAGLE3 accept", "CPU us/step", "gate errors", "step errors"]

    def row(server, rank, h):
        return (server, rank, h.get("gate_digest", "-"), h.get("decision", "-"), h.get("gate_threshold", "-"),
                h.get("verify_shape", "-"), h.get("steps", 0), f"{100 * float(h.get('cache_pick_rate', 0)):.1f}%",
                float(h.get("cache_mean_accept", 0)), float(h.get("eagle3_mean_accept", 0)),
                float(h.get("cpu_us_per_step", 0)), h.get("gate_errors", 0), h.get("step_errors", 0))

    rows = [row(r.server, r.dp_rank, r.hvd) for r in status.ranks]
    if len(rows) > 1:
        t = status.totals
        rows.append(row(f"total ({t['servers']} servers)", f"{t['ranks']} ranks", {**t, "gate_digest": ""}))
    print(format_table(header, rows))
    for server in status.servers_without_hvd:
        print(f"{server}: no HVD worker reports (HVD off, or a plain SGLang server)")
    for d in status.disagreements:
        print(f"not one gate: {d}")
    if status.ranks and status.consistent:
        print(f"one gate: digest {status.ranks[0].hvd.get('gate_digest')} on {len(status.ranks)} rank(s)")
    for r in status.ranks:
        for bucket, c in (r.hvd.get("calibration") or {}).items():
            print(f"calibration, {r.server} rank {r.dp_rank}, {bucket}: {c['labels']:,} drafts labelled, predicted "
                  f"{c['predicted']:.2f} against realized {c['realized']:.2f} tokens; error served "
                  f"{c['served_error']:.2f}, gate alone {c['gate_error']:.2f}; {c['bins_acting']} bins acting")
    if args.json:
        write_json(args.json, status.to_json())
    return 0 if status.consistent else 1
