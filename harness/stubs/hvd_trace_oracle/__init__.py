"""Trace-oracle models for the CPU harness (test and benchmark code; not used by serving).

A server started with ``SGLANG_EXTERNAL_MODEL_PACKAGE=hvd_trace_oracle`` (and this
folder's parent on ``sys.path``, which ``HVD_TEST_SGLANG_CPU=1`` arranges) resolves two
architectures here:

* ``HvdTraceOracleForCausalLM`` (target.py): its greedy next token after any prefix
  equal to prompt + output[:k] of a recorded request is output[k] (table.py); any other
  prefix gets a filler token. The prefix of each KV slot is carried as a hash in the
  real KV pool (1 layer, 1 KV head, head_dim 4), so SGLang's radix cache, chunked
  prefill, tree verify and the topk > 1 move of the accepted path keep it right.
* ``HvdTraceOracleEagle3`` (draft.py): an EAGLE3 draft run by SGLang's own EAGLE3
  worker (target hidden states captured, draft extend, multi-step draft decode); it
  proposes the recorded next tokens with a seeded error model calibrated to an EAGLE3
  curve (table.DraftErrorModel), reading the prefix hash from the hidden states.

``sglang_hvd.harness.trace_oracle`` (harness/trace_oracle.py) writes the model folders and the table.
"""
