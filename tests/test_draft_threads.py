"""The native drafter drafts a batch's rows on several threads (drafter/native/pool.hpp):
the same chains and row trees as on one, whatever the thread count; bad counts refused."""

from __future__ import annotations

import gc
import os
import signal

import pytest

from sglang_hvd.drafter import DrafterConfig, available_drafters, create_drafter
from sglang_hvd.drafter.native_drafter import default_draft_threads

pytestmark = pytest.mark.skipif("native" not in available_drafters(), reason="the native drafter is not built")


def _step(d, rids):
    chains, rows = d.speculate_step(rids, 15)
    return (chains.tokens.tolist(), chains.probs.tolist(), chains.score.tolist(), chains.match_len.tolist(),
            chains.match_count.tolist(), chains.tree.tolist(), rows.tokens.tolist(), rows.parents.tolist(),
            rows.probs.tolist(), rows.lengths.tolist())


@pytest.mark.shared_data
def test_a_served_batch_drafts_the_same_on_one_thread_and_on_four(shared_traces):
    """60 tau-bench and SWE-agent requests in flight over a cache of 40 finished responses,
    three tokens a step: every step's chains and row trees equal across 1, 2 and 4 threads
    (batches of 32 rows or more run on the pool).
    The running requests' documents outgrow their room and move (their bigram lists sorted back
    lazily, by whichever thread looks first), and the chain calls alone agree too."""
    from sglang_hvd.trace import iter_traces

    path, _ = shared_traces
    records = [r for r in iter_traces(path) if r.source in ("tau-bench", "swe-agent")][:100]
    drafters = [create_drafter("native", DrafterConfig(), threads=t) for t in (1, 2, 4)]
    assert [d.threads for d in drafters] == [1, 2, 4]
    for d in drafters:
        for r in records[:40]:
            d.start_request(r.req_id, r.prompt_ids[-1:])
            d.append_batch([r.req_id], [r.output_ids])
            d.finish_request(r.req_id)
    running = records[40:]
    pos = {r.req_id: 0 for r in running}
    for d in drafters:
        for r in running:
            d.start_request(r.req_id, r.prompt_ids)
    steps = rows = drafted = pooled = 0
    while pos and steps < 120:
        rids = list(pos)
        got = [_step(d, rids) for d in drafters]
        assert got[1] == got[0] and got[2] == got[0]
        assert drafters[2].speculate_arrays(rids).tokens.tolist() == got[0][0]
        steps, rows, drafted = steps + 1, rows + len(rids), drafted + sum(n > 0 for n in got[0][9])
        pooled += len(rids) >= 32
        emitted = []
        for r in running:
            if r.req_id in pos:
                pos[r.req_id] += 3
                emitted.append(r.output_ids[pos[r.req_id] - 3 : pos[r.req_id]].tolist())
        for d in drafters:
            d.append_batch(rids, emitted)
        for r in running:
            if r.req_id in pos and pos[r.req_id] >= len(r.output_ids):
                for d in drafters:
                    d.finish_request(r.req_id)
                del pos[r.req_id]
    # nearly every row drafted, and 1 step in 5 large enough for the pool: the threads did real work
    assert (steps, rows, drafted, pooled) == (103, 1699, 1663, 19)


def test_a_batch_naming_a_request_twice_or_one_not_running():
    """A request twice in one batch: the same rows as one at a time (run on the calling thread).
    A request not running: refused by name, before anything is drafted."""
    one, four = (create_drafter("native", DrafterConfig(), threads=t) for t in (1, 4))
    history = [5, 6, 7, 8, 5, 6, 7, 9] * 5
    rids = [f"r{i}" for i in range(36)]  # (a batch of 32 rows or more runs on the pool)
    for d in (one, four):
        for i, rid in enumerate(rids):
            d.start_request(rid, history[: 4 + i])
    batch = rids + ["r3", "r3"]
    got = _step(four, batch)
    assert got == _step(one, batch)
    assert got[0][3][:5] == got[0][36][:5] == got[0][37][:5] == [8, 5, 6, 7, -1]  # r3: 5 6 7 8 5 6 7 -> 8 5 6 7
    with pytest.raises(KeyError, match="request 'gone' is not running"):
        four.speculate_step([*rids, "gone"], 15)


@pytest.mark.parametrize("threads", [0, 65, 2.0, True])
def test_bad_thread_counts_are_refused(threads):
    with pytest.raises(ValueError, match=r"draft threads must be an integer in \[1, 64\], got "):
        create_drafter("native", DrafterConfig(), threads=threads)


def test_the_python_drafter_takes_one_thread_and_the_default_is_1_to_4():
    with pytest.raises(ValueError, match="the python drafter drafts on one thread; 2 draft threads need the native"):
        create_drafter("python", DrafterConfig(), threads=2)
    assert create_drafter("python", DrafterConfig(), threads=1).name == "python"
    assert 1 <= default_draft_threads() <= 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_drafts_inline_instead_of_waiting_on_its_parents_threads():
    """The pool's threads stay in the parent: a child forked after the drafter was made drafts
    its batches on its own thread (with the parent's threads it would wait forever), frees what
    it finishes itself, and lets the drafter go without joining the parent's threads."""
    d = create_drafter("native", DrafterConfig(), threads=4)
    for i in range(20):  # the reaper thread started in the parent: 20 finished, 16 indexes kept
        d.start_request(f"old{i}", list(range(300)))
        d.finish_request(f"old{i}")
    rids = [f"r{i}" for i in range(40)]
    for i, rid in enumerate(rids):
        d.start_request(rid, [5, 6, 7, 8, 5, 6, 7, 9, 5, 6][: 4 + i % 7])
    want = d.speculate_step(rids, 15)[0].tokens.tolist()
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if it drafted the parent's rows, then let the drafter go
        signal.alarm(20)
        ok = d.speculate_step(rids, 15)[0].tokens.tolist() == want
        for rid in rids:  # finished requests' own indexes, past the 16 kept, go to the parent's reaper thread
            d.finish_request(rid)
        del d  # its pool and reaper let the parent's threads be (joining them would wait forever)
        gc.collect()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert d.speculate_step(rids, 15)[0].tokens.tolist() == want  # the parent's pool still serves
