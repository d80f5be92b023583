"""The data pipeline: sources, the document split, chat masks, packing, saving, regeneration.

Fast tests use a byte-level BPE tokenizer trained here in milliseconds with a ChatML template;
the `slow` test uses SmolLM2's real tokenizer on real stdlib and chitchat data.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import datasets
import pytest
import torch
from conftest import tiny_model
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from draftsmith.core.config import config_from_dict
from draftsmith.data import chitchat, corpora
from draftsmith.data import regenerate as regenerate_module
from draftsmith.data.documents import (
    METADATA_FILE,
    DataConfig,
    SourceError,
    build_dataset,
    document_split,
    load_documents,
    pack,
    prepare_data,
    stdlib_split,
)
from draftsmith.data.encoding import ChatTemplateError, encode_chat, encode_completion
from draftsmith.data.regenerate import (
    RegenerateConfig,
    Shard,
    completed_ids,
    continue_texts,
    merge_parts,
    parts_dir,
    regenerate,
    text_prompts,
)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "Hello there! How are you doing today? I am fine, thanks.",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say hi"},
    {"role": "assistant", "content": "hi"},
    {"role": "user", "content": "hi? Now some code, with ünïcode 🙂"},
    {"role": "assistant", "content": " def f(x):\n    return x\n"},
    {"role": "user", "content": "thanks"},
]


def make_tokenizer(template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """A 291-token byte-level BPE with ChatML special tokens: decode(encode(s)) == s."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 10, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=template,
    )


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path, monkeypatch):
    """datasets' Arrow cache and the hub stay out of the home folder; the hub is offline."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """Maximal runs of consecutive masked tokens."""
    runs, current = [], []
    for token, flag in zip(ids, mask, strict=True):
        if flag:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


# --------------------------------------------------------------------------------------------
# Chat rendering and the assistant mask
# --------------------------------------------------------------------------------------------


def test_chat_mask_is_exactly_the_assistant_text_and_end_of_turn(tok):
    ids, mask = encode_chat(CONVERSATION, tok)
    assert len(ids) == len(mask)
    assert tok.decode(ids) == tok.apply_chat_template(CONVERSATION, tokenize=False)
    answers = [m["content"] for m in CONVERSATION if m["role"] == "assistant"]
    # "hi" also appears in the user turns before it: only the assistant's copy is masked.
    assert [tok.decode(run) for run in masked_runs(ids, mask)] == [
        a + "<|im_end|>" for a in answers
    ]


def test_chat_mask_all_tokens_when_asked(tok):
    ids, mask = encode_chat(CONVERSATION, tok, assistant_only_loss=False)
    assert mask == [1] * len(ids)


def test_chat_errors_name_the_problem(tok):
    with pytest.raises(ChatTemplateError, match="no chat template"):
        encode_chat(CONVERSATION, make_tokenizer(template=None))
    # A template that rewrites what the assistant said cannot be masked verbatim.
    shouting = make_tokenizer(CHATML.replace("message['content']", "message['content'].upper()"))
    with pytest.raises(ChatTemplateError, match="verbatim"):
        encode_chat(CONVERSATION, shouting)


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    seq_len=st.integers(2, 17),
    masked=st.booleans(),
)
def test_pack_rows_have_seq_len_and_keep_every_token_in_order(lengths, seq_len, masked):
    docs, token = [], 1
    for n in lengths:
        docs.append((list(range(token, token + n)), [int(masked or i % 2) for i in range(n)]))
        token += n
    rows = list(pack(docs, seq_len, pad_id=0))
    assert all(len(ids) == len(mask) == seq_len for ids, mask in rows)
    stream = [t for ids, _ in rows for t in ids]
    flags = [f for _, mask in rows for f in mask]
    tokens = [t for ids, _ in docs for t in ids]
    targets = [f for _, mask in docs for f in mask]
    kept = min(len(tokens), len(stream))
    assert stream[:kept] == tokens[:kept] and flags[:kept] == targets[:kept]  # order kept
    assert not any(targets[kept:])  # only a tail without targets may be dropped
    assert set(stream[kept:]) <= {0} and not any(flags[kept:])  # padding is never a target
    assert len(stream) - kept < seq_len


def test_text_documents_are_packed_with_eos_between(tmp_path, tok):
    texts = [f"doc {i}: " + CORPUS[i % 3] * (1 + i % 4) for i in range(30)]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    config = DataConfig(source=str(source), seq_len=16, heldout_fraction=0.2)
    rows = build_dataset(config, tok)
    assert len(rows) > 0
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) == 16 for r in rows)
    stream = [t for r in rows for t in r["input_ids"]]
    decoded = tok.decode(stream).replace("<|endoftext|>", "")  # the last row's padding
    pieces = decoded.split("<|im_end|>")
    assert pieces[-1] == ""  # the stream ends with the last document's EOS
    train_texts = {
        t for t in texts if document_split(corpora._content_key(t, None), 0.2) == "train"
    }
    assert set(pieces[:-1]) == train_texts and len(pieces) - 1 == len(train_texts)


def test_max_tokens_and_max_documents(tmp_path, tok):
    source = write_jsonl(tmp_path / "d.jsonl", [{"text": CORPUS[i % 3] * 5} for i in range(40)])
    rows = build_dataset(DataConfig(source=str(source), seq_len=8, max_tokens=50), tok)
    assert len(rows) == 50 // 8
    docs = load_documents(DataConfig(source=str(source), max_documents=3))
    assert len(docs) == 3


def test_chat_records_build_with_masks(tmp_path, tok):
    records = [{"id": f"c{i}", "messages": CONVERSATION} for i in range(6)]
    source = write_jsonl(tmp_path / "chat.jsonl", records)
    rows = build_dataset(DataConfig(source=str(source), seq_len=32, heldout_fraction=0.0), tok)
    ids = [t for r in rows for t in r["input_ids"]]
    mask = [f for r in rows for f in r["loss_mask"]]
    answers = [m["content"] + "<|im_end|>" for m in CONVERSATION if m["role"] == "assistant"]
    assert [tok.decode(run) for run in masked_runs(ids, mask)] == answers * 6


# --------------------------------------------------------------------------------------------
# The split
# --------------------------------------------------------------------------------------------


def test_no_document_in_both_splits(tmp_path):
    records = [{"id": i, "text": f"document number {i}"} for i in range(300)]
    records += [{"text": "a duplicate without an id"}] * 5
    source = str(write_jsonl(tmp_path / "docs.jsonl", records))
    train = load_documents(DataConfig(source=source, split="train", heldout_fraction=0.25))
    heldout = load_documents(DataConfig(source=source, split="heldout", heldout_fraction=0.25))
    assert not set(train["text"]) & set(heldout["text"])
    assert len(train) + len(heldout) == len(records)
    assert 0.15 < len(heldout) / len(records) < 0.35
    # The seed reorders documents but never moves one across the split.
    reseeded = load_documents(DataConfig(source=source, seed=7, heldout_fraction=0.25))
    assert sorted(reseeded["id"]) == sorted(train["id"]) and reseeded["id"] != train["id"]


@given(key=st.text(min_size=1), low=st.floats(0, 0.99), high=st.floats(0, 0.99))
def test_document_split_is_monotone_in_the_fraction(key, low, high):
    low, high = sorted((low, high))
    if document_split(key, low) == "heldout":
        assert document_split(key, high) == "heldout"


def test_stdlib_split_is_by_module_and_stable():
    # Pinned: these must never move, or held-out benchmark prompts would leak into training.
    assert [stdlib_split(p) for p in ("ast.py", "collections/__init__.py", "enum.py")] == [
        "heldout"
    ] * 3
    assert [stdlib_split(p) for p in ("os.py", "json/decoder.py", "argparse.py")] == ["train"] * 3
    heldout = load_documents(DataConfig(source="stdlib", split="heldout"))
    train = load_documents(DataConfig(source="stdlib", split="train"))
    assert {stdlib_split(m) for m in heldout["id"]} == {"heldout"}
    assert {stdlib_split(m) for m in train["id"]} == {"train"}
    assert not set(heldout["id"]) & set(train["id"])
    assert 0.05 < len(heldout) / (len(heldout) + len(train)) < 0.15
    assert not any(corpora.is_stdlib_test(m) for m in train["id"])
    assert all(m.endswith(".py") and "site-packages" not in m for m in train["id"])


def test_stdlib_tests_are_a_flag():
    assert corpora.is_stdlib_test("test/test_os.py")
    assert corpora.is_stdlib_test("idlelib/idle_test/test_calltip.py")
    assert corpora.is_stdlib_test("ctypes/test/__init__.py")
    assert not corpora.is_stdlib_test("unittest/case.py")
    with_tests = corpora.stdlib_files(include_tests=True)
    without = corpora.stdlib_files()
    assert set(without) < set(with_tests)
    assert "test/test_os.py" in with_tests and "test/test_os.py" not in without


# --------------------------------------------------------------------------------------------
# Sources and their errors
# --------------------------------------------------------------------------------------------


def test_empty_and_missing_sources_are_clear_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SourceError, match="empty.jsonl"):
        load_documents(DataConfig(source=str(empty)))
    with pytest.raises(SourceError, match="does not exist"):
        load_documents(DataConfig(source=str(tmp_path / "nope.jsonl")))
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"body": "x"}])
    with pytest.raises(SourceError, match="'text' column"):
        load_documents(DataConfig(source=str(wrong)))
    one = write_jsonl(tmp_path / "one.jsonl", [{"id": "a", "text": "x"}])
    with pytest.raises(SourceError, match="none in split 'heldout'"):
        load_documents(DataConfig(source=str(one), split="heldout", heldout_fraction=0.0))


def test_a_list_of_sources_mixes_their_documents(tmp_path, tok):
    """Code continuations and chat records (different columns) train together."""
    code = write_jsonl(
        tmp_path / "code.jsonl", [{"id": "m.py#0", "prompt": "def f", "completion": "(): pass"}]
    )
    chat = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {
                "id": "c/1",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                ],
            }
        ],
    )
    config = config_from_dict(
        DataConfig, {"source": [str(code), str(chat)], "heldout_fraction": 0.0, "seq_len": 8}
    )
    documents = load_documents(config)
    assert sorted(documents["id"]) == ["c/1", "m.py#0"]
    assert len(build_dataset(config, tok)) >= 1
    with pytest.raises(SourceError, match="empty list"):
        load_documents(DataConfig(source=[]))


def test_chat_without_assistant_turns_has_nothing_to_train_on(tmp_path, tok):
    records = [{"id": "u", "messages": [{"role": "user", "content": "anyone?"}]}]
    source = write_jsonl(tmp_path / "lonely.jsonl", records)
    with pytest.raises(SourceError, match="no token to train on"):
        build_dataset(DataConfig(source=str(source), seq_len=8, heldout_fraction=0.0), tok)


def test_hub_name_offline_is_a_clear_error():
    with pytest.raises(SourceError, match="Hugging Face hub.*offline source"):
        load_documents(DataConfig(source="someone/some-dataset"))


def test_text_files_and_sharegpt_records(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("first paragraph\nstill first\n\n\n\nsecond paragraph\n")
    (folder / "b.txt").write_text("another file\n")
    by_file = load_documents(DataConfig(source=str(folder), heldout_fraction=0.0))
    assert len(by_file) == 2
    by_paragraph = DataConfig(source=str(folder), heldout_fraction=0.0, text_sample_by="paragraph")
    assert len(load_documents(by_paragraph)) == 3
    by_line = DataConfig(source=str(folder), heldout_fraction=0.0, text_sample_by="line")
    assert sorted(load_documents(by_line)["text"]) == [
        "another file",
        "first paragraph",
        "second paragraph",
        "still first",
    ]  # blank lines are no documents
    share = [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]
    docs = load_documents(
        DataConfig(source=str(write_jsonl(tmp_path / "s.jsonl", share)), heldout_fraction=0.0)
    )
    assert docs[0]["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]


def test_chitchat_conversations_become_alternating_chat_records(tmp_path):
    def utterance(sender, text):
        return {"text": text, "sender": sender, "timestamp": "2018-05-02T19:38:15Z"}

    data = {
        "conv-a": {
            "messages": [
                [utterance("A", "Hello"), utterance("A", "How are you?")],
                [utterance("B", "fine"), utterance("B", "  ")],
                [utterance("A", "")],  # an empty turn: B's runs on both sides merge
                [utterance("B", "and you?")],
                [utterance("A", "good, bye")],  # trailing user turn: nothing answers it
            ],
            "start": "2018-05-02T19:38:15Z",
        },
        "conv-b": {"messages": [[utterance("C", "anyone there?")]], "start": "x"},
    }
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps(data))
    records = list(chitchat.chitchat_records(path))
    assert records == [
        {
            "id": "conv-a",
            "text": None,
            "prompt": None,
            "messages": [
                {"role": "user", "content": "Hello\nHow are you?"},
                {"role": "assistant", "content": "fine\nand you?"},
            ],
        }
    ]


def test_chitchat_transcripts_are_text_documents_as_the_bench_writes_chat(tmp_path, monkeypatch):
    data = {
        "conv-a": {
            "messages": [
                [{"text": "Hi\nthere", "sender": "A", "timestamp": "t"}],
                [{"text": "hello", "sender": "B", "timestamp": "t"}],
                [{"text": "bye", "sender": "A", "timestamp": "t"}],
            ]
        }
    }
    cached = tmp_path / "data" / "chitchat-dataset-0.9.0" / "dataset.json"
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps(data))
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    documents = corpora.load_source("chitchat-transcripts")
    assert documents["id"] == ["conv-a"]
    assert documents[0]["text"] == "A: Hi there\nB: hello\nA: bye"
    assert documents[0]["messages"] is None


def test_chitchat_cache_is_used_without_pip(tmp_path, monkeypatch):
    cached = tmp_path / "data" / "chitchat-dataset-0.9.0" / "dataset.json"
    cached.parent.mkdir(parents=True)
    cached.write_text("{}")

    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run when the file is cached")

    monkeypatch.setattr(chitchat.subprocess, "run", no_pip)
    assert chitchat.chitchat_path(tmp_path) == cached


# --------------------------------------------------------------------------------------------
# Saving and the command line
# --------------------------------------------------------------------------------------------


def test_prepare_data_saves_atomically_and_refuses_to_clobber(tmp_path, tok, capsys):
    source = write_jsonl(tmp_path / "d.jsonl", [{"text": CORPUS[i % 3]} for i in range(20)])
    config = DataConfig(source=str(source), seq_len=16, heldout_fraction=0.0)
    out = prepare_data(config, tok, tmp_path / "out")
    rows = Dataset.load_from_disk(str(out))
    assert rows.column_names == ["input_ids", "loss_mask"] and len(rows) > 0
    metadata = json.loads((out / METADATA_FILE).read_text())
    assert metadata["tokens"] == len(rows) * 16 and metadata["config"]["seq_len"] == 16
    assert f"{metadata['tokens']:,} tokens" in capsys.readouterr().out
    with pytest.raises(FileExistsError, match="overwrite"):
        prepare_data(config, tok, out)
    shorter = DataConfig(source=str(source), seq_len=8, heldout_fraction=0.0)
    prepare_data(shorter, tok, out, overwrite=True)
    assert len(Dataset.load_from_disk(str(out))[0]["input_ids"]) == 8
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out"]


def test_cli_hook_parses_and_runs(tmp_path, tok, capsys):
    from draftsmith.commands.cli import main

    tok.save_pretrained(tmp_path / "target")
    source = write_jsonl(tmp_path / "d.jsonl", [{"text": CORPUS[i % 3]} for i in range(20)])
    with pytest.raises(SystemExit):
        main(["prepare-data", "--help"])
    assert "Tokens per packed row" in capsys.readouterr().out
    command = f"--target {tmp_path / 'target'} --source {source} --out {tmp_path / 'out'} "
    main(
        [
            "prepare-data",
            *(command + "--seq-len 12 --heldout-fraction 0 --no-include-tests").split(),
        ]
    )
    assert len(Dataset.load_from_disk(str(tmp_path / "out"))[0]["input_ids"]) == 12


# --------------------------------------------------------------------------------------------
# Regeneration
# --------------------------------------------------------------------------------------------


@pytest.fixture
def one_thread():
    """Tiny matrices gain nothing from threads, and on a busy 2-core machine OpenMP's waiting
    threads make each forward 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_regenerate_keeps_the_first_max_turns_answers(tmp_path, tok):
    model = tiny_model("qwen2", seed=5, vocab_size=len(tok))
    records = [{"id": "c", "messages": CONVERSATION + CONVERSATION[2:4]}]  # 3 assistant turns
    config = RegenerateConfig(max_new_tokens=4, batch_size=1)
    regenerate(records, model, tok, tmp_path / "all.jsonl", config)
    regenerate(records, model, tok, tmp_path / "one.jsonl", replace(config, max_turns=1))
    full = json.loads((tmp_path / "all.jsonl").read_text())["messages"]
    cut = json.loads((tmp_path / "one.jsonl").read_text())["messages"]
    assert [m["role"] for m in full].count("assistant") == 3
    assert cut == full[:3]  # system, user, the first answer (the same text), nothing after


