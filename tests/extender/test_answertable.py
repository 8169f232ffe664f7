"""Answers patched node by node say exactly what answers built afresh say, and their
priorities are each node's score against the best candidate's."""

import json
import random
from itertools import pairwise

from gpushare.errors import Refusal, Rule
from gpushare.extender.answertable import (
    _RANKED_BESTS,
    ANONYMOUS,
    Answers,
    NodeFit,
    _Answer,
    _ScoreBook,
)
from gpushare.placement.fit import Assignment, Placement, relative_score

RULES = [Rule.INSUFFICIENT_MEMORY, Rule.NODE_NOT_SHARED, Rule.PODS_PER_GPU]
EVERY = [
    "passed_json",
    "failed_json",
    "unresolvable_json",
    "rules",
    "best",
    "priorities_json",
    "passed_priorities_json",
]


def fits(score: float) -> NodeFit:
    return NodeFit(Placement(Assignment(((0,),), ((0, 4, 0),)), score), None)


def passing(name: str, score: float = 50.0) -> tuple:
    """A node evaluated alone: its template names its score by the score itself."""
    return _Answer.of(fits(score)).entry(name)


def refused(name: str, rule: Rule = Rule.INSUFFICIENT_MEMORY, reason: str = "is full") -> tuple:
    return _Answer.of(NodeFit(None, Refusal(rule, f"node {ANONYMOUS} {reason}"))).entry(name)


def entry(rng: random.Random, name: str) -> tuple[tuple, float | None]:
    """A node's entry and its score: half the nodes pass, with a score of 40..60 in half
    points (ties, and scores a point or less apart); the others are refused."""
    if rng.random() < 0.5:
        score = rng.randrange(80, 121) / 2
        return passing(name, score), score
    return refused(name, rng.choice(RULES), f"needs {rng.randrange(9)} GiB"), None


def said(answers: Answers, parts: list[str]) -> dict[str, object]:
    return {part: getattr(answers, part)() for part in parts}


def relative(names: list[str], scores: list[float | None]) -> list[dict]:
    """The HostPriorityList of these nodes, from relative_score."""
    best = max((s for s in scores if s is not None), default=None)
    return [
        {"Host": name, "Score": 0 if score is None else relative_score(best, score)}
        for name, score in zip(names, scores, strict=True)
    ]


def test_priorities_are_relative_to_the_best_candidate():
    names = ["a", "b", "c", "d", "e", "f"]
    scores = [50.0, 49.5, 41.0, 40.0, None, 50.0]
    made = [refused(n) if s is None else passing(n, s) for n, s in zip(names, scores, strict=True)]
    answers = Answers(made)
    assert answers.best() == 50.0
    passed = {"a": 10, "b": 9, "c": 1, "d": 0, "f": 10}
    assert json.loads(answers.passed_priorities_json()) == [
        {"Host": name, "Score": score} for name, score in passed.items()
    ]
    assert json.loads(answers.priorities_json()) == relative(names, scores)
    assert relative(names, scores)[4] == {"Host": "e", "Score": 0}


def test_patched_answers_match_fresh_ones_as_the_best_moves_and_comes_back():
    rng = random.Random(7)
    names = [f"n{i}" for i in range(300)]
    made = [entry(rng, n) for n in names]
    answers = Answers([e for e, _ in made])
    scores = [s for _, s in made]
    bests = [answers.best()]
    for round_ in range(150):
        # Ask for some parts only, so patches meet parts made and parts not yet made.
        said(answers, rng.sample(EVERY, rng.randrange(len(EVERY) + 1)))
        positions = set(rng.sample(range(len(names)), 1 + round_ % 4))
        if round_ % 3 == 0:  # the best nodes take pods: the best moves down
            positions |= {i for i, s in enumerate(scores) if s == answers.best()}
        changes = []
        for i in positions:
            new, scores[i] = entry(rng, names[i])
            changes.append((i, new))
        answers = answers.patched(changes, answers.book)
        fresh = Answers(list(answers.entries))
        assert said(answers, EVERY) == said(fresh, EVERY)
        assert json.loads(answers.priorities_json()) == relative(names, scores)
        bests.append(answers.best())
    # The best moved often, and came back to bests of a few pods before (whose kept
    # priority lists were patched meanwhile).
    assert sum(a != b for a, b in pairwise(bests)) > 30
    assert sum(b in bests[max(0, i - 4) : i - 1] for i, b in enumerate(bests)) > 10


