"""FlexAttention for the tests: its eager math path, without the dynamo wrapper.

The default eager ``flex_attention`` call compiles with the "eager" backend once per shape (about a second each);
the math path takes milliseconds on the tests' small inputs. Forward only on the CPU.
"""

import torch.nn.attention.flex_attention as fa
from torch.nn.attention.flex_attention import flex_attention


def eager_flex(q, k, v, block_mask):
    """``flex_attention(q, k, v, block_mask=block_mask)`` on the eager math path."""
    saved = fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        return flex_attention(q, k, v, block_mask=block_mask)
    finally:
        fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = saved
