"""Heads in the serving engines' formats: export -> import round trips give the same drafts, each
convention the engines differ on is converted both ways, and bad input is refused by name."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import tiny_model
from head_helpers import moved_head, target_batch
from safetensors.torch import load_file, save_file

from draftsmith import load_drafter
from draftsmith.artifact.engines import export_head, foreign_layout, import_head
from draftsmith.artifact.engines.conventions import (
    d2t_from_offsets,
    d2t_offsets,
    engine_layer_ids,
    t2d_mask,
)
from draftsmith.commands.cli import main
from draftsmith.core.sampling import SamplingParams

LAYERS = 8  # EAGLE-3's default feature layers (2, 4, 5) exist and no format refuses them


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, num_hidden_layers=LAYERS)


def _drafts(head, target, prompt=(5, 6, 7, 8, 9)):
    prompt = torch.tensor(prompt)
    features = target_batch(target, head, prompt[None]).features[0, :-1]
    drafter = head.as_drafter(target)
    drafter.start(prompt, features)
    return drafter.propose(3, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))


CASES = [
    ("eagle3", {}, "speculators"),
    ("eagle3", {"draft_vocab_size": 64}, "speculators"),
    ("eagle3", {}, "sglang"),
    ("eagle3", {"draft_vocab_size": 64}, "sglang"),
    ("eagle3", {"norm_before_fc": True}, "speculators"),
    ("eagle3", {"norm_before_residual": True, "draft_vocab_size": 64}, "speculators"),
    ("peagle", {"num_steps": 3}, "speculators"),
    (
        "peagle",
        {"num_steps": 3, "draft_vocab_size": 64, "norm_before_residual": True},
        "speculators",
    ),
    ("dflash", {"num_steps": 3}, "speculators"),
    (
        "dflash",
        {"num_steps": 3, "draft_vocab_size": 64, "num_layers": 2, "mask_token_id": 9},
        "speculators",
    ),
    ("dflash", {"num_steps": 3, "markov_rank": 8, "confidence_head": True}, "speculators"),
    (
        "dflash",
        {"num_steps": 3, "draft_vocab_size": 64, "markov_rank": 8, "markov_head_type": "gated"},
        "speculators",
    ),
    ("medusa", {"num_steps": 4}, "vllm-medusa"),
    ("medusa", {"num_steps": 3, "draft_vocab_size": 64}, "vllm-medusa"),
]


LAYOUTS = {
    ("eagle3", "sglang"): "eagle",
    ("peagle", "speculators"): "speculators-peagle",
    ("dflash", "speculators"): "speculators-dflash",
}
"""The layout an export is read back as, where it is not named as the format."""


@pytest.mark.parametrize(("kind", "args", "fmt"), CASES)
def test_export_then_import_gives_the_same_drafts(kind, args, fmt, target, tmp_path):
    head = moved_head(kind, target, **args)
    export_head(head, target, tmp_path / "out", fmt, verifier="tiny")
    dspark = bool(args.get("markov_rank") or args.get("confidence_head"))
    layout = "speculators-dspark" if dspark else LAYOUTS.get((kind, fmt), fmt)
    assert foreign_layout(tmp_path / "out") == layout
    imported = import_head(tmp_path / "out", target)
    assert imported.target_feature_layers == head.target_feature_layers
    want, got = _drafts(head, target), _drafts(imported, target)
    assert len(want) >= 2  # medusa: num_steps - 1 drafted heads
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.probs, want.probs, rtol=1e-5, atol=1e-6)
    # load_drafter takes the engine folder directly too.
    drafter = load_drafter(tmp_path / "out", target)
    assert drafter.target_feature_layers == head.target_feature_layers


def test_a_peagle_export_holds_the_mask_where_speculators_reads_it(target, tmp_path):
    """speculators' P-EAGLE: mask_hidden (1, 1, 3H) and the mask token's embedding as row
    mask_token_id of the embedding table, every other row the target's."""
    head = moved_head("peagle", target, num_steps=4, mask_token_id=7)
    export_head(head, target, tmp_path / "spec", "speculators", verifier="org/tiny", draft_tokens=4)
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "peagle" and config["mask_token_id"] == 7
    assert config["speculators_config"]["algorithm"] == "peagle"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    tensors = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert torch.equal(tensors["mask_hidden"], head.mask_hidden.reshape(1, 1, -1))
    embed, own = tensors["embed_tokens.weight"], target.get_input_embeddings().weight
    assert torch.equal(embed[7], head.mask_embedding)
    others = torch.arange(own.shape[0]) != 7
    assert torch.equal(embed[others], own[others])
    assert "mask_embedding" not in tensors

    with pytest.raises(ValueError, match="blocks of 4 tokens.*--draft-tokens 4 or fewer"):
        export_head(head, target, tmp_path / "long", "speculators", verifier="t", draft_tokens=5)
    embed[3] += 1.0  # trained with its own embeddings, which draftsmith does not hold
    save_file(tensors, str(tmp_path / "spec" / "model.safetensors"))
    with pytest.raises(ValueError, match="is not the target's input embedding"):
        import_head(tmp_path / "spec", target)


