"""synth-config: editing a growing JSON service config, re-emitted in full every turn.

Each turn changes one value or adds one route, and the assistant prints the whole
document again: long runs of tokens repeat from its previous answer (dozens of tokens a
cache draft can win) and break exactly at the edited value.
"""

from __future__ import annotations

import json
import random
from typing import Any

from .common import assistant

SOURCE = "synth-config"

SERVICES = ["users", "orders", "billing", "search", "inventory", "auth", "reports", "notifications", "media", "audit"]
METHODS = ["GET", "POST", "PUT", "DELETE"]


def _route(rng: random.Random, service: str) -> dict[str, Any]:
    return {
        "path": f"/api/v{rng.randint(1, 3)}/{service}",
        "service": service,
        "methods": sorted(rng.sample(METHODS, rng.randint(1, 3))),
        "timeout_ms": rng.choice([500, 1000, 2000, 3000, 5000]),
        "retries": rng.randint(0, 3),
        "auth": rng.choice([True, False]),
    }


def _edit(rng: random.Random, doc: dict[str, Any]) -> str:
    """Apply one edit in place; return the user's request for it."""
    routes = doc["routes"]
    unused = [s for s in SERVICES if s not in {r["service"] for r in routes}]
    edits = ["timeout", "retries", "auth", "rate"]
    kind = rng.choice(["add", *edits] if unused else edits)
    if kind == "add":
        route = _route(rng, rng.choice(unused))
        routes.append(route)
        return (f"Add a route for the {route['service']} service at {route['path']} "
                f"({', '.join(route['methods'])}), timeout {route['timeout_ms']} ms.")
    route = rng.choice(routes)
    if kind == "timeout":
        route["timeout_ms"] = rng.choice([t for t in (250, 750, 1500, 2500, 4000, 8000) if t != route["timeout_ms"]])
        return f"Set the timeout of {route['path']} to {route['timeout_ms']} ms."
    if kind == "retries":
        route["retries"] = (route["retries"] + rng.randint(1, 3)) % 5
        return f"Change retries for the {route['service']} route to {route['retries']}."
    if kind == "auth":
        route["auth"] = not route["auth"]
        return f"{'Require' if route['auth'] else 'Drop'} auth on {route['path']}."
    doc["rate_limit"]["requests_per_minute"] = rng.choice([60, 120, 300, 600, 1200, 2400])
    return f"Raise the global rate limit to {doc['rate_limit']['requests_per_minute']} requests per minute."


def session(rng: random.Random, index: int) -> dict[str, Any]:
    name = f"{rng.choice(['edge', 'api', 'mesh', 'core'])}-gateway-{rng.randint(1, 9)}"
    doc: dict[str, Any] = {
        "name": name,
        "listen": {"host": "0.0.0.0", "port": rng.choice([8080, 8443, 9000])},
        "rate_limit": {"requests_per_minute": rng.choice([60, 120, 600]), "burst": rng.choice([10, 20, 50])},
        "routes": [_route(rng, s) for s in rng.sample(SERVICES, 2)],
    }
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You maintain JSON configuration files. Reply with the complete updated file "
                                      "in a ```json block, then one sentence on what changed."},
        {"role": "user", "content": f"Here is our gateway config:\n```json\n{json.dumps(doc, indent=2)}\n```\n"
                                    "I'll ask for some changes."},
        assistant("Got it. What would you like to change?"),
    ]
    for _ in range(rng.randint(3, 8)):
        request = _edit(rng, doc)
        messages.append({"role": "user", "content": request})
        updated = request[0].lower() + request[1:]
        messages.append(assistant(f"```json\n{json.dumps(doc, indent=2)}\n```\nUpdated: {updated}"))
    return {"id": f"{SOURCE}/{index:04d}", "source": SOURCE, "model": "synthetic", "license": "Apache-2.0",
            "messages": messages}
