"""The standard suite shares no 8-gram (of lower-cased whitespace tokens) with any source the
recipes and the quickstart train or calibrate on: the standard library's non-test modules (always
here), chitchat (when fetched into the draftsmith home) and the recipes' local data files (when
generated here). A source that is not on this machine is skipped with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftsmith.core.home import default_home
from draftsmith.evaluation.suite import (
    SUITE_WORKLOADS,
    load_suite,
    ngrams,
    recipe_sources,
    shared_ngrams,
)

# Read at import, before the test fixtures point DRAFTSMITH_HOME at a temporary folder.
HOME = default_home()
RECIPES = Path(__file__).resolve().parents[1] / "recipes"
SOURCES = list(recipe_sources(home=HOME, recipes=RECIPES))


@pytest.fixture(scope="module")
def prompts() -> dict[str, list | str]:
    return {r["id"]: r["prompt"] for r in load_suite("standard")}


def test_the_suite_has_six_workloads_of_at_least_12_prompts_each():
    records = load_suite("standard")
    counts = {w: sum(r["workload"] == w for r in records) for w in SUITE_WORKLOADS}
    assert set(counts) == {r["workload"] for r in records}
    assert min(counts.values()) >= 12
    assert len({r["id"] for r in records}) == len(records)
    assert all(r["licence"] and r["source"] for r in records)


@pytest.mark.parametrize("name", [name for name, _, _ in SOURCES])
def test_no_suite_prompt_shares_an_8gram_with_a_recipe_source(prompts, name):
    texts, why = next((texts, why) for n, texts, why in SOURCES if n == name)
    if texts is None:
        pytest.skip(f"{name}: {why}")
    assert shared_ngrams(prompts, texts) == {}


def test_the_check_finds_a_shared_8gram():
    source = "a b c d e f g h i j"
    found = shared_ngrams({"hit": "x c d e f g h i j y", "miss": "c d e f g h i x"}, [source])
    assert found == {"hit": ("c", "d", "e", "f", "g", "h", "i", "j")}
    assert ngrams("A b C d e f g h") == {("a", "b", "c", "d", "e", "f", "g", "h")}
