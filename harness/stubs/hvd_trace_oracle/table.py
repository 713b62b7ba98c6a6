"""The trace oracle's tables: prefix hashes, the recorded next token of each prefix, and
the EAGLE3 stand-in's seeded error model. numpy only (no torch, no sglang), so the
runner, the tests and the server processes share it.

Prefix hash: ``h(empty) = SEED``, ``h(s + [t]) = h(s) * B + (t + 1)`` in uint64
arithmetic (mod 2**64, B odd). A segment of L tokens after a known parent hash is hashed
in one vectorised pass (``h_k = B**k * (P + sum_j (t_j + 1) * B**-j)``), so a 30k-token
prefill costs a few numpy calls. A hash is carried between forwards in 4 float32 values
of 16 bits each (exact), in the KV pool of the target and the hidden states.

``OracleTable``: sorted uint64 keys (hashes of prompt + output[:k]) and int32 values
(output[k]); ``next_tokens(hashes)`` looks a batch up (misses get ``FILLER``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

B = np.uint64(0x9E3779B97F4A7C15)
B_INV = np.uint64(pow(0x9E3779B97F4A7C15, -1, 1 << 64))
SEED = np.uint64(0x2545F4914F6CDD1D)
FILLER = 0  # the next token of every prefix the traces do not hold
LOGIT_ON, LOGIT_OFF = 0.0, -30.0  # the target's logits: its next token, every other token
RANK_LOGITS = (0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0)  # the stand-in draft's, by rank
WRONG_TOKEN_SPAN = 151643  # the stand-in's wrong proposals stay among Qwen3's ordinary tokens
HASH_FLOATS = 4  # a hash as 4 x 16-bit float32 values
_MASK16 = np.uint64(0xFFFF)


class _Powers:
    """B**k and B**-k for k = 0..n, grown on demand."""

    def __init__(self):
        self.pw = np.ones(1, dtype=np.uint64)
        self.ipw = np.ones(1, dtype=np.uint64)

    def upto(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if n >= len(self.pw):
            size = max(n + 1, 2 * len(self.pw))
            with np.errstate(over="ignore"):
                self.pw = np.cumprod(np.concatenate([[np.uint64(1)], np.full(size - 1, B, dtype=np.uint64)]),
                                     dtype=np.uint64)
                self.ipw = np.cumprod(np.concatenate([[np.uint64(1)], np.full(size - 1, B_INV, dtype=np.uint64)]),
                                      dtype=np.uint64)
        return self.pw[: n + 1], self.ipw[: n + 1]


_POWERS = _Powers()


def roll(parent: np.ndarray | np.uint64, tokens: np.ndarray) -> np.ndarray:
    """One step per row: ``parent * B + token + 1`` (parent and tokens of the same shape)."""
    with np.errstate(over="ignore"):
        return np.asarray(parent, dtype=np.uint64) * B + (np.asarray(tokens).astype(np.uint64) + np.uint64(1))


def chain(parent: np.uint64, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[L]`` hashes of parent-prefix + tokens[:1], + tokens[:2], ... (vectorised)."""
    t = np.asarray(tokens, dtype=np.int64)
    n = len(t)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    pw, ipw = _POWERS.upto(n)
    with np.errstate(over="ignore"):
        s = np.cumsum((t.astype(np.uint64) + np.uint64(1)) * ipw[1:], dtype=np.uint64)
        return pw[1:] * (np.uint64(parent) + s)


