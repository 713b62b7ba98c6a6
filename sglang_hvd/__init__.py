"""Hybrid Verified Decoding for SGLang (runtime core: numpy and onnxruntime only).

The decision, one way: drafter/batch.py (DraftBatch, RowTreeBatch) + request_state.py
(StateBatch) -> features.py -> scorer.py (the Scorer Protocol: gate.Gate, scorer.ScoreRule)
-> decision.py (BatchPlan of verify.RowPlan rows). docs/design.md has the layers, the
import rules and a glossary; the words most easily confused:

  row          one request's verify row at one step (root + N-1 draft nodes), never a
               training example (predictor/: "examples", ``hvd train --positions``)
  row tree     a cache row's tree: the chain, then siblings from the tree draft
  row plan     a row's shape (cache nodes, EAGLE3 nodes); BatchPlan: a batch's
  policy       a replay strategy (replay/policies.py: *Policy, ``plan(view)``);
               the served decision is decision.decide, the scorer its gate or rule
"""

__version__ = "0.1.0"