def test_a_new_book_rescores_the_nodes_of_each_state():
    """A learned workload that moves changes the scores in the book, not the entries:
    the answers read from the new book are those a fresh evaluation gives."""
    book = _ScoreBook()
    book["1/p"], book["2/p"] = 50.0, 48.0
    one, two = _Answer.of(fits(50.0), (1, "p")), _Answer.of(fits(48.0), (2, "p"))
    names = [f"n{i}" for i in range(200)]
    answers = Answers([(one, two)[i % 2].entry(n) for i, n in enumerate(names)], book)
    assert json.loads(answers.passed_priorities_json())[:2] == relative(names[:2], [50.0, 48.0])
    kept = answers.passed_names()
    moved = _ScoreBook()
    moved["1/p"], moved["2/p"] = 50.0, 52.5
    rescored = answers.patched([], moved)
    assert rescored.best() == 52.5
    assert json.loads(rescored.passed_priorities_json()) == relative(names, [50.0, 52.5] * 100)
    assert json.loads(rescored.priorities_json()) == relative(names, [50.0, 52.5] * 100)
    assert rescored.passed_names() is kept  # prioritize's short way stays
    # The answers already given are as they were.
    assert json.loads(answers.priorities_json()) == relative(names, [50.0, 48.0] * 100)


def test_a_book_keeps_its_scores_against_the_last_few_bests():
    book = _ScoreBook()
    book["1/p"] = 40.0
    first = book.ranks(50.0)
    assert first["1/p"] == str(relative_score(50.0, 40.0))
    assert book.ranks(50.0) is first  # made once
    for best in range(60, 60 + _RANKED_BESTS - 1):
        book.ranks(float(best))
    assert book.ranks(50.0) is first  # among the last few bests still
    book.ranks(99.0)
    assert book.ranks(50.0) is not first  # the oldest best went


def test_an_answer_already_given_is_not_changed_by_a_patch():
    rng = random.Random(3)
    names = [f"n{i}" for i in range(300)]
    answers = Answers([entry(rng, n)[0] for n in names])
    before = said(answers, EVERY)
    answers.patched([(i, entry(rng, names[i])[0]) for i in range(0, 300, 7)], answers.book)
    assert said(answers, EVERY) == before
    assert said(Answers(list(answers.entries)), EVERY) == before


def test_no_candidates():
    empty = Answers([])
    assert (empty.passed_json(), empty.failed_json(), empty.priorities_json()) == ("[]", "{}", "[]")
    assert empty.passed_priorities_json() == "[]"
    assert empty.rules() == {} and empty.best() is None


def test_fits_nowhere_scores_every_candidate_zero():
    answers = Answers([refused("a"), refused("b", Rule.NODE_NOT_SHARED)])
    assert answers.best() is None and answers.passed_priorities_json() == "[]"
    assert json.loads(answers.priorities_json()) == relative(["a", "b"], [None, None])


def test_a_node_named_with_a_percent_sign_keeps_it_in_its_priority():
    answers = Answers([passing("a%1", 40.0), passing("b%%", 39.0), refused("c%s")])
    assert json.loads(answers.priorities_json()) == relative(["a%1", "b%%", "c%s"], [40, 39, None])


def test_a_rule_a_patch_brings_in_is_counted_once():
    answers = Answers([passing("a"), passing("b")])
    assert answers.rules() == {}
    patched = answers.patched([(1, refused("b"))], answers.book)
    assert patched.rules() == {"insufficient-gpu-memory": 1}


def test_an_answer_over_many_blocks_is_one_json_array():
    names = [f"n{i}" for i in range(300)]
    answers = Answers([passing(n) for n in names])
    assert answers.passed_json() == "[" + ",".join(f'"{n}"' for n in names) + "]"


def test_entries_made_for_many_nodes_at_once_are_each_nodes_own_entry():
    """A move renews thousands of entries at once (`_Answer.entries`): each is what
    `entry` makes for the node, for an answer that passes and one that refuses."""
    names = ["n1", "n2", "n%3"]
    passes = _Answer.of(fits(47.5), (3, "p"))
    refusal = Refusal(Rule.INSUFFICIENT_MEMORY, f"node {ANONYMOUS} is full")
    refuses = _Answer.of(NodeFit(None, refusal), (4, "p"))
    for answer in (passes, refuses):
        assert dict(answer.entries(names)) == {name: answer.entry(name) for name in names}