@pytest.mark.usefixtures("one_thread")
def test_regenerate_resumes_without_duplicates(tmp_path, tok):
    model = tiny_model("qwen2", seed=5, vocab_size=len(tok))
    records = [
        {"id": f"r{i}", "messages": CONVERSATION[1:5] + [{"role": "user", "content": str(i)}]}
        for i in range(5)
    ]
    config = RegenerateConfig(max_new_tokens=6, batch_size=2)
    resumed, straight = tmp_path / "resumed.jsonl", tmp_path / "straight.jsonl"

    first = regenerate(records, model, tok, resumed, replace(config, max_records=2))
    assert first == 2 and completed_ids(resumed) == {"r0", "r1"}
    with resumed.open("a") as handle:  # a kill in the middle of the next write
        handle.write('{"id": "r2", "messa')
    assert regenerate(records, model, tok, resumed, replace(config, max_records=2)) == 0
    assert regenerate(records, model, tok, resumed, replace(config, max_records=4)) == 2
    assert regenerate(records, model, tok, resumed, config) == 1
    assert regenerate(records, model, tok, resumed, config) == 0

    lines = [json.loads(line) for line in resumed.read_text().splitlines()]
    assert [r["id"] for r in lines] == [f"r{i}" for i in range(5)]
    for original, new in zip(records, lines, strict=True):
        assert [m["role"] for m in new["messages"]] == [m["role"] for m in original["messages"]]
        users = [m for m in new["messages"] if m["role"] == "user"]
        assert users == [m for m in original["messages"] if m["role"] == "user"]
    # Stopping and resuming gives what one uninterrupted run gives (greedy, same batches).
    regenerate(records, model, tok, straight, config)
    assert straight.read_text() == resumed.read_text()


