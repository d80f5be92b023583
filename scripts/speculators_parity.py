"""EAGLE-3, P-EAGLE, DFlash and DSpark parity against the speculators package's own model classes (code no one
here wrote).

Runs in the separate environment `scripts/speculators_env.sh` makes (speculators pins older
transformers and datasets than draftsmith), driven by tests/test_speculators_parity.py:

    python scripts/speculators_parity.py logits FOLDER INPUTS OUT
        Load FOLDER (speculators format, e.g. `draftsmith export --format speculators`) with
        speculators' Eagle3SpeculatorConfig / Eagle3DraftModel and write the first draft
        step's logits over the draft vocabulary for INPUTS (safetensors: `hidden_states`
        (1, T, 3H), row t the target features of position t - 1; `input_ids` (1, T)) to OUT.
    python scripts/speculators_parity.py make VERIFIER OUT LAYERS DRAFT_VOCAB [NORM_BEFORE_RESIDUAL]
        Build a random EAGLE-3 head with speculators for the target checkpoint folder VERIFIER
        (feature layers LAYERS, e.g. 2,4,5, in speculators' numbering; a draft vocabulary of
        the DRAFT_VOCAB lowest ids plus every third id; norm_before_residual "true" or "false",
        the default), and save it to OUT with speculators' save_pretrained.
    python scripts/speculators_parity.py peagle-logits FOLDER INPUTS OUT
        Load FOLDER (speculators' peagle format) with PEagleDraftModel and write the logits of
        every block depth d at every row t < T - d (depth by depth, rows in order: what
        PEagleDraftModel's training forward computes when its COD sampling keeps every row)
        for INPUTS as above to OUT.
    python scripts/speculators_parity.py peagle-make VERIFIER OUT LAYERS DRAFT_VOCAB MASK_ID DEPTHS
        Build a random P-EAGLE head with speculators as `make` does (mask token MASK_ID, DEPTHS
        speculative tokens a block) and save it to OUT.
    python scripts/speculators_parity.py dflash-logits FOLDER INPUTS OUT
        Load FOLDER (speculators' dflash format, its verifier a local folder, from which
        speculators takes the embeddings and LM head) with DFlashDraftModel and write the
        logits of every block row (the anchor's, then its mask rows') of every anchor
        t < T - block_size, anchor by anchor, for INPUTS (`hidden_states` (1, T, 3H), row t the
        target features of position t itself; `input_ids` (1, T)) to OUT.
    python scripts/speculators_parity.py dflash-make VERIFIER OUT LAYERS DRAFT_VOCAB MASK_ID BLOCK LAYERS_N
        Build a random DFlash head with speculators (feature layers LAYERS, the draft vocabulary
        of `make`, mask token MASK_ID, block_size BLOCK, LAYERS_N decoder layers) and save it.
    python scripts/speculators_parity.py dspark-logits FOLDER INPUTS OUT
        As dflash-logits for FOLDER in speculators' dspark format (DSparkDraftModel): the
        logits after its Markov bias and its confidence head's logits (`confidence`), as its
        forward hands them to its loss.
    python scripts/speculators_parity.py dspark-make VERIFIER OUT LAYERS DRAFT_VOCAB MASK_ID BLOCK LAYERS_N RANK TYPE
        As dflash-make, with a Markov head of rank RANK and type TYPE and a confidence head.

Offline throughout: the verifier is a local folder, never a hub id.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from speculators.losses import resolve_loss_config  # noqa: E402
from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig  # noqa: E402
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig  # noqa: E402
from speculators.models.dspark import core as dspark_core  # noqa: E402
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: E402
from speculators.models.peagle import PEagleDraftModel, PEagleSpeculatorConfig  # noqa: E402
from speculators.models.peagle import core as peagle_core  # noqa: E402
from transformers import AutoConfig, LlamaConfig  # noqa: E402


def load_offline(
    folder: str, config_class=Eagle3SpeculatorConfig, model_class=Eagle3DraftModel
) -> Eagle3DraftModel:
    """speculators' model from a saved folder without resolving the verifier (from_pretrained
    would look it up): config -> model -> state dict, strictly apart from the verifier's own
    tensors, which speculators never saves."""
    config = config_class.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "sdpa"  # any length, explicit mask
    model = model_class(config)
    missing, unexpected = model.load_state_dict(
        load_file(os.path.join(folder, "model.safetensors")), strict=False
    )
    missing = [n for n in missing if not n.startswith("verifier_")]
    if missing or unexpected:
        sys.exit(f"speculators did not load {folder}: missing {missing}, unexpected {unexpected}")
    return model.eval()


def write_logits(model, inputs: str, out: str, **forward) -> None:
    """Run model's forward on INPUTS (plus `forward`'s arguments) and write the logits its LM
    head computed (the first call's) to OUT."""
    tensors = load_file(inputs)
    hidden, input_ids = tensors["hidden_states"], tensors["input_ids"]
    captured = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: captured.append(o.detach()))
    with torch.no_grad():
        model(
            hidden_states=hidden.to(model.fc.weight.dtype),
            input_ids=input_ids,
            document_ids=torch.zeros_like(input_ids),
            **forward,
        )
    hook.remove()
    save_file({"logits": captured[0].float().contiguous()}, out)


def first_step_logits(folder: str, inputs: str, out: str) -> None:
    write_logits(load_offline(folder), inputs, out, ttt_steps=1)


