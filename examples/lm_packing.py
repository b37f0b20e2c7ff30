"""Packing for language-model research code: documents into fixed-size rows, with exact attention boundaries.

1. ``mmfeed.packing.pack`` puts variable-length documents into rows of ``capacity`` tokens (best-fit decreasing).
2. ``PackedBatch.from_lengths`` turns the rows into ids: ``document_ids``, ``position_ids`` (restarting at 0 in
   every document), ``cu_seqlens`` / ``max_seqlen`` for varlen kernels, and masks.
3. The same causal attention three ways, all blind to the other documents of a row: SDPA with the dense
   ``attention_mask()``, FlexAttention with the block-sparse ``block_mask()``, and flash-attention's varlen
   kernel with ``cu_seqlens`` / ``max_seqlen`` on the tokens with the padding taken out (when installed).
4. The same packing from ``mmfeed.DataLoader`` over your own map-style dataset of token tensors
   (``PlannedDataset.records(docs, lengths, plan=PlanConfig(...))``): shuffled and packed per epoch, every rank
   the same number of steps, resumable mid-epoch.

    python examples/lm_packing.py            # prints packing efficiency and the max differences between paths
    python examples/lm_packing.py --quick
"""

from __future__ import annotations

import argparse
import os
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from mmfeed import DataLoader, PackedBatch
from mmfeed.loaders import PlanConfig, PlannedDataset
from mmfeed.packing import lower_bound, pack


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("MMFEED_EXAMPLE_QUICK")))
    p.add_argument("--documents", type=int, default=None, help="documents to pack (default 2000, quick 200)")
    p.add_argument("--capacity", type=int, default=256, help="tokens per row")
    p.add_argument("--rows", type=int, default=4, help="rows in the attention demo batch")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    n_docs = args.documents or (200 if args.quick else 2000)
    capacity = args.capacity
    rng = np.random.default_rng(args.seed)
    # document lengths with a long tail, as in web text; anything longer than a row would be chunked upstream
    lengths = np.minimum(rng.geometric(1 / 60, size=n_docs), capacity).astype(np.int64)

    # 1. pack
    plan = pack(lengths, capacity, algorithm="bfd")
    bound = lower_bound(lengths, capacity)
    print(f"packed {n_docs} documents ({lengths.sum()} tokens) into {plan.num_bins} rows of {capacity}: "
          f"efficiency {plan.efficiency:.1%} (lower bound {bound} rows; padding to the longest would need "
          f"{n_docs} rows at {lengths.sum() / (n_docs * lengths.max()):.1%})")

    # 2. ids and masks of a batch of the first few rows
    rows = [lengths[items].tolist() for items in plan.bins()[: args.rows]]
    batch = PackedBatch.from_lengths(rows, capacity)  # one token per step: token-causal documents
    print(f"batch: {batch.num_rows} rows, {batch.num_documents} documents, cu_seqlens[:6]="
          f"{batch.cu_seqlens[:6].tolist()}, max_seqlen={batch.max_seqlen}")

    # 3. one causal attention layer, three ways
    heads, head_dim = 4, 32
    g = torch.Generator().manual_seed(args.seed)
    q, k, v = (torch.randn(batch.num_rows, heads, capacity, head_dim, generator=g) for _ in range(3))
    real = batch.document_ids >= 0  # [R, C]; padding slots compute something harmless and are ignored

    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=batch.attention_mask())
    if torch.cuda.is_available():  # the fused block-sparse kernel: compile once, reuse for every batch
        compiled = torch.compile(flex_attention)
        flex = compiled(q.cuda(), k.cuda(), v.cuda(), block_mask=batch.to("cuda").block_mask()).cpu()
    else:  # the CPU's unfused reference path is fine for a demo of this size
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            flex = flex_attention(q, k, v, block_mask=batch.block_mask())
    diff = (dense - flex).abs().permute(0, 2, 1, 3)[real].max().item()
    print(f"SDPA(attention_mask) vs FlexAttention(block_mask): max |diff| on real tokens = {diff:.2e}")
    assert diff < 1e-5, diff

    # varlen layout: the real tokens of the batch back to back, [total, heads, head_dim], split by cu_seqlens
    q_var, k_var, v_var = (t.permute(0, 2, 1, 3)[real] for t in (q, k, v))
    cu, max_len = batch.cu_seqlens, batch.max_seqlen
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        flash_attn_varlen_func = None
        print("note: flash_attn is not installed; on a GPU with it, the call below runs with these keywords:\n"
              "      flash_attn_varlen_func(q, k, v, cu_seqlens_q=batch.cu_seqlens, cu_seqlens_k=batch.cu_seqlens,\n"
              "                             max_seqlen_q=batch.max_seqlen, max_seqlen_k=batch.max_seqlen, causal=True)")
    if flash_attn_varlen_func is not None and torch.cuda.is_available():
        half = [t.cuda().half() for t in (q_var, k_var, v_var)]
        out = flash_attn_varlen_func(*half, cu_seqlens_q=cu.cuda(), cu_seqlens_k=cu.cuda(), max_seqlen_q=max_len,
                                     max_seqlen_k=max_len, causal=True)
        print(f"flash-attention varlen vs SDPA: max |diff| = "
              f"{(out.float().cpu() - dense.permute(0, 2, 1, 3)[real]).abs().max().item():.2e}")
    # what the varlen kernel computes, document by document, from cu_seqlens alone
    per_doc = torch.cat([
        F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1)[None] for t in (q_var, k_var, v_var)),
                                       is_causal=True)[0].transpose(0, 1)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
    diff = (per_doc - dense.permute(0, 2, 1, 3)[real]).abs().max().item()
    print(f"per-document causal attention over cu_seqlens vs packed SDPA: max |diff| = {diff:.2e}")
    assert diff < 1e-5, diff

    # 4. the planner over your own dataset: token tensors in, PackedBatch out (shuffled, packed, resumable)
    docs = [torch.from_numpy(rng.integers(0, 50_000, size=n)) for n in lengths]
    dataset = PlannedDataset.records(docs, lengths, plan=PlanConfig(capacity=capacity, rows_per_batch=args.rows),
                                     seed=args.seed)
    loader = DataLoader(dataset, num_workers=0)
    total, seen = 0, []
    for i, b in enumerate(loader):
        total += int(b.cu_seqlens[-1])
        seen.extend(b.metadata["sample"].tolist())  # which documents, by index into docs
        if i == 0:
            print(f"DataLoader(PlannedDataset.records): {len(loader)} batches; first: data['text'] "
                  f"{tuple(b.data['text'].shape)}, position_ids {tuple(b.position_ids.shape)}, "
                  f"{b.num_documents} documents")
    dropped = dataset.plan(0).dropped  # rows that would not fill a last batch of all ranks; reshuffled next epoch
    assert sorted(seen + dropped.tolist()) == list(range(n_docs))
    print(f"one epoch: {total} tokens of {lengths.sum()}, every document once except {len(dropped)} in "
          f"plan(0).dropped")


if __name__ == "__main__":
    main()