def test_derived_records_stay_in_their_documents_split():
    keys = [f"module_{i}.py" for i in range(200)]
    assert {document_split(f"{k}#3") for k in keys} == {"train", "heldout"}
    for key in keys:
        assert document_split(f"{key}#0") == document_split(f"{key}#17") == document_split(key)


CODE = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12))


def test_text_prompts_are_disjoint_line_windows_fixed_by_the_document(tok):
    document = {"id": "m.py", "text": CODE, "messages": None}
    config = RegenerateConfig(prompt_tokens=12, prompts_per_document=3)
    prompts = list(text_prompts(document, tok, config))
    assert [key for key, _ in prompts] == ["m.py#0", "m.py#1", "m.py#2"]
    lines = CODE.splitlines(keepends=True)
    spans = []
    for _, prompt in prompts:
        assert prompt.strip() and prompt[0] != "\n"
        assert len(tok(prompt, add_special_tokens=False)["input_ids"]) >= 12
        start = next(i for i in range(len(lines)) if "".join(lines[i:]).startswith(prompt))
        spans.append((start, start + len(prompt.splitlines())))
        assert spans[-1][1] < len(lines)  # something is left to continue
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert list(text_prompts(document, tok, config)) == prompts
    more = list(text_prompts(document, tok, replace(config, prompts_per_document=4)))
    assert more[:3] == prompts  # asking for more keeps the ids already written
    other = list(text_prompts(document, tok, replace(config, seed=1)))
    assert other != prompts
    assert list(text_prompts({"id": "s", "text": "x = 1\n"}, tok, config)) == []
    with pytest.raises(ValueError, match="regenerate"):
        list(text_prompts({"id": "c", "text": None, "messages": CONVERSATION}, tok, config))


