"""The trace-oracle target (see the package doc)."""

from __future__ import annotations

import numpy as np
import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_context import get_req_to_token_pool, get_token_to_kv_pool
from torch import nn

from .table import (
    HASH_FLOATS,
    LOGIT_OFF,
    LOGIT_ON,
    SEED,
    OracleTable,
    chain,
    decode,
    draft_blocks,
    encode,
    roll,
    row_hashes,
)


def one_hot_logits(tokens: np.ndarray, vocab: int) -> torch.Tensor:
    out = torch.full((len(tokens), vocab), LOGIT_OFF, dtype=torch.float32)
    if len(tokens):
        out[torch.arange(len(tokens)), torch.from_numpy(np.asarray(tokens, dtype=np.int64))] = LOGIT_ON
    return out


def hidden_rows(hashes: np.ndarray, width: int, depth: np.ndarray | None = None) -> torch.Tensor:
    """Hidden states carrying each row's prefix hash (and, for the draft, its depth)."""
    out = np.zeros((len(hashes), width), dtype=np.float32)
    out[:, :HASH_FLOATS] = encode(hashes)
    if depth is not None:
        out[:, HASH_FLOATS] = depth
    return torch.from_numpy(out)


class NoWeights:
    """Both oracle models are served with --load-format dummy: no weights to read."""

    def load_weights(self, weights) -> None:
        for _ in weights:
            pass


class HvdTraceOracleForCausalLM(NoWeights, nn.Module):
    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        self.config = config
        settings = getattr(config, "hvd_trace_oracle", None) or {}
        if "table" not in settings:
            raise ValueError("HvdTraceOracleForCausalLM needs config.hvd_trace_oracle.table "
                             "(sglang_hvd.harness.trace_oracle)")
        self.table = OracleTable.load(settings["table"])
        self.vocab = int(config.vocab_size)
        self.hidden = int(config.hidden_size)
        self.aux_layers = 0
        # SGLang's EAGLE3 worker shares embedding and head with its draft; nothing reads them here
        self.embed = nn.Parameter(torch.zeros(1, self.hidden), requires_grad=False)
        self.head = nn.Parameter(torch.zeros(1, self.hidden), requires_grad=False)

    # -- what SGLang's EAGLE3 path asks of a target --------------------------------------

    def set_eagle3_layers_to_capture(self, layer_ids=None) -> None:
        self.aux_layers = len(layer_ids) if layer_ids else 3

    def get_embed_and_head(self):
        return self.embed, self.head

    # -- forward -------------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, **kwargs):
        mode = forward_batch.forward_mode
        if mode.is_idle():
            return LogitsProcessorOutput(next_token_logits=torch.zeros(0, self.vocab),
                                         hidden_states=torch.zeros(0, self._width()))
        if getattr(forward_batch, "return_logprob", False) and not mode.is_target_verify() and mode.is_extend():
            raise NotImplementedError("the trace oracle returns no prompt logprobs")
        kbuf = get_token_to_kv_pool().get_key_buffer(0)
        r2t = get_req_to_token_pool().req_to_token
        ids = input_ids.detach().to("cpu").numpy().astype(np.int64)
        pos = positions.detach().to("cpu").numpy().astype(np.int64)
        reqs = forward_batch.req_pool_indices.detach().to("cpu").numpy().astype(np.int64)

        def parent_hash(req: int, p: int) -> np.uint64:
            if p <= 0:
                return SEED
            slot = int(r2t[req, p - 1])
            return decode(kbuf[slot, 0, :HASH_FLOATS].to("cpu").numpy())[0]

        if mode.is_target_verify():
            spec = forward_batch.spec_info
            n = int(spec.draft_token_num)
            bs = len(reqs)
            hashes = np.zeros(bs * n, dtype=np.uint64)
            seq_lens = forward_batch.seq_lens.detach().to("cpu").numpy()
            mask = getattr(spec, "custom_mask", None)
            blocks = None if mask is None else draft_blocks(mask.detach().to("cpu").numpy(), seq_lens, n)
            for b in range(bs):
                p, t = pos[b * n:(b + 1) * n], ids[b * n:(b + 1) * n]
                block = blocks[b] if blocks is not None else np.tril(np.ones((n, n), dtype=bool))  # a chain
                hashes[b * n:(b + 1) * n] = row_hashes(t, p, block, parent_hash(int(reqs[b]), int(p.min())))
            rows = np.arange(bs * n)
        elif mode.is_decode():
            hashes = roll(np.array([parent_hash(int(r), int(p)) for r, p in zip(reqs, pos)], dtype=np.uint64), ids)
            rows = np.arange(len(ids))
        elif mode.is_extend():
            lens = list(forward_batch.extend_seq_lens_cpu)
            hashes = np.zeros(len(ids), dtype=np.uint64)
            start = 0
            for b, length in enumerate(lens):
                if length:
                    hashes[start:start + length] = chain(parent_hash(int(reqs[b]), int(pos[start])),
                                                         ids[start:start + length])
                start += length
            rows = np.cumsum(lens) - 1
        else:
            raise NotImplementedError(f"the trace oracle does not run forward mode {mode!r}")
        kbuf[forward_batch.out_cache_loc.to(kbuf.device), 0, :HASH_FLOATS] = (
            torch.from_numpy(encode(hashes)).to(kbuf.device))
        logits = one_hot_logits(self.table.next_tokens(hashes[rows]), self.vocab)
        capture = forward_batch.capture_hidden_mode
        hidden = None
        if capture is not None and capture.need_capture():
            hidden = hidden_rows(hashes if capture.is_full() else hashes[rows], self._width())
        return LogitsProcessorOutput(next_token_logits=logits.to(input_ids.device),
                                     hidden_states=None if hidden is None else hidden.to(input_ids.device))

    def _width(self) -> int:
        return self.hidden * max(self.aux_layers, 1)


EntryClass = HvdTraceOracleForCausalLM
