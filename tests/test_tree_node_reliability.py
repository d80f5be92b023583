"""benchmarks/trees/tree_node_reliability.py labels sampled tree nodes with the probability that
verification accepts them; those labels must be what `verify_sampling` does."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch

from draftsmith.core.sampling import SamplingParams
from draftsmith.decoding import verify_sampling
from draftsmith.heads.base import Draft

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "trees" / "tree_node_reliability.py"


def _script():
    spec = importlib.util.spec_from_file_location("tree_node_reliability", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _without(q: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    left = q.clone()
    left[tokens] = 0.0
    return left / left.sum()


def test_sampled_labels_are_verify_samplings_acceptance_frequencies():
    """Three siblings drawn without replacement at the root, one grandchild under the second:
    each node's label matches how often `verify_sampling` puts it on the accepted path, given its
    parent is (20,000 verifications)."""
    q = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    q_child = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1])
    p_root = torch.tensor([0.25, 0.35, 0.2, 0.12, 0.08])
    p_child = torch.tensor([0.05, 0.35, 0.3, 0.2, 0.1])
    draft = Draft(
        tokens=torch.tensor([0, 1, 2, 1]),
        parents=torch.tensor([-1, -1, -1, 1]),
        probs=torch.stack([q, _without(q, [0]), _without(q, [0, 1]), q_child]),
    )
    target_probs = torch.stack([p_root, p_root, p_child, p_root, p_root])
    record = SimpleNamespace(draft=draft, target_logits=target_probs.log())

    labels = _script().sampled_labels(record, SamplingParams(temperature=1.0))

    assert [rank for rank, _ in labels] == [1, 2, 3, 1]
    generator = torch.Generator().manual_seed(0)
    first = torch.zeros(4)
    grandchild_given_parent = []
    for _ in range(20_000):
        path, _ = verify_sampling(target_probs, draft, generator)
        if path:
            first[path[0]] += 1
        if path[:1] == [1]:
            grandchild_given_parent.append(float(path[1:] == [3]))
    frequencies = [
        *(first[:3] / 20_000).tolist(),
        sum(grandchild_given_parent) / len(grandchild_given_parent),
    ]
    for (_, label), frequency in zip(labels, frequencies, strict=True):
        assert abs(label - frequency) < 0.015, (labels, frequencies)
    # The second sibling is reached only when the first is rejected, so its label is not min(1, p/q).
    assert labels[1][1] < min(1.0, float(p_root[1] / _without(q, [0])[1])) - 0.1