def test_text_prompts_skip_a_window_longer_than_the_cap(tok):
    """A line too long to cut at a line boundary would pad its whole batch to its length."""
    long_line = "x = [" + ", ".join(str(i) for i in range(400)) + "]\n"
    document = {"id": "m.py", "text": long_line + CODE, "messages": None}
    config = RegenerateConfig(prompt_tokens=12, prompts_per_document=50)
    longest = 4 * config.prompt_tokens
    prompts = [prompt for _, prompt in text_prompts(document, tok, config)]
    assert prompts and all(
        len(tok(p, add_special_tokens=False)["input_ids"]) <= longest for p in prompts
    )
    assert not any(p.startswith("x = [") for p in prompts)
    uncapped = replace(config, max_prompt_tokens=10_000)
    assert any(p.startswith("x = [") for _, p in text_prompts(document, tok, uncapped))


def test_continue_texts_batches_prompts_of_similar_length(tmp_path, tok, monkeypatch):
    batches = []

    def fake_generate(prompts, *args, **kwargs):
        batches.append([len(p) for p in prompts])
        return ["" for _ in prompts]

    monkeypatch.setattr(regenerate_module, "_generate", fake_generate)
    documents = [
        {"id": f"d{i}", "text": "\n".join(["y" * (5 + 40 * (i % 3))] * 6) + "\n", "messages": None}
        for i in range(6)
    ]
    config = RegenerateConfig(
        prompt_tokens=1, max_prompt_tokens=1_000, prompts_per_document=1, batch_size=2
    )
    assert continue_texts(documents, None, tok, tmp_path / "out.jsonl", config) == 6
    assert [length for batch in batches for length in batch] == sorted(
        length for batch in batches for length in batch
    )
    assert all(len(set(batch)) == 1 for batch in batches)  # each batch one length here