def peagle_logits(folder: str, inputs: str, out: str) -> None:
    model = load_offline(folder, PEagleSpeculatorConfig, PEagleDraftModel)
    rows = load_file(inputs)["input_ids"].shape[1]
    depths = model.config.speculators_config.proposal_methods[0].speculative_tokens
    # Every row of every depth: anchors t < T - d at depth d, depth by depth.
    anchors = torch.cat([torch.arange(rows - d) for d in range(depths)])
    depth = torch.cat([torch.full((rows - d,), d) for d in range(depths)])
    peagle_core.generate_cod_sample_indices = lambda **_: (anchors, depth)
    write_logits(
        model,
        inputs,
        out,
        verifier_last_hidden_states=torch.zeros(1, rows, model.hidden_size),
        num_depths=depths,
        loss_config=resolve_loss_config("kl_div", "eager"),  # the fused one needs Triton
    )


def dflash_logits(
    folder: str, inputs: str, out: str, config_class=DFlashSpeculatorConfig, model_class=None
) -> None:
    config = config_class.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"  # a dense mask on the CPU
    model = (model_class or DFlashDraftModel)(config)
    missing, unexpected = model.load_state_dict(
        load_file(os.path.join(folder, "model.safetensors")), strict=False
    )
    shared = ("verifier_", "embed_tokens.") + (() if model.use_draft_vocab else ("lm_head.",))
    missing = [n for n in missing if not n.startswith(shared)]
    if missing or unexpected:
        sys.exit(f"speculators did not load {folder}: missing {missing}, unexpected {unexpected}")
    model.load_verifier_weights()  # the embeddings (and full LM head) from the local verifier
    rows = load_file(inputs)["input_ids"].shape[1]
    write_logits(
        model.eval(),
        inputs,
        out,
        loss_mask=torch.ones(1, rows),
        verifier_last_hidden_states=torch.zeros(
            1, rows, config.transformer_layer_config.hidden_size
        ),
        max_anchors=rows - model.block_size,  # every anchor it may take: sorted, no sampling
        loss_config=resolve_loss_config("kl_div", "eager"),
    )


def dspark_logits(folder: str, inputs: str, out: str) -> None:
    """DSpark's forward, its loss replaced by a recorder of what the loss is handed."""
    seen = {}

    def record(logits, targets, confidence_logits, *args, **kwargs):
        seen.update(logits=logits.detach(), confidence=confidence_logits.detach())
        return torch.zeros(()), {}

    dspark_core.compute_metrics = record
    dflash_logits(folder, inputs, out, DSparkSpeculatorConfig, DSparkDraftModel)
    save_file({k: v.float().contiguous() for k, v in seen.items()}, out)


def _draft_vocab(verifier: str, draft_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' (t2d mask, d2t offsets) of the DRAFT_VOCAB // 2 lowest ids and every third."""
    vocab = AutoConfig.from_pretrained(verifier).vocab_size
    chosen = sorted(set(range(draft_vocab // 2)) | set(range(0, vocab, 3)))[:draft_vocab]
    ids = torch.tensor(chosen)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return t2d, ids - torch.arange(draft_vocab)


def _perturbed(model, prefixes: tuple[str, ...]) -> None:
    """Move the parameters named with `prefixes` off their initialisation (norms start at one),
    reproducibly."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(prefixes):
                p.add_(torch.randn(p.shape) * 0.05)


def dflash_make(verifier: str, out: str, layers: str, draft_vocab: str, *args: str) -> None:
    mask_id, block, depth = (int(a) for a in args)
    make(verifier, out, layers, int(draft_vocab), False, DFlashDraftModel, depth=depth,
         perturb=("layers.", "fc.", "hidden_norm.", "norm."),  # its LM head is frozen
         block_size=block, mask_token_id=mask_id)  # fmt: skip


def dspark_make(verifier: str, out: str, layers: str, draft_vocab: str, *args: str) -> None:
    mask_id, block, depth, rank = (int(a) for a in args[:4])
    make(verifier, out, layers, int(draft_vocab), False, DSparkDraftModel, depth=depth,
         perturb=("layers.", "fc.", "hidden_norm.", "norm.", "markov_head.", "confidence_head."),
         block_size=block, mask_token_id=mask_id, markov_rank=rank, markov_head_type=args[4],
         sample_from_anchor=False)  # fmt: skip


def make(
    verifier: str,
    out: str,
    layers: str,
    draft_vocab: int,
    norm_before_residual: bool,
    model_class=Eagle3DraftModel,
    depth: int = 1,
    perturb: tuple[str, ...] = ("layers.", "fc.", "norm.", "lm_head."),
    **extra,
) -> None:
    t2d, d2t = _draft_vocab(verifier, draft_vocab)
    layer = AutoConfig.from_pretrained(verifier).to_dict()
    layer.update(num_hidden_layers=depth, architectures=None)
    torch.manual_seed(0)
    model = model_class.from_training_args(
        verifier_config=LlamaConfig(**layer),
        t2d=t2d,
        d2t=d2t,
        verifier_name_or_path=verifier,
        target_layer_ids=[int(i) for i in layers.split(",")],
        draft_vocab_size=draft_vocab,
        norm_before_residual=norm_before_residual,
        ttt_steps=3,
        draft_attn_impl="sdpa",
        **extra,
    )
    _perturbed(model, perturb)
    model.save_pretrained(out)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "logits":
        first_step_logits(*args)
    elif command == "make":
        make(args[0], args[1], args[2], int(args[3]), args[4:5] == ["true"])
    elif command == "peagle-logits":
        peagle_logits(*args)
    elif command == "peagle-make":
        verifier, out, layers, vocab, mask_id, depths = args
        make(verifier, out, layers, int(vocab), False, PEagleDraftModel,
             mask_token_id=int(mask_id), num_depths=int(depths))  # fmt: skip
    elif command == "dflash-logits":
        dflash_logits(*args)
    elif command == "dflash-make":
        dflash_make(*args)
    elif command == "dspark-logits":
        dspark_logits(*args)
    elif command == "dspark-make":
        dspark_make(*args)
    else:
        sys.exit(__doc__)
