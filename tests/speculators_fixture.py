"""Run by the vLLM interpreter (.venv-vllm, where `make serving` installs speculators): write an EAGLE-3 head in the
speculators format with speculators' own classes (Eagle3SpeculatorConfig, Eagle3DraftModel.save_pretrained).

    python speculators_fixture.py TARGET_FOLDER WEIGHTS.safetensors SETTINGS.json OUT_FOLDER

WEIGHTS holds the head's tensors under this project's names (midlayer.*, fc, norm, lm_head, d2t, t2d) and the
embedding the folder is to carry (embed_tokens.weight); SETTINGS its config keys (hidden_size, heads, vocab sizes,
aux layer ids, norm_before_residual, gamma, and mask_token_id for a peagle head).
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig


def main(target: str, weights: str, settings_file: str, out: str) -> None:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    settings = json.loads(open(settings_file).read())
    layer = LlamaConfig(**settings["layer"], num_hidden_layers=1)
    proposal = GreedyTokenProposalConfig(speculative_tokens=settings["gamma"])
    common = dict(transformer_layer_config=layer, draft_vocab_size=settings["draft_vocab_size"],
                  target_hidden_size=layer.hidden_size, norm_before_residual=settings["norm_before_residual"],
                  eagle_aux_hidden_state_layer_ids=settings["aux_layers"])
    if settings.get("mask_token_id") is None:
        from speculators.models.eagle3 import Eagle3SpeculatorConfig as Config
        from speculators.models.eagle3.core import Eagle3DraftModel as Model
        algorithm = "eagle3"
    else:
        from speculators.models.peagle import PEagleSpeculatorConfig as Config
        from speculators.models.peagle.core import PEagleDraftModel as Model
        common["mask_token_id"] = settings["mask_token_id"]
        algorithm = "peagle"
    verifier = VerifierConfig.from_pretrained(target)
    config = Config(**common, speculators_config=SpeculatorsConfig(
        algorithm=algorithm, proposal_methods=[proposal], default_proposal_method=proposal.proposal_type,
        verifier=verifier))
    model = Model(config)
    state = {name.replace("midlayer.", "layers.0.", 1): tensor for name, tensor in load_file(weights).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"verifier_lm_head.weight", "verifier_norm.weight"}, missing
    with torch.no_grad():
        model.save_pretrained(out)


if __name__ == "__main__":
    main(*sys.argv[1:])