def test_a_dflash_export_holds_the_block_and_only_the_heads_own_tensors(target, tmp_path):
    """speculators' DFlash: block_size K + 1, the mask token id, the feature layers in vLLM's
    numbering and the head's own tensors; of the target's shared LM head only the draft rows
    (a reduced vocabulary), no embedding table. An LM head that is not the target's, or the
    anchor-drafting variant, is refused on import."""
    head = moved_head("dflash", target, num_steps=4, draft_vocab_size=64, mask_token_id=7)
    export_head(head, target, tmp_path / "spec", "speculators", verifier="org/tiny", draft_tokens=4)
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert (config["block_size"], config["mask_token_id"], config["draft_vocab_size"]) == (5, 7, 64)
    assert config["speculators_model_type"] == config["speculators_config"]["algorithm"] == "dflash"
    assert config["aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["sample_from_anchor"] is False
    tensors = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert "embed_tokens.weight" not in tensors and "layers.0.self_attn.q_norm.weight" in tensors
    lm_head = target.get_output_embeddings().weight
    assert torch.equal(tensors["lm_head.weight"], lm_head[head.d2t])
    assert torch.equal(d2t_from_offsets(tensors["d2t"]), head.d2t)

    with pytest.raises(ValueError, match="blocks of 4 tokens.*--draft-tokens 4 or fewer"):
        export_head(head, target, tmp_path / "long", "speculators", verifier="t", draft_tokens=5)
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1.0  # trained its own LM head
    save_file(tensors, str(tmp_path / "spec" / "model.safetensors"))
    with pytest.raises(ValueError, match="is not the target's LM head"):
        import_head(tmp_path / "spec", target)
    config["sample_from_anchor"] = True
    (tmp_path / "spec" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="sample_from_anchor"):
        import_head(tmp_path / "spec", target)


def test_the_vocabulary_maps_are_offsets_and_a_mask_in_the_engines():
    d2t = torch.tensor([0, 3, 4, 9])
    assert d2t_offsets(d2t).tolist() == [0, 2, 2, 6]  # target id = draft id + offset
    assert torch.equal(d2t_from_offsets(d2t_offsets(d2t)), d2t)
    assert t2d_mask(d2t, 10).tolist() == [i in (0, 3, 4, 9) for i in range(10)]


def test_feature_layers_are_numbered_as_each_engine_numbers_them():
    """draftsmith: hidden_states index (k = input of layer k). vLLM / speculators: the same.
    SGLang adds one to what it is given, so it is written k - 1."""
    assert engine_layer_ids([2, 4, 5], LAYERS, "vllm") == [2, 4, 5]
    assert engine_layer_ids([2, 4, 5], LAYERS, "sglang") == [1, 3, 4]
    with pytest.raises(ValueError, match="after transformers' final norm"):
        engine_layer_ids([2, 4, LAYERS], LAYERS, "vllm")
    with pytest.raises(ValueError, match="sglang format cannot hold"):
        engine_layer_ids([0, 4, 5], LAYERS, "sglang")


def test_exported_configs_say_what_the_engines_read(target, tmp_path):
    head = moved_head("eagle3", target, draft_vocab_size=64)
    export_head(head, target, tmp_path / "spec", "speculators", verifier="org/tiny", draft_tokens=5)
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["norm_before_residual"] is False
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["draft_vocab_size"] == 64 and config["target_hidden_size"] == 64
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    spec = config["speculators_config"]
    assert spec["proposal_methods"][0]["speculative_tokens"] == 5
    assert spec["verifier"] == {"name_or_path": "org/tiny", "architectures": ["LlamaForCausalLM"]}
    tensors = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert "layers.0.self_attn.q_proj.weight" in tensors and "embed_tokens.weight" in tensors
    assert tensors["t2d"].dtype == torch.bool and int(tensors["t2d"].sum()) == 64
    assert torch.equal(tensors["d2t"] + torch.arange(64), head.d2t)

    export_head(head, target, tmp_path / "sgl", "sglang", verifier="org/tiny")
    config = json.loads((tmp_path / "sgl" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == 64
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    names = set(load_file(str(tmp_path / "sgl" / "model.safetensors")))
    assert "midlayer.hidden_norm.weight" in names and not any(
        n.startswith("layers.") for n in names
    )


def test_sglang_export_refuses_a_norm_before_fc_head_naming_speculators(target, tmp_path):
    """SGLang's EAGLE-3 loader skips input_norm.weight: the head would be served without it."""
    head = moved_head("eagle3", target, norm_before_fc=True)
    with pytest.raises(ValueError, match="norm_before_fc.*--format speculators"):
        export_head(head, target, tmp_path / "sgl", "sglang", verifier="t")
    assert not (tmp_path / "sgl").exists()


def test_an_imported_head_on_a_bf16_target_keeps_its_rotary_frequencies_in_float32(
    target, tmp_path
):
    head = moved_head("eagle3", target)
    export_head(head, target, tmp_path / "spec", "speculators", verifier="t")
    half = copy.deepcopy(target).to(torch.bfloat16)
    imported = import_head(tmp_path / "spec", half)
    frequencies = [b for n, b in imported.named_buffers() if n.endswith("inv_freq")]
    want = [b for n, b in head.named_buffers() if n.endswith("inv_freq")]
    assert frequencies and all(b.dtype == torch.float32 for b in frequencies)
    assert all(torch.equal(a, b) for a, b in zip(frequencies, want, strict=True))


def test_a_full_vocabulary_head_states_its_size_for_sglang(target, tmp_path):
    """SGLang reads a missing draft_vocab_size as 'use the target's LM head'."""
    export_head(moved_head("eagle3", target), target, tmp_path / "sgl", "sglang", verifier="t")
    config = json.loads((tmp_path / "sgl" / "config.json").read_text())
    assert config["draft_vocab_size"] == target.config.vocab_size


def test_the_eagle_repository_layout_imports_with_its_default_layers(target, tmp_path):
    """The EAGLE repository writes SGLang's layout without eagle_config: layers 2, N//2, N-3."""
    head = moved_head("eagle3", target, draft_vocab_size=64)
    export_head(head, target, tmp_path / "eagle", "sglang", verifier="t")
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    del config["eagle_config"]
    config["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "eagle" / "config.json").write_text(json.dumps(config))
    imported = import_head(tmp_path / "eagle", target)
    assert imported.target_feature_layers == (2, 4, 5)
    assert torch.equal(_drafts(imported, target).tokens, _drafts(head, target).tokens)


def test_the_medusa_repository_layout_imports(target, tmp_path):
    head = moved_head("medusa", target, num_steps=4)
    tensors, lm_head = {}, target.get_output_embeddings().weight.detach()
    for i, block in enumerate(head.heads[1:]):
        tensors[f"{i}.0.linear.weight"] = block.linear.weight.detach().clone()
        tensors[f"{i}.0.linear.bias"] = block.linear.bias.detach().clone()
        tensors[f"{i}.1.weight"] = lm_head.clone()
    folder = tmp_path / "medusa"
    folder.mkdir()
    save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    config = {"medusa_num_heads": 3, "medusa_num_layers": 1, "base_model_name_or_path": "t"}
    (folder / "config.json").write_text(json.dumps(config))
    imported = import_head(folder, target)
    assert torch.equal(_drafts(imported, target).tokens, _drafts(head, target).tokens)
    # Medusa-1: each head trained its own LM head, which draftsmith's Medusa cannot hold.
    tensors["1.1.weight"] = lm_head + 0.5
    save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    with pytest.raises(ValueError, match="own trained LM head"):
        import_head(folder, target)


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "args", "fmt", "message"),
    [
        ("medusa", {"num_steps": 3}, "speculators", "holds EAGLE-3 heads, not medusa"),
        ("eagle3", {}, "vllm-medusa", "holds Medusa heads, not eagle3"),
        ("eagle3", {"feature_layers": [2, 5]}, "sglang", "fuses exactly 3 target layers"),
        ("eagle3", {"feature_layers": [2, 4, LAYERS]}, "speculators", "final norm"),
        ("eagle3", {"norm_before_residual": True}, "sglang", "norm_before_residual.*speculators"),
    ],
)
def test_what_a_format_cannot_hold_is_refused_and_nothing_is_written(
    kind, args, fmt, message, target, tmp_path
):
    with pytest.raises(ValueError, match=message):
        export_head(moved_head(kind, target, **args), target, tmp_path / "out", fmt, verifier="t")
    assert list(tmp_path.iterdir()) == []  # no output folder, no temporary one


def test_an_import_for_another_target_names_the_shapes(target, tmp_path):
    export_head(moved_head("eagle3", target), target, tmp_path / "out", "speculators", verifier="t")
    wider = tiny_model("llama", seed=0, num_hidden_layers=LAYERS, hidden_size=96)
    with pytest.raises(ValueError, match="hidden_size 64 .*target: 96"):
        import_head(tmp_path / "out", wider)


def test_a_reduced_vocabulary_without_d2t_is_refused(target, tmp_path):
    export_head(
        moved_head("eagle3", target, draft_vocab_size=64),
        target,
        tmp_path / "o",
        "sglang",
        verifier="t",
    )
    weights = tmp_path / "o" / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["d2t"], tensors["t2d"]
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match="holds no d2t map"):
        import_head(tmp_path / "o", target)


@pytest.mark.parametrize(("trained", "written"), [(True, None), (False, False), (True, True)])
def test_a_speculators_norm_before_residual_is_read_as_vllm_reads_it(
    trained, written, target, tmp_path
):
    """The flag decides the residual; vLLM reads an absent one as true, and so does the import."""
    head = moved_head("eagle3", target, norm_before_residual=trained)
    export_head(head, target, tmp_path / "o", "speculators", verifier="t")
    file = tmp_path / "o" / "config.json"
    config = json.loads(file.read_text())
    assert config["norm_before_residual"] is trained
    if written is None:
        del config["norm_before_residual"]
        file.write_text(json.dumps(config))
    imported = import_head(tmp_path / "o", target)
    assert imported.config.norm_before_residual is trained
    torch.testing.assert_close(_drafts(imported, target).probs, _drafts(head, target).probs)
    other = moved_head("eagle3", target, norm_before_residual=not trained)
    assert not torch.allclose(_drafts(other, target).probs, _drafts(head, target).probs)


def test_a_pickled_checkpoint_is_refused_with_the_conversion(target, tmp_path):
    export_head(moved_head("eagle3", target), target, tmp_path / "o", "sglang", verifier="t")
    (tmp_path / "o" / "model.safetensors").rename(tmp_path / "o" / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickled checkpoint.*safetensors"):
        import_head(tmp_path / "o", target)


def test_export_and_import_commands(target, byte_tokenizer, tmp_path):
    """draftsmith export writes the engine folder from an artifact; draftsmith import turns it
    back into an artifact that loads with the same drafts."""
    from draftsmith.artifact import save_artifact

    folder = tmp_path / "tiny-target"
    target.save_pretrained(folder)
    byte_tokenizer.save_pretrained(folder)
    head = moved_head("eagle3", target, draft_vocab_size=64)
    save_artifact(head, target, tmp_path / "art", training={}, target_name_or_path=str(folder))
    main(
        [
            "export",
            str(tmp_path / "art"),
            "--format",
            "speculators",
            "--out",
            str(tmp_path / "spec"),
        ]
    )
    with pytest.raises(SystemExit):  # one line naming the problem (test_cli checks the form)
        main(
            ["export", str(tmp_path / "art"), "--format", "sglang", "--out", str(tmp_path / "spec")]
        )
    assert (tmp_path / "spec" / "config.json").is_file()  # the earlier export is untouched
    main(
        ["import", str(tmp_path / "spec"), "--target", str(folder), "--out", str(tmp_path / "back")]
    )
    back = load_drafter(tmp_path / "back", target)
    prompt = torch.tensor([5, 6, 7, 8, 9])
    features = target_batch(target, head, prompt[None]).features[0, :-1]
    back.start(prompt, features)
    want = head.as_drafter(target)
    want.start(prompt, features)
    assert torch.equal(
        back.propose(3, SamplingParams()).tokens, want.propose(3, SamplingParams()).tokens
    )


def test_calibrating_a_published_folder_asks_to_import_it_first(target, tmp_path, capsys):
    export_head(moved_head("eagle3", target), target, tmp_path / "o", "sglang", verifier="t")
    with pytest.raises(SystemExit):
        main(["calibrate", str(tmp_path / "o"), "--target", "t", "--data", "stdlib"])
    assert "import it first (draftsmith import" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["speculators", "sglang"])
def test_a_qwen2_targets_head_exports_as_the_engines_llama_layer(fmt, tmp_path):
    """The published layer has no q/k/v bias, so a Qwen2 target's EAGLE-3 layer (built from
    Qwen2's classes) is the engines' Llama layer and round-trips."""
    qwen2 = tiny_model("qwen2", seed=0, num_hidden_layers=LAYERS)
    head = moved_head("eagle3", qwen2)
    export_head(head, qwen2, tmp_path / "out", fmt, verifier="t")
    imported = import_head(tmp_path / "out", qwen2)
    assert torch.equal(_drafts(imported, qwen2).tokens, _drafts(head, qwen2).tokens)


def test_a_dspark_export_holds_the_markov_and_confidence_heads(target, tmp_path):
    """A DFlash head with DSpark's heads is written as speculators' dspark: its config fields
    and tensor names; an import reads them back, and refuses the recurrent variant it does not
    compute."""
    args = {"num_steps": 3, "markov_rank": 8, "markov_head_type": "gated", "confidence_head": True}
    head = moved_head("dflash", target, **args)
    export_head(head, target, tmp_path / "spec", "speculators", verifier="org/tiny")
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == config["speculators_config"]["algorithm"] == "dspark"
    assert (config["markov_rank"], config["markov_head_type"]) == (8, "gated")
    assert config["enable_confidence_head"] and config["confidence_head_with_markov"]
    assert config["sample_from_anchor"] is False
    tensors = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert torch.equal(tensors["markov_head.markov_w1.weight"], head.markov_head.markov_w1.weight)
    hidden = target.config.hidden_size
    assert tensors["confidence_head.proj.weight"].shape == (1, hidden + 8)  # with W1's row
    assert "markov_head.gate_proj.bias" in tensors
    imported = import_head(tmp_path / "spec", target)
    assert imported.config.markov_rank == 8 and imported.confidence_head is not None

    config["markov_head_type"] = "rnn"
    (tmp_path / "spec" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="markov_head_type 'rnn' is a DSpark variant"):
        import_head(tmp_path / "spec", target)
