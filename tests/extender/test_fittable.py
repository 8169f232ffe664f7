"""Answers patched node by node say exactly what answers built afresh say."""

import random

from gpushare.errors import Refusal, Rule
from gpushare.extender.fittable import ANONYMOUS, Answers, NodeFit, _Answer

RULES = ["insufficient-gpu-memory", "placement-mode", "too-many-pods"]


def entry(rng: random.Random, name: str) -> tuple:
    key = f'"{name}"'
    score = rng.randrange(11)
    if rng.random() < 0.5:
        return (key, None, None, None, f'{{"Host":{key},"Score":{score}}}')
    rule = rng.choice(RULES)
    reason = f'{key}:"needs {rng.randrange(9)} GiB"'
    unresolvable = rule == "placement-mode"
    return (
        None,
        rule,
        None if unresolvable else reason,
        reason if unresolvable else None,
        f'{{"Host":{key},"Score":0}}',
    )


def said(answers: Answers, parts: list[str]) -> dict[str, object]:
    return {part: getattr(answers, part)() for part in parts}


def test_patched_answers_match_fresh_ones():
    rng = random.Random(7)
    names = [f"n{i}" for i in range(700)]
    answers = Answers([entry(rng, n) for n in names])
    every = ["passed_json", "failed_json", "unresolvable_json", "rules", "priorities_json"]
    for round_ in range(60):
        # Ask for some parts only, so patches meet parts made and parts not yet made.
        said(answers, rng.sample(every, rng.randrange(len(every) + 1)))
        changes = [(i, entry(rng, names[i])) for i in rng.sample(range(len(names)), 1 + round_ % 4)]
        answers = answers.patched(changes)
        fresh = Answers(list(answers.entries))
        assert said(answers, every) == said(fresh, every)
    assert said(answers, every) == said(Answers(list(answers.entries)), every)


def test_an_answer_already_given_is_not_changed_by_a_patch():
    rng = random.Random(3)
    names = [f"n{i}" for i in range(300)]
    answers = Answers([entry(rng, n) for n in names])
    every = ["passed_json", "failed_json", "unresolvable_json", "rules", "priorities_json"]
    before = said(answers, every)
    answers.patched([(i, entry(rng, names[i])) for i in range(0, 300, 7)])
    assert said(answers, every) == before
    assert said(Answers(list(answers.entries)), every) == before


def test_no_candidates():
    empty = Answers([])
    assert (empty.passed_json(), empty.failed_json(), empty.priorities_json()) == ("[]", "{}", "[]")
    assert empty.rules() == {}


def passing(name: str) -> tuple:
    key = f'"{name}"'
    return (key, None, None, None, f'{{"Host":{key},"Score":5}}')


def test_a_rule_a_patch_brings_in_is_counted_once():
    answers = Answers([passing("a"), passing("b")])
    assert answers.rules() == {}
    refused = (None, "insufficient-gpu-memory", '"b":"needs 4 GiB"', None, '{"Host":"b","Score":0}')
    assert answers.patched([(1, refused)]).rules() == {"insufficient-gpu-memory": 1}


def test_an_answer_over_many_blocks_is_one_json_array():
    names = [f"n{i}" for i in range(300)]
    answers = Answers([passing(n) for n in names])
    assert answers.passed_json() == "[" + ",".join(f'"{n}"' for n in names) + "]"


def test_entries_made_for_many_nodes_at_once_are_each_nodes_own_entry():
    """A move renews thousands of entries at once (`_Answer.entries`): each is what
    `entry` makes for the node, for an answer that passes and one that refuses."""
    names = ["n1", "n2", "n%3"]
    passes = _Answer.of(NodeFit(None, None, 7))
    refusal = Refusal(Rule.INSUFFICIENT_MEMORY, f"node {ANONYMOUS} is full")
    refuses = _Answer.of(NodeFit(None, refusal, 0))
    for answer in (passes, refuses):
        assert dict(answer.entries(names)) == {name: answer.entry(name) for name in names}
