"""Benchmark-only adapter: arctic-inference's SuffixDecodingCache behind our Drafter protocol.

Lets bench_drafter.py run the reference SuffixDecoding implementation through the same
replay engine, side by side with ours. Needs ``arctic-inference`` installed (sdist-only,
builds with torch; see launch/bench/README.md). Not part of the package.
"""

from __future__ import annotations

import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

from sglang_hvd.drafter.protocol import EMPTY_DRAFT, Draft, DrafterConfig


class ArcticDrafter:
    name = "arctic-inference"

    def __init__(self, config: DrafterConfig):
        self.config = config
        self.reset()

    def reset(self):
        self.cache = SuffixDecodingCache(max_tree_depth=self.config.max_depth, max_cached_requests=-1)
        self.ctx: dict[str, list[int]] = {}

    def start_request(self, req_id, prompt_ids):
        # a writable copy: nanobind refuses read-only arrays
        self.cache.start_request(req_id, np.array(prompt_ids, dtype=np.int32))
        self.ctx[req_id] = list(map(int, prompt_ids))

    def append(self, req_id, token_ids):
        tokens = np.array(token_ids, dtype=np.int32)
        if len(tokens):
            self.cache.add_active_response(req_id, tokens)
            self.ctx[req_id] += tokens.tolist()

    def speculate(self, req_id):
        c = self.config
        tail = np.asarray(self.ctx[req_id][-c.max_depth :], dtype=np.int32)
        # max_spec_tokens must be passed: 0.3.0's default (None) hits a missing attribute.
        d = self.cache.speculate(req_id, tail, max_spec_tokens=c.max_spec_tokens, max_spec_factor=c.max_spec_factor,
                                 max_spec_offset=c.max_spec_offset, min_token_prob=c.min_token_prob)
        if not d.token_ids:
            return EMPTY_DRAFT
        return Draft(tokens=tuple(d.token_ids), probs=tuple(d.probs), score=float(d.score), match_len=d.match_len)

    def speculate_batch(self, req_ids):
        return [self.speculate(r) for r in req_ids]

    def finish_request(self, req_id):
        self.cache.stop_request(req_id)
        del self.ctx[req_id]

    def context(self, req_id):
        return np.asarray(self.ctx[req_id], dtype=np.int32)

    def memory_stats(self):
        return {"bytes_per_token": float("nan")}