def test_completion_mask_is_exactly_the_completion(tok):
    ids, mask = encode_completion("def add(a, b):\n", "    return a + b\n", tok)
    runs = masked_runs(ids, mask)
    assert len(runs) == 1 and tok.decode(runs[0]) == "    return a + b\n"
    assert ids[-1] == tok.eos_token_id and mask[-1] == 0
    assert tok.decode(ids[: mask.index(1)]) == "def add(a, b):\n"
    _, every = encode_completion(
        "def add(a, b):\n", "    return a + b\n", tok, assistant_only_loss=False
    )
    assert set(every) == {1}


@pytest.mark.usefixtures("one_thread")
def test_continue_texts_writes_records_the_pipeline_trains_on(tmp_path, tok):
    model = tiny_model("qwen2", seed=5, vocab_size=len(tok))
    documents = [{"id": f"m{i}.py", "text": CODE, "messages": None} for i in range(3)]
    config = RegenerateConfig(
        max_new_tokens=5, batch_size=2, prompt_tokens=12, prompts_per_document=2
    )
    out = tmp_path / "continued.jsonl"
    assert continue_texts(documents, model, tok, out, replace(config, max_records=3)) == 3
    assert continue_texts(documents, model, tok, out, config) == 3
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["id"] for r in records]  # batched by length, so in that order within a call
    assert sorted(ids) == [f"m{i}.py#{n}" for i in range(3) for n in range(2)]
    for record in records:
        ids = tok(record["prompt"], return_tensors="pt")["input_ids"]
        expected = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=5,
            do_sample=False,
            pad_token_id=0,
        )
        assert record["completion"] == tok.decode(
            expected[0, ids.shape[1] :], skip_special_tokens=True
        )

    rows = build_dataset(DataConfig(source=str(out), seq_len=16, heldout_fraction=0.0), tok)
    ids = [t for row in rows["input_ids"] for t in row]
    mask = [m for row in rows["loss_mask"] for m in row]
    completions = [tok.decode(run) for run in masked_runs(ids, mask)]
    assert sorted(completions) == sorted(r["completion"] for r in records)  # shuffled documents


