"""A deliberately naive drafter: the SuffixDecoding semantics by brute-force scanning.

Test-only. No index, no pruning: for every pattern length it scans every document for
occurrences, then walks the most frequent continuation (ties: most recently appended),
counting over the newest ``max_occurrences`` occurrences (by stamp); the one-token pattern,
when its set is not the two-token pattern's, counts its first token over all of them.
Patterns of two tokens and more only count occurrences that end where one of the newest
``max_scan`` (at least ``max_occurrences``) occurrences of the context's last two tokens ends.
The registered drafters must return exactly what this returns.
"""

from __future__ import annotations

from collections import OrderedDict

from sglang_hvd.drafter.protocol import (
    EMPTY_DRAFT,
    EMPTY_TREE,
    GLOBAL_TREE,
    LOCAL_TREE,
    Draft,
    DrafterConfig,
    DraftTree,
)


class NaiveDrafter:
    name = "naive"

    def __init__(self, config: DrafterConfig):
        self.config = config
        self.reset()

    def reset(self):
        self.clock = 0
        self.local = {}  # req_id -> list[(token, stamp)]
        self.responses = OrderedDict()  # req_id -> list[(token, stamp)], in start order
        self.finished = []  # finished req_ids, oldest first

    def _stamp(self, tokens):
        out = [(int(t), self.clock + i) for i, t in enumerate(tokens)]
        self.clock += len(tokens)
        return out

    def start_request(self, req_id, prompt_ids):
        if req_id in self.responses:
            del self.responses[req_id]
            self.finished.remove(req_id)
        self.local[req_id] = self._stamp(prompt_ids)
        self.responses[req_id] = []

    def append(self, req_id, token_ids):
        stamped = self._stamp(token_ids)
        self.local[req_id] += stamped
        self.responses[req_id] += stamped
        self._evict()

    def finish_request(self, req_id):
        del self.local[req_id]
        self.finished.append(req_id)
        self._evict()

    def _evict(self):
        while sum(map(len, self.responses.values())) > self.config.global_max_tokens and self.finished:
            del self.responses[self.finished.pop(0)]

    def context(self, req_id):
        return [t for t, _ in self.local[req_id]]

    def speculate(self, req_id):
        ctx = self.context(req_id)[-self.config.max_depth :]
        own = self._best([self.local[req_id]], ctx, LOCAL_TREE)
        shared = self._best(list(self.responses.values()), ctx, GLOBAL_TREE)
        return own if own.score >= shared.score else shared

    def _occurrences(self, docs, ctx):
        """(p, occurrences of the context's last p tokens, alone) for p = 1, 2, ... while any."""
        scanned = None  # the newest max_scan ends of the context's last two tokens
        for p in range(1, len(ctx)):
            pattern = ctx[-p:]
            occ = [(d, i) for d, doc in enumerate(docs) for i in range(p - 1, len(doc))
                   if [t for t, _ in doc[i - p + 1 : i + 1]] == pattern]
            if p == 2:
                scanned = set(self._newest(docs, occ, max(self.config.max_scan, self.config.max_occurrences)))
            if p >= 2:
                occ = [o for o in occ if o in scanned]
            if not occ:
                return
            yield p, occ, p == 1 and not all(i >= 1 and docs[d][i - 1][0] == ctx[-2] for d, i in occ)

    def speculate_tree(self, req_id, max_nodes, like=None):
        ctx = self.context(req_id)[-self.config.max_depth :]
        if like is not None and like.tokens:  # only the set of that chain's tree and match length
            docs = [self.local[req_id]] if like.tree == LOCAL_TREE else list(self.responses.values())
            return self._best_tree(docs, ctx, like.tree, max_nodes, only_len=like.match_len)
        own = self._best_tree([self.local[req_id]], ctx, LOCAL_TREE, max_nodes)
        shared = self._best_tree(list(self.responses.values()), ctx, GLOBAL_TREE, max_nodes)
        return own if own.score >= shared.score else shared

    def _best_tree(self, docs, ctx, tree, max_nodes, only_len=0):
        """Lengths whose occurrence sets are equal (and length 1 with length 2 when every
        occurrence of the last token follows the one before it) share one tree, grown with
        the largest of their budgets (ties: the longer length); its match is the longest of
        them whose budget admits the tree's depth. The tree: every node of the continuation
        trie within that budget and the probability floor, sorted by (-prob, depth, -newest
        stamp), the first max_nodes."""
        best = EMPTY_TREE
        k = self.config.max_occurrences
        budget = self.config.budget
        groups = []  # [lengths, occurrences, alone]
        for p, occ, alone in self._occurrences(docs, ctx):
            if groups and (set(groups[-1][1]) == set(occ) or (p == 2 and not groups[-1][2])):
                groups[-1][0].append(p)
                groups[-1][1] = occ
            else:
                groups.append([[p], occ, alone])
        for lengths, occ, alone in groups:
            if only_len and only_len not in lengths:
                continue
            p = max(lengths, key=lambda q: (budget(q), q))
            limit = budget(p)
            found = []

            def expand(cur, path, prob, depth):
                if depth > limit:
                    return
                children = {}
                for d, i in cur:
                    if i + 1 < len(docs[d]):
                        children.setdefault(docs[d][i + 1][0], []).append((d, i + 1))
                for tok, hits in children.items():
                    child = prob * (len(hits) / len(cur))
                    if child < self.config.min_token_prob:
                        continue
                    newest = max(docs[d][i][1] for d, i in hits)
                    found.append(((-child, depth, -newest), path + (tok,), child, len(hits)))
                    if depth < limit:
                        expand(self._newest(docs, hits, k), path + (tok,), child, depth + 1)

            expand(occ if alone else self._newest(docs, occ, k), (), 1.0, 1)
            chosen = sorted(found, key=lambda f: f[0])[:max_nodes]
            where = {f[1]: n for n, f in enumerate(chosen)}
            score = float(sum(f[2] for f in chosen))
            if chosen and score >= best.score:
                depth = max(len(f[1]) for f in chosen)
                best = DraftTree(tokens=tuple(f[1][-1] for f in chosen),
                                 parents=tuple(where.get(f[1][:-1], -1) for f in chosen),
                                 probs=tuple(f[2] for f in chosen), child_counts=tuple(f[3] for f in chosen),
                                 score=score, match_len=max(q for q in lengths if budget(q) >= depth),
                                 match_count=len(occ) if alone else min(len(occ), k), tree=tree)
        return best

    def _best(self, docs, ctx, tree):
        best = EMPTY_DRAFT
        for p, occ, alone in self._occurrences(docs, ctx):
            k = self.config.max_occurrences
            cur = occ if alone else self._newest(docs, occ, k)
            tokens, probs, counts, prob = [], [], [], 1.0
            while len(tokens) < self.config.budget(p):
                if tokens:
                    cur = self._newest(docs, cur, k)
                children = {}
                for d, i in cur:
                    if i + 1 < len(docs[d]):
                        tok, stamp = docs[d][i + 1]
                        n, last = children.get(tok, (0, -1))
                        children[tok] = (n + 1, max(last, stamp))
                if not children:
                    break
                tok = max(children, key=lambda t: children[t])
                prob *= children[tok][0] / len(cur)
                if prob < self.config.min_token_prob:
                    break
                tokens.append(tok)
                probs.append(prob)
                counts.append(children[tok][0])
                cur = [(d, i + 1) for d, i in cur if i + 1 < len(docs[d]) and docs[d][i + 1][0] == tok]
            score = float(sum(probs))
            if tokens and score >= best.score:
                best = Draft(tokens=tuple(tokens), probs=tuple(probs), child_counts=tuple(counts), score=score,
                             match_len=p, match_count=len(occ) if alone else min(len(occ), k), tree=tree)
        return best

    @staticmethod
    def _newest(docs, occ, k):
        return sorted(occ, key=lambda o: docs[o[0]][o[1]][1])[-k:] if len(occ) > k else occ
