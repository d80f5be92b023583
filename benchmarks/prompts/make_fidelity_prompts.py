"""Build the lossy-verification fidelity prompts, ``benchmarks/prompts/fidelity/{translation,
summarisation}.jsonl``: tasks with references, from text installed on a Debian machine that no
training or calibration set of ours used (those are stdlib code and chitchat).

    python benchmarks/prompts/make_fidelity_prompts.py            # rewrites the files, prints a summary
    python benchmarks/prompts/make_fidelity_prompts.py --check    # exits 1 if a committed file differs

Each line is ``{"prompt", "workload", "reference", "source"}``, a one-shot raw-text prompt whose
answer is one line (no chat template):

- ``translation``: English -> French, German and Spanish, `PER_LANGUAGE` each (languages
  taking turns, so a prefix of the file mixes them): the message
  catalogues under /usr/share/locale (``LC_MESSAGES/*.mo``, the translators' msgid/msgstr
  pairs: real parallel sentences with the translation as reference). Whole sentences of 8+
  words without format directives or markup, at most one per catalogue per language.
- ``summarisation``: Debian package descriptions from /var/lib/dpkg/status: the long
  description is the text, the synopsis line its reference summary. Libraries, -dev, -doc,
  -common and -data packages are skipped (their descriptions are boilerplate).

Deterministic: candidates are ordered by the sha1 of their source name and the first that fit
are taken; the first candidate left over is each prompt's worked example. The result depends on
the installed packages (these: Debian 12 with the project's build machine's packages).
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from pathlib import Path

from make_bench_prompts import stable_order

LOCALE = Path("/usr/share/locale")
DPKG_STATUS = Path("/var/lib/dpkg/status")
OUT = Path(__file__).resolve().parent / "fidelity"
LANGUAGES = {"fr": "French", "de": "German", "es": "Spanish"}
PER_LANGUAGE = 4
SUMMARIES = 10
MARKUP = set("%{}<>\\`|=_\n\t")
SKIPPED_PACKAGES = re.compile(r"^lib|-(dev|doc|common|data)$")


def read_mo(path: Path) -> dict[str, str]:
    """msgid -> msgstr of a GNU .mo catalogue (singular, context-free messages only)."""
    data = path.read_bytes()
    order = "<" if data[:4] == b"\xde\x12\x04\x95" else ">"
    count, originals, translations = struct.unpack(order + "3I", data[8:20])

    def string(table: int, i: int) -> bytes:
        length, offset = struct.unpack(order + "2I", data[table + 8 * i : table + 8 * i + 8])
        return data[offset : offset + length]

    pairs = [(string(originals, i), string(translations, i)) for i in range(count)]
    header = dict(pairs).get(b"", b"").decode("ascii", "replace")
    charset = re.search(r"charset=([\w-]+)", header)
    encoding = charset.group(1) if charset else "utf-8"
    # Plural forms (NUL-separated) and contexts (EOT) are not plain sentence pairs.
    return {
        key.decode(encoding): value.decode(encoding)
        for key, value in pairs
        if key and value and b"\x00" not in key + value and b"\x04" not in key
    }


def is_sentence(text: str) -> bool:
    return (
        40 <= len(text) <= 200
        and text[0].isupper()
        and text.endswith(".")
        and len(text.split()) >= 8
        and not MARKUP & set(text)
        and "  " not in text
    )


def translation_prompts() -> list[dict]:
    """`PER_LANGUAGE` prompts per language, languages taking turns (so a prefix mixes them)."""
    per_language = []
    for code, language in LANGUAGES.items():
        catalogues = {p.stem: p for p in (LOCALE / code / "LC_MESSAGES").glob("*.mo")}
        picked = []  # (domain, english, translation): one per catalogue
        for domain, path in stable_order(list(catalogues.items())):
            pairs = [
                (f"{code}:{domain}:{en}", (en, tr))
                for en, tr in read_mo(path).items()
                if is_sentence(en) and is_sentence(tr)
            ]
            if pairs:
                picked.append((domain, *stable_order(pairs)[0][1]))
        _, example_en, example_tr = picked[PER_LANGUAGE]
        per_language.append(
            [
                {
                    "prompt": (
                        f"Translate English to {language}.\n\n"
                        f"English: {example_en}\n{language}: {example_tr}\n\n"
                        f"English: {english}\n{language}:"
                    ),
                    "workload": "translation",
                    "reference": translation,
                    "source": f"locale:{code}/{domain}.mo",
                }
                for domain, english, translation in picked[:PER_LANGUAGE]
            ]
        )
    return [record for turn in zip(*per_language, strict=True) for record in turn]


def package_descriptions() -> dict[str, tuple[str, str]]:
    """package -> (long description as text, synopsis) from the dpkg status file."""
    found = {}
    for stanza in DPKG_STATUS.read_text().split("\n\n"):
        name = re.search(r"^Package: (\S+)", stanza, re.M)
        description = re.search(r"^Description: (.*)\n((?: .*(?:\n|$))*)", stanza, re.M)
        if not (name and description) or SKIPPED_PACKAGES.search(name.group(1)):
            continue
        # Continuation lines start with a space; " ." separates paragraphs.
        paragraphs = " ".join(line.strip() for line in description.group(2).splitlines())
        text = "\n".join(p.strip() for p in paragraphs.split(" . ") if p.strip())
        found[name.group(1)] = (text.removesuffix(" ."), description.group(1).strip())
    return found


def summarisation_prompts() -> list[dict]:
    packages = package_descriptions()
    fit = [
        name
        for name, (text, synopsis) in stable_order(list(packages.items()))
        if 300 <= len(text) <= 900 and len(synopsis.split()) >= 3
    ]
    # Packages of one source share descriptions: keep the first of each synopsis.
    synopses, unique = set(), []
    for name in fit:
        if packages[name][1].lower() not in synopses:
            synopses.add(packages[name][1].lower())
            unique.append(name)
    example = packages[unique[SUMMARIES]]
    records = []
    for name in unique[:SUMMARIES]:
        text, synopsis = packages[name]
        prompt = (
            "Summarise each software package description in one line.\n\n"
            f"Description: {example[0]}\nSummary: {example[1]}\n\n"
            f"Description: {text}\nSummary:"
        )
        records.append(
            {
                "prompt": prompt,
                "workload": "summarisation",
                "reference": synopsis,
                "source": f"dpkg:{name}",
            }
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files")
    args = parser.parse_args()
    differ = False
    for name, records in [
        ("translation", translation_prompts()),
        ("summarisation", summarisation_prompts()),
    ]:
        path = OUT / f"{name}.jsonl"
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        if args.check:
            differ |= not path.is_file() or path.read_text() != text
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        sources = ", ".join(r["source"] for r in records)
        print(f"{name}: {len(records)} prompts ({sources})")
    if differ:
        sys.exit("the prompt files differ from what this machine builds")


if __name__ == "__main__":
    main()