@pytest.mark.usefixtures("one_thread")
def test_regenerate_command_continues_text_and_answers_chat(tmp_path, tok):
    from draftsmith.commands.cli import main

    target = tmp_path / "target"
    tiny_model("qwen2", seed=5, vocab_size=len(tok)).save_pretrained(target)
    tok.save_pretrained(target)
    records = [{"id": f"code{i}", "text": CODE} for i in range(2)]
    records.append({"id": "chat", "messages": CONVERSATION})
    source = write_jsonl(tmp_path / "mixed.jsonl", records)
    out = tmp_path / "out.jsonl"
    command = ["regenerate", "--target", str(target), "--source", str(source)]
    command += ["--out", str(out), "--max-new-tokens", "4", "--prompt-tokens", "12"]
    main([*command, "--prompts-per-document", "2", "--dtype", "float32"])
    main([*command, "--prompts-per-document", "2"])  # a second run finds everything written
    written = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = sorted("messages" if "messages" in r else "completion" for r in written)
    # both documents of the train split are cut twice, the conversation answered, once only
    train_docs = [r["id"] for r in records if document_split(r["id"]) == "train"]
    assert len(written) == len({r["id"] for r in written})
    assert kinds.count("completion") == 2 * sum(d.startswith("code") for d in train_docs)
    assert kinds.count("messages") == ("chat" in train_docs)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("sample", [False, True])