def prefix_hashes(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[len + 1]``: the hash of every prefix of ``tokens``, the empty one first."""
    return np.concatenate([[SEED], chain(SEED, tokens)]).astype(np.uint64)


def encode(hashes: np.ndarray) -> np.ndarray:
    """``[n, 4]`` float32, 16 bits per value, most significant first."""
    h = np.asarray(hashes, dtype=np.uint64).reshape(-1, 1)
    shifts = np.array([48, 32, 16, 0], dtype=np.uint64)
    return ((h >> shifts) & _MASK16).astype(np.float32)


def decode(values: np.ndarray) -> np.ndarray:
    """Inverse of ``encode``: ``[n, 4]`` float32 -> ``[n]`` uint64."""
    v = np.rint(np.asarray(values, dtype=np.float64)).astype(np.uint64).reshape(-1, HASH_FLOATS)
    return (v[:, 0] << np.uint64(48)) | (v[:, 1] << np.uint64(32)) | (v[:, 2] << np.uint64(16)) | v[:, 3]


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread uint64 from each uint64."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform(hashes: np.ndarray, salt: int) -> np.ndarray:
    """A deterministic U[0, 1) per (hash, salt)."""
    with np.errstate(over="ignore"):
        z = mix(np.asarray(hashes, dtype=np.uint64) ^ mix(np.full(1, salt, dtype=np.uint64)))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def draft_blocks(custom_mask: np.ndarray, seq_lens: Sequence[int], n: int) -> list[np.ndarray]:
    """Each request's [n, n] draft block of a verify's tree mask (node j sees node k), in
    either of SGLang's layouts: QLEN_ONLY (n x n per request) or FULL_MASK (n rows of
    seq_len + n per request, the draft columns last)."""
    m = np.asarray(custom_mask).astype(bool).reshape(-1)
    bs = len(seq_lens)
    if m.size == bs * n * n:
        return [m[b * n * n:(b + 1) * n * n].reshape(n, n) for b in range(bs)]
    if m.size != sum(n * (int(s) + n) for s in seq_lens):
        raise ValueError(f"a tree mask of {m.size} values fits neither layout for {bs} rows of {n} nodes")
    blocks, start = [], 0
    for b in range(bs):
        w = int(seq_lens[b]) + n
        blocks.append(m[start:start + n * w].reshape(n, w)[:, -n:])
        start += n * w
    return blocks


def tree_parents(block: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Per node of one verify row, its tree parent (-1: the root, or a node no draft
    reaches): the node it sees one position up."""
    n = len(pos)
    parent = np.full(n, -1, dtype=np.int64)
    for j in range(n):
        cand = np.nonzero(block[j] & (pos == pos[j] - 1))[0]
        cand = cand[cand != j]
        if len(cand):
            parent[j] = cand[0]
    return parent


def row_hashes(tokens: np.ndarray, pos: np.ndarray, block: np.ndarray, parent: np.uint64) -> np.ndarray:
    """Prefix hashes of one verify row's nodes: the root extends the committed prefix
    (hash ``parent``), every other node its tree parent; the tokens are ``tokens``."""
    tokens, pos = np.asarray(tokens, dtype=np.int64), np.asarray(pos, dtype=np.int64)
    parents = tree_parents(block, pos)
    depth = pos - pos.min()
    h = np.zeros(len(pos), dtype=np.uint64)
    base = np.nonzero(parents < 0)[0]  # the root, and unused nodes: one step from the committed prefix
    h[base] = roll(np.full(len(base), parent, dtype=np.uint64), tokens[base])
    for d in range(1, int(depth.max(initial=0)) + 1):
        at = np.nonzero((depth == d) & (parents >= 0))[0]
        h[at] = roll(h[parents[at]], tokens[at])
    return h


@dataclasses.dataclass(frozen=True, slots=True)
class BuildReport:
    requests: int  # records given
    kept: int  # records whose every next token the table reproduces
    dropped: tuple[str, ...]  # req_ids of records that contradict an earlier one (same prefix, other token)
    entries: int


