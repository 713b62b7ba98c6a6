"""The embedded default workload: seeded synthetic agentic sessions plus a tokenizer built
in code, so the README's demo runs with no download.

Four session kinds, each a source in reports:
  synth-tools   tool-calling loops: calls repeat in structure, arguments (ids, dates,
                amounts) change with the state;
  synth-config  edits of a growing JSON document re-emitted in full each turn;
  synth-code    code edits with repeated boilerplate and changing names;
  synth-chat    free-form chat, a low-repetition control.
"""