def test_shared_regeneration_writes_what_one_process_writes(tmp_path, tok, sample):
    model = tiny_model("qwen2", seed=5, vocab_size=len(tok))
    chats = [
        {"id": f"c{i}", "messages": CONVERSATION[1:3] + [{"role": "user", "content": str(i)}]}
        for i in range(3)
    ]
    texts = [{"id": f"m{i}.py", "text": CODE, "messages": None} for i in range(3)]
    config = RegenerateConfig(
        max_new_tokens=4, batch_size=2, prompt_tokens=12, prompts_per_document=2, do_sample=sample
    )

    def write(out, shard=None):  # as `draftsmith regenerate` does: chat, then text
        regenerate(chats, model, tok, out, config, shard)
        continue_texts(texts, model, tok, out, config, shard)

    one, shared = tmp_path / "one.jsonl", tmp_path / "shared.jsonl"
    write(one)
    for index in (1, 0):  # 3 chat and 6 text records in batches of 2: shards of unequal size
        write(shared, Shard(index, 2))
    assert not shared.exists() or shared.read_text() == ""  # the shards write their parts only
    assert sorted(p.name for p in parts_dir(shared).iterdir())[:2] == [
        "chat-000000.jsonl",
        "chat-000001.jsonl",
    ]
    assert merge_parts(shared) == 9
    assert shared.read_text() == one.read_text()
    assert not parts_dir(shared).exists() and merge_parts(shared) == 0


