"""The trace oracle's tables (harness/stubs/hvd_trace_oracle/table.py): prefix
hashing, the next-token table and the EAGLE3 stand-in's error model. numpy only; the
servers that use them are in tests/sglang_cpu/test_engine_eval.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sglang_hvd.harness.stubs.hvd_trace_oracle import table as T


def rec(req_id, prompt, output):
    return SimpleNamespace(req_id=req_id, prompt_ids=np.array(prompt, dtype=np.int32),
                           output_ids=np.array(output, dtype=np.int32))


def test_vectorised_hash_equals_one_token_at_a_time():
    tokens = [5, 0, 151644, 7, 7, 7, 42]
    h = T.SEED
    expected = [h]
    for t in tokens:
        h = T.roll(h, np.int64(t))
        expected.append(h)
    assert T.prefix_hashes(tokens).tolist() == [int(x) for x in expected]
    # a segment after a known parent is the same as hashing the whole prefix
    assert T.chain(T.prefix_hashes(tokens[:3])[-1], tokens[3:]).tolist() == T.prefix_hashes(tokens)[4:].tolist()
    assert T.decode(T.encode(T.prefix_hashes(tokens))).tolist() == T.prefix_hashes(tokens).tolist()
    assert T.encode(np.array([0x0001000200030004], dtype=np.uint64)).tolist() == [[1.0, 2.0, 3.0, 4.0]]


def test_table_reproduces_records_and_drops_contradictions():
    table, report = T.OracleTable.build([rec("a", [1, 2], [3, 4]), rec("b", [1, 2, 3], [9]), rec("c", [8], [1, 2])],
                                        eos_token_id=99)
    # b says prefix [1,2,3] continues with 9; a said 4 first: b is dropped whole
    assert (report.requests, report.kept, report.dropped) == (3, 2, ("b",))
    h = T.prefix_hashes([1, 2, 3, 4])
    nxt, hit = table.lookup(h[2:])
    assert nxt.tolist() == [3, 4, 99] and hit.tolist() == [True, True, True]
    assert table.next_tokens(T.prefix_hashes([8, 1, 2])[1:]).tolist() == [1, 2, 99]
    assert table.lookup(T.prefix_hashes([1, 5])[-1:])[1].tolist() == [False]  # off the traces: the filler
    assert table.next_tokens(T.prefix_hashes([1, 5])[-1:]).tolist() == [T.FILLER]


def test_tree_row_hashes_follow_the_mask():
    # root r at position 10; nodes 1, 2 children of the root; node 3 child of 1; node 4 unused
    pos = np.array([10, 11, 11, 12, 11])
    block = np.eye(5, dtype=bool)
    block[:, 0] = True
    block[3, 1] = True
    toks = np.array([50, 51, 52, 53, 54])
    parent = T.prefix_hashes([7, 8])[-1]
    h = T.row_hashes(toks, pos, block, parent)
    assert h[0] == T.prefix_hashes([7, 8, 50])[-1]
    assert h[3] == T.prefix_hashes([7, 8, 50, 51, 53])[-1]
    assert h[2] == T.prefix_hashes([7, 8, 50, 52])[-1]
    assert h[4] == T.prefix_hashes([7, 8, 50, 54])[-1]
    assert T.tree_parents(block, pos).tolist() == [-1, 0, 0, 1, 0]
    # FULL_MASK: prefix columns first; the draft block is the last n columns of each row
    full = np.concatenate([np.ones((5, 3), dtype=bool), block], axis=1).reshape(-1)
    assert [b.tolist() for b in T.draft_blocks(full, [3], 5)] == [block.tolist()]
    with pytest.raises(ValueError, match="fits neither layout"):
        T.draft_blocks(full[:-1], [3], 5)


def test_error_model_is_calibrated_to_the_curve_on_chains():
    curve = [1.45, 1.66, 1.75]
    model = T.DraftErrorModel.from_curve(curve, seed=3)
    assert [round(p, 4) for p in model.accept_probs] == [0.45, 0.4667, 0.4286]
    # a long recorded sequence; at every root, a 3-token chain drafted the way the
    # stand-in drafts it (each step extends its own proposal)
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 1000, 6000)
    table, _ = T.OracleTable.build([rec("x", seq[:1], seq[1:])])
    hashes = T.prefix_hashes(seq)
    accepted = []
    for root in range(1, 5000):
        h, n = hashes[root], 0
        for depth in (1, 2, 3):
            tok = model.proposals(table, np.array([h], dtype=np.uint64), np.array([depth]), 151643)[0, 0]
            if tok != seq[root + depth - 1]:
                break
            n += 1
            h = T.roll(h, np.int64(tok))
        accepted.append(n)
    assert 1 + np.mean(accepted) == pytest.approx(1.75, abs=0.03)
    # deterministic: the same prefix and depth draft the same
    a = model.proposals(table, hashes[:50], np.ones(50, dtype=np.int64), 151643)
    assert a.tolist() == model.proposals(table, hashes[:50], np.ones(50, dtype=np.int64), 151643).tolist()
    assert (a[:, 0] != a[:, 1]).all()
