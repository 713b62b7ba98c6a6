"""The cache row's tree: the chain draft first, then siblings from the tree draft.

A tree draft grown best-first by count probability (DraftTree) spends nodes on siblings
where the chain was right, so on the dev traces it accepts no more than the chain on
average (README, tree drafts); it helps where the chain goes wrong early. The row tree
keeps the whole chain (up to ``max_nodes``) and spends the nodes left on the tree
draft's other nodes, in the tree's own order (best-first, parents first). Its first k
nodes are themselves a row tree for any k (a parent's index is below its children's),
and its first min(len(chain), k) nodes are the chain's: a decision that takes k <=
len(chain) nodes verifies exactly the chain.

Worked example (max_nodes 5): chain ``5 7 8``; tree tokens ``(5, 9, 7, 4, 8)``, parents
``(-1, -1, 0, 0, 2)`` (5 and 9 under the root, 7 and 4 under 5, 8 under 7). The tree's
5, 7, 8 lie on the chain; 9 and 4 do not: the row is tokens ``(5, 7, 8, 9, 4)``, parents
``(-1, 0, 1, -1, 0)``. Each node keeps its path probability: the chain's nodes the
chain's, the others the tree draft's (``RowTree.probs``; the gate's tree features).

``row_path`` is greedy verification of such a tree against a recorded output: the
indices of the nodes the output passes through, from the root down. A verify that
holds the row's first k nodes accepts the leading path indices below k
(``accepted_within``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from .protocol import Draft, DraftTree


@dataclasses.dataclass(frozen=True, slots=True)
class RowTree:
    """A cache row: its nodes' tokens, parent links (-1: under the root; a parent's index
    is below its children's) and path probabilities. The first nodes are the chain's."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    def head(self, k: int) -> RowTree:
        """Its first ``k`` nodes: a row tree too (parents come first)."""
        return self if k >= len(self.tokens) else RowTree(self.tokens[:k], self.parents[:k], self.probs[:k])


EMPTY_ROW = RowTree()


def row_tree(chain: Draft, tree: DraftTree, max_nodes: int) -> RowTree:
    """The row tree of at most ``max_nodes`` nodes (module docstring)."""
    cut = min(len(chain.tokens), max_nodes)
    tokens = list(chain.tokens[:cut])
    parents = list(range(-1, cut - 1))
    probs = list(chain.probs[:cut])
    placed: dict[int, int] = {}  # tree node -> row node
    depth: list[int] = []
    on_chain: list[bool] = []
    for i, (t, p) in enumerate(zip(tree.tokens, tree.parents)):
        d = 1 if p < 0 else depth[p] + 1
        chained = (p < 0 or on_chain[p]) and d <= cut and tokens[d - 1] == t
        depth.append(d)
        on_chain.append(chained)
        if chained:
            placed[i] = d - 1
        elif len(tokens) < max_nodes and (p < 0 or p in placed):
            placed[i] = len(tokens)
            tokens.append(t)
            parents.append(-1 if p < 0 else placed[p])
            probs.append(tree.probs[i])
    return RowTree(tuple(tokens), tuple(parents), tuple(probs))


def accept_len(draft_tokens: Sequence[int], continuation: Sequence[int], start: int = 0) -> int:
    """Longest common prefix of a chain draft and the true continuation[start:] (greedy
    verify of a chain; replay.engine re-exports it)."""
    n = min(len(draft_tokens), len(continuation) - start)
    k = 0
    while k < n and draft_tokens[k] == continuation[start + k]:
        k += 1
    return k


def row_path(
    tokens: Sequence[int], parents: Sequence[int], continuation: Sequence[int], start: int = 0
) -> tuple[int, ...]:
    """The nodes greedy verification passes through when the output is continuation[start:]:
    from the root, at each depth the child holding the next token (siblings hold distinct
    tokens), until none does or the output ends."""
    if is_chain(parents):  # the common case: the longest common prefix
        return tuple(range(accept_len(tokens, continuation, start)))
    n = len(continuation) - start
    path: list[int] = []
    node = -1
    while len(path) < n:
        want = continuation[start + len(path)]
        node = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == want), -1)
        if node < 0:
            break
        path.append(node)
    return tuple(path)


def is_chain(parents: Sequence[int]) -> bool:
    """Each node the child of the one before (the first under the root)."""
    return tuple(parents) == chain_parents(len(parents))


@functools.lru_cache(maxsize=256)
def chain_parents(n: int) -> tuple[int, ...]:
    """The parent links of a chain of ``n`` nodes: -1, 0, 1, ..., n - 2."""
    return tuple(range(-1, n - 1))


def accepted_within(path: Sequence[int], num_nodes: int) -> int:
    """What a verify of the row's first ``num_nodes`` nodes accepts: the path's nodes among
    them (indices grow along a path, a parent's below its child's, so they lead it)."""
    k = 0
    while k < len(path) and path[k] < num_nodes:
        k += 1
    return k


def branch(tokens: Sequence[int], parents: Sequence[int], path: Sequence[int]) -> tuple[int, ...]:
    """The tokens of the root-to-leaf branch through ``path``: its nodes, then each
    deepest node's first child down to a leaf (an empty path: the first branch, the
    chain). A branch's LCP with the output is the path's length."""
    if is_chain(parents):
        return tuple(tokens)
    nodes = list(path)
    node = nodes[-1] if nodes else -1
    while (child := next((i for i, p in enumerate(parents) if p == node), -1)) >= 0:
        nodes.append(child)
        node = child
    return tuple(tokens[i] for i in nodes)


def chain_path(accept_len: int) -> tuple[int, ...]:
    """The path of a chain row whose draft's LCP with the output is ``accept_len``."""
    return tuple(range(accept_len))


def speculate_row(drafter, req_id: str, max_nodes: int) -> RowTree:
    """One request's row tree through the drafter's own ``speculate_rows`` (replay's call)."""
    return drafter.speculate_rows([req_id], max_nodes).row(0)


def row_of(drafter, req_id: str, max_nodes: int) -> RowTree:
    """The request's row tree from its chain draft and the tree draft of ``max_nodes``
    nodes grown from the chain's own occurrence set (its siblings, one search instead of
    one per set); none without a chain (a row tree extends a chain). A certain chain (path
    probability 1 at every token: its pattern was always continued so) is its own row, no
    tree grown; so is a chain of ``max_nodes`` tokens or more (the row holds no tree node
    then). The reference for every drafter's ``speculate_rows``."""
    chain = drafter.speculate(req_id)
    if not chain.tokens:
        return EMPTY_ROW
    if chain.probs[-1] >= 1.0 or len(chain.tokens) >= max_nodes:
        return row_tree(chain, DraftTree(), max_nodes)
    return row_tree(chain, drafter.speculate_tree(req_id, max_nodes, like=chain), max_nodes)