class OracleTable:
    def __init__(self, keys: np.ndarray, values: np.ndarray):
        order = np.argsort(keys, kind="stable")
        self.keys = np.ascontiguousarray(keys[order], dtype=np.uint64)
        self.values = np.ascontiguousarray(values[order], dtype=np.int32)

    def __len__(self) -> int:
        return len(self.keys)

    def lookup(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(next token or FILLER, hit) per hash."""
        h = np.asarray(hashes, dtype=np.uint64).reshape(-1)
        if not len(self.keys):
            return np.full(len(h), FILLER, dtype=np.int64), np.zeros(len(h), dtype=bool)
        idx = np.minimum(np.searchsorted(self.keys, h), len(self.keys) - 1)
        hit = self.keys[idx] == h
        return np.where(hit, self.values[idx], FILLER).astype(np.int64), hit

    def next_tokens(self, hashes: np.ndarray) -> np.ndarray:
        return self.lookup(hashes)[0]

    def save(self, path: str) -> None:
        np.savez(path, keys=self.keys, values=self.values)

    @classmethod
    def load(cls, path: str) -> OracleTable:
        with np.load(path) as z:
            return cls(z["keys"], z["values"])

    @classmethod
    def build(cls, records: Iterable, eos_token_id: int | None = None) -> tuple[OracleTable, BuildReport]:
        """From trace records (``prompt_ids``, ``output_ids``, ``req_id``): for each,
        the hash of prompt + output[:k] -> output[k]. A record that needs another next
        token for a prefix an earlier record fixed is dropped whole (reported); the EOS
        after a record's last token is added where no record says otherwise."""
        table: dict[int, int] = {}
        ends: list[int] = []
        dropped, n = [], 0
        for r in records:
            n += 1
            prompt, out = np.asarray(r.prompt_ids), np.asarray(r.output_ids)
            if not len(out):
                continue
            hs = prefix_hashes(np.concatenate([prompt, out]))
            keys = hs[len(prompt): len(prompt) + len(out)].tolist()
            vals = out.tolist()
            if any(table.get(k, v) != v for k, v in zip(keys, vals)):
                dropped.append(r.req_id)
                continue
            table.update(zip(keys, vals))
            ends.append(int(hs[-1]))
        if eos_token_id is not None:
            for k in ends:
                table.setdefault(k, int(eos_token_id))
        keys = np.fromiter(table.keys(), dtype=np.uint64, count=len(table))
        values = np.fromiter(table.values(), dtype=np.int32, count=len(table))
        return cls(keys, values), BuildReport(n, n - len(dropped), tuple(dropped), len(table))


@dataclasses.dataclass(frozen=True, slots=True)
class DraftErrorModel:
    """The EAGLE3 stand-in's proposals at draft depth d (1-based) after a prefix hash.

    Its first choice is the recorded next token with probability ``accept_probs[d-1]``
    (the last entry for deeper steps), else a wrong token; when it is wrong, its second
    choice is the recorded token with probability ``runner_up_prob``. Every draw is a
    seeded function of (prefix hash, depth), so one prefix drafts the same at the same
    depth on every run. On a chain, tokens per verify at k draft nodes is then
    1 + sum_{d<=k} prod_{i<=d} accept_probs[i-1]: ``from_curve`` inverts that.
    """

    accept_probs: tuple[float, ...]
    runner_up_prob: float = 0.5
    seed: int = 0
    choices: int = 4  # proposals ranked per step (topk <= choices)

    @classmethod
    def from_curve(cls, tokens_at: Sequence[float], **kwargs) -> DraftErrorModel:
        """``tokens_at[k-1]``: tokens per verify of a k-node chain (k = 1, 2, ...)."""
        probs, survive, prev = [], 1.0, 1.0
        for t in tokens_at:
            reach = max(float(t) - prev, 0.0)  # P(accept >= d)
            probs.append(min(reach / survive, 1.0) if survive > 0 else 0.0)
            survive, prev = reach, float(t)
        return cls(tuple(probs), **kwargs)

    def to_json(self) -> dict:
        return {"accept_probs": list(self.accept_probs), "runner_up_prob": self.runner_up_prob, "seed": self.seed,
                "choices": self.choices}

    @classmethod
    def from_json(cls, d: dict) -> DraftErrorModel:
        return cls(tuple(float(p) for p in d["accept_probs"]), float(d["runner_up_prob"]), int(d["seed"]),
                   int(d.get("choices", 4)))

    def proposals(self, table: OracleTable, hashes: np.ndarray, depths: np.ndarray, vocab: int) -> np.ndarray:
        """``[n, choices]`` int64 ranked proposals for the prefixes ``hashes`` at ``depths``."""
        h = np.asarray(hashes, dtype=np.uint64)
        d = np.clip(np.asarray(depths, dtype=np.int64), 1, len(self.accept_probs))
        true, hit = table.lookup(h)
        key = h ^ (d.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93))
        p = np.asarray(self.accept_probs, dtype=np.float64)[d - 1]
        right = hit & (uniform(key, self.seed) < p)
        runner = hit & ~right & (uniform(key, self.seed + 1) < self.runner_up_prob)
        out = np.empty((len(h), self.choices), dtype=np.int64)
        span = max(vocab - 1, 1)
        for c in range(self.choices):  # wrong tokens: spread, never the recorded one
            w = (mix(key ^ np.uint64(self.seed * 7919 + c + 11)) % np.uint64(span)).astype(np.int64)
            out[:, c] = np.where(w >= true, w + 1, w) % vocab
        out[:, 0] = np.where(right, true, out[:, 0])
        if self.choices > 1:
            out[:, 1] = np.where(runner, true, out[:, 1])
        return out