@pytest.mark.usefixtures("one_thread")
def test_an_interrupted_shared_regeneration_resumes_without_duplicates(tmp_path, tok):
    model = tiny_model("qwen2", seed=5, vocab_size=len(tok))
    texts = [{"id": f"m{i}.py", "text": CODE, "messages": None} for i in range(3)]
    config = RegenerateConfig(max_new_tokens=4, batch_size=2, prompt_tokens=12)
    out, straight = tmp_path / "out.jsonl", tmp_path / "straight.jsonl"
    continue_texts(texts, model, tok, straight, config)
    every = completed_ids(straight)
    continue_texts(texts, model, tok, out, config, Shard(0, 3))  # shards 1 and 2 were killed
    first = {json.loads(line)["id"] for p in parts_dir(out).iterdir() for line in p.open()}
    assert 0 < merge_parts(out) == len(first) < len(every)  # the next run saves them first
    for index in range(3):
        continue_texts(texts, model, tok, out, config, Shard(index, 3))
    assert merge_parts(out) == len(every) - len(first)
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert len(ids) == len(set(ids)) and set(ids) == every
    # A merge cut short by a kill leaves parts whose records --out already holds: not twice.
    part = parts_dir(out) / "text-000000.jsonl"
    part.parent.mkdir()
    part.write_text(out.read_text().splitlines(keepends=True)[0])
    assert merge_parts(out) == 0 and len(out.read_text().splitlines()) == len(every)


@pytest.mark.usefixtures("one_thread")
def test_regenerate_command_in_two_processes_writes_what_one_writes(tmp_path, tok):
    from draftsmith.commands.cli import main

    target = tmp_path / "target"
    tiny_model("qwen2", seed=5, vocab_size=len(tok)).save_pretrained(target)
    tok.save_pretrained(target)
    source = write_jsonl(
        tmp_path / "code.jsonl", [{"id": f"code{i}", "text": CODE} for i in range(12)]
    )
    command = ["regenerate", "--target", str(target), "--source", str(source), "--split", "train"]
    command += ["--max-new-tokens", "4", "--prompt-tokens", "12", "--batch-size", "2"]
    command += ["--dtype", "float32"]
    main([*command, "--out", str(tmp_path / "one.jsonl")])
    main([*command, "--out", str(tmp_path / "two.jsonl"), "--processes", "2"])
    one, two = (tmp_path / "one.jsonl").read_text(), (tmp_path / "two.jsonl").read_text()
    assert one and two == one
    assert not parts_dir(tmp_path / "two.jsonl").exists()


# --------------------------------------------------------------------------------------------
# Real tokenizer, real data
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_smollm2_tokenizer_on_stdlib_and_chitchat(monkeypatch):
    from transformers import AutoTokenizer

    from draftsmith.core.home import default_home
    from draftsmith.zoo import fetch_model

    monkeypatch.undo()  # the real cache, so chitchat is fetched once
    tok = AutoTokenizer.from_pretrained(fetch_model("smollm2-135m", home=default_home()))
    code_config = DataConfig(source="stdlib", split="heldout", seq_len=512, max_tokens=8192)
    code = build_dataset(code_config, tok)
    assert len(code) == 16 and all(sum(r["loss_mask"]) == 512 for r in code)
    assert "def " in tok.decode(code[0]["input_ids"])

    config = DataConfig(source="chitchat", split="heldout", seq_len=512, max_documents=20)
    chat = build_dataset(config, tok)
    ids = [t for r in chat for t in r["input_ids"]]
    mask = [f for r in chat for f in r["loss_mask"]]
    answers = [
        m["content"] + "<|im_end|>"
        for messages in load_documents(config)["messages"]
        for m in messages
        if m["role"] == "assistant"
    ]
    assert [tok.decode(run) for run in masked_runs(ids, mask)] == answers
