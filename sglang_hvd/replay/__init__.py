"""Trace replay: drive the serving drafter over recorded generations and label its drafts.

Under greedy verification the accepted length of any draft is exactly its longest common
prefix with the recorded continuation, so replay measures drafters and policies without
a GPU. Modules: acceptance (the EAGLE3 step model), policies, engine (dense and serving
walks), metrics (per-source tables).
"""
