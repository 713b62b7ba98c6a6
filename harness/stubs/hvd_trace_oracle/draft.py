"""The EAGLE3 stand-in draft (see the package doc). Stateless: every input row carries
its prefix hash (and draft depth) in the hidden state it is given, and the token it is
paired with extends that prefix (SGLang pairs hidden state p with token p + 1)."""

from __future__ import annotations

import numpy as np
import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from torch import nn

from .table import HASH_FLOATS, LOGIT_OFF, RANK_LOGITS, WRONG_TOKEN_SPAN, DraftErrorModel, OracleTable, decode, roll
from .target import NoWeights, hidden_rows


class HvdTraceOracleEagle3(NoWeights, nn.Module):
    hot_token_id = None  # the draft's vocabulary is the target's
    load_lm_head_from_target = False

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        self.config = config
        settings = getattr(config, "hvd_trace_oracle", None) or {}
        if "table" not in settings or "draft" not in settings:
            raise ValueError("HvdTraceOracleEagle3 needs config.hvd_trace_oracle.table and .draft")
        self.table = OracleTable.load(settings["table"])
        self.errors = DraftErrorModel.from_json(settings["draft"])
        self.vocab = int(config.vocab_size)
        self.hidden = int(config.hidden_size)
        self.placeholder = nn.Parameter(torch.zeros(1), requires_grad=False)

    def set_embed(self, embed) -> None:  # SGLang hands over the target's; not needed
        pass

    def set_embed_and_head(self, embed, head) -> None:
        pass

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, **kwargs):
        mode = forward_batch.forward_mode
        hs = forward_batch.spec_info.hidden_states
        if mode.is_idle() or hs is None or not len(input_ids):
            return LogitsProcessorOutput(next_token_logits=torch.zeros(0, self.vocab),
                                         hidden_states=torch.zeros(0, self.hidden))
        h_in = hs.detach().to("cpu").numpy()
        parent = decode(h_in[:, :HASH_FLOATS])
        # the target writes depth 0 there, the draft its own step's depth
        depth = np.rint(h_in[:, HASH_FLOATS]).astype(np.int64) + 1
        hashes = roll(parent, input_ids.detach().to("cpu").numpy().astype(np.int64))
        if mode.is_extend():  # EXTEND (after a prefill); not DRAFT_EXTEND_V2 (after a verify) nor DECODE
            # LogitsProcessor keeps each request's last row
            rows = np.cumsum(list(forward_batch.extend_seq_lens_cpu)) - 1
        else:
            rows = np.arange(len(hashes))
        props = self.errors.proposals(self.table, hashes[rows], depth[rows], WRONG_TOKEN_SPAN)
        logits = torch.full((len(rows), self.vocab), LOGIT_OFF, dtype=torch.float32)
        ar = torch.arange(len(rows))
        for c in range(props.shape[1] - 1, -1, -1):  # first choice written last: it wins a duplicate
            logits[ar, torch.from_numpy(props[:, c])] = RANK_LOGITS[c]
        capture = forward_batch.capture_hidden_mode
        full = capture is not None and capture.is_full()
        hidden = hidden_rows(hashes if full else hashes[rows], self.hidden, depth if full else depth[rows])
        return LogitsProcessorOutput(next_token_logits=logits.to(input_ids.device),
                                     hidden_states=hidden.to(input_ids.device))


EntryClass = HvdTraceOracleEagle3
