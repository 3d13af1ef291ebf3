"""Teacher-forced argmax agreement of SmolLM2-135M's early exits with the full model (why the tree
benchmark drafts by prompt lookup: untrained early exits rarely agree with the final layer).

Run: PYTHONPATH=$PWD python3 scripts/early_exit_agreement.py
"""

import torch

from reference.drafters import truncated_view
from specverify.hf.packaged import DEFAULT_TARGET, load_causal_lm, load_tokenizer

TEXT = ("Once upon a time, in a small village by the sea, there lived an old fisherman who went out every morning "
        "to catch fish. One day he caught a golden fish that could speak. The fish said: please let me go, and I "
        "will grant you a wish. The fisherman was kind and let the fish go.")

torch.set_num_threads(1)
target = load_causal_lm(DEFAULT_TARGET)
ids = torch.tensor([load_tokenizer(DEFAULT_TARGET)(TEXT)["input_ids"]])
with torch.no_grad():
    full = target(input_ids=ids).logits[0].argmax(-1)
    for layers in (10, 15, 20, 24):
        top2 = truncated_view(target, layers)(input_ids=ids).logits[0].topk(2, -1).indices
        print(f"{layers} of {target.config.num_hidden_layers} layers: top-1 agreement "
              f"{(top2[:, 0] == full).float().mean():.3f}, target argmax in top-2 "
              f"{(top2 == full[:, None]).any(-1).float().mean():.3f}"
              f" ({ids.shape[1]} positions)")
