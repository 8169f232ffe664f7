"""The extender's answer engine: its placement policies, the numbering of node states,
the answer tables per request shape, and the evaluation of a node for a pod.

Its policies are its own objects, made from the registry of `PolicyChoice`, so what a
policy learns from the pods filter sees belongs to this extender alone. Nodes whose
views differ only by name share a state number, and a state's answer serves every
node in it (extender.answertable). It reads the cluster from the mirror
(extender.mirror) and, like it, is not thread-safe: the scheduler cache calls it
under its one lock.
"""

from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from itertools import count
from typing import Any

from gpushare.errors import Refusal, Rule
from gpushare.extender.answertable import ANONYMOUS, Answers, AnswerTable, NodeFit, State
from gpushare.extender.mirror import ClusterMirror
from gpushare.extender.pendingpod import PendingPod
from gpushare.extender.policychoice import PolicyChoice
from gpushare.inventory import NodeGpus
from gpushare.memo import BoundedMemo
from gpushare.placement.fit import Placement, PlacementPolicy, evaluate
from gpushare.request import PodRequest
from gpushare.shapecache import ShapeCache
from gpushare.state import NodeState, NodeView

_FIT_TABLES = 64
"""Request shapes whose per-node results are kept (most recently used first)."""
_OBSERVED_LIMIT = 100_000
_STATE_FIELDS = tuple(f.name for f in fields(NodeView) if f.name != "name")
"""What placement reads of a node: its view, but for its name."""
_STATES_LIMIT = 100_000
"""Distinct node states numbered; the oldest numbering goes first (bounds memory): a
state numbered again gets a new number, and its answers are made afresh."""


class AnswerEngine:
    def __init__(self, choice: PolicyChoice, mirror: ClusterMirror) -> None:
        self._choice = choice
        self._mirror = mirror
        self._policies = choice.build()
        self._tables: ShapeCache[AnswerTable] = ShapeCache(AnswerTable, _FIT_TABLES)
        self._state_numbers: BoundedMemo[tuple[Any, ...], int] = BoundedMemo(_STATES_LIMIT)
        """Each distinct node state (its view's fields but the name) by number."""
        self._node_states: dict[str, tuple[NodeView, int]] = {}
        """Each node's view last numbered, and its state's number."""
        self._numbers = count()
        self._observed: BoundedMemo[str, None] = BoundedMemo(_OBSERVED_LIMIT)
        """The UIDs of the pods the policies were taught about, oldest first."""
        self._told: dict[str, NodeGpus] = {}
        """What the policies were last told of each node (`PlacementPolicy.node_seen`):
        a pod bound or gone changes the node but not this, and tells nothing."""

    def observe(self, uid: str, request: PodRequest, pod_policy: str | None) -> None:
        """policy.observe(request), once per pod, for each policy that may place it."""
        if uid in self._observed:
            return
        self._observed.add(uid)
        for name in self._placing(pod_policy):
            self._policies[name].observe(request)

    def answers(self, pod: PendingPod, names: list[str]) -> Answers:
        """The pod's answer on each node. Nodes that did not change since an earlier
        request of the same shape are not evaluated again."""
        return self._table(pod).answers(names, self._evaluation(pod))

    def priorities_json(self, pod: PendingPod, names: list[str]) -> str:
        return self._table(pod).priorities_json(names, self._evaluation(pod))

    def evaluate(self, name: str, request: PodRequest, pod_policy: str | None) -> NodeFit:
        """The pod's answer on the node, evaluated afresh."""
        state = self._mirror.state.nodes.get(name)
        if state is None:
            problem = self._mirror.node_problem(name)
            message = (
                f"node {name}: {problem}; fix the gpushare device plugin there"
                if problem
                else f"node {name} is not known to the gpushare extender (yet)"
            )
            return NodeFit(None, Refusal(Rule.NODE_UNKNOWN, message))
        return _fit(evaluate(state.view(), request, self.policy_on(name, pod_policy)))

    def policy_on(self, node: str, pod_policy: str | None) -> PlacementPolicy:
        """The policy that places the pod on the node (a node with GPUs)."""
        return self._policies[self._choice.placing(pod_policy, self._mirror.node_policy(node))]

    def epochs(self) -> tuple[int, ...]:
        """Each policy's epoch, by name."""
        return tuple(self._policies[name].epoch for name in sorted(self._policies))

    def node_changed(self, name: str) -> None:
        self._tables.changed(name)
        node = self._mirror.state.nodes.get(name)
        if node is None:
            self._node_states.pop(name, None)
            self._forget(name)
        else:
            self._tell(node.inventory)

    def rebuilt(self) -> None:
        """Every node may have changed: no answer is kept; once both listings are in,
        every node's state is numbered."""
        self._tables.clear()
        self._node_states = {}
        nodes = self._mirror.state.nodes
        for name in self._told.keys() - nodes.keys():
            self._forget(name)
        for node in nodes.values():
            self._tell(node.inventory)
        if self._mirror.synced:
            # Once per listing rather than in the first request after it: at 5,000 nodes
            # making every node's view and state number takes ~80 ms, which the first pod
            # would wait for on top of evaluating its shape (bench/extender_bench.py).
            for name, node in nodes.items():
                # pragma: no mutate start, another name numbers the same state: made twice
                self._state_number(name, node.view())
                # pragma: no mutate end

    def clear(self) -> None:
        """Lets go of every answer kept (before a listing replaces the picture)."""
        self._tables.clear()

    # ----- internals

    def _tell(self, inventory: NodeGpus) -> None:
        """Tells the policies of a node, unless they were told of this very inventory."""
        if self._told.get(inventory.node) is inventory:
            return
        self._told[inventory.node] = inventory
        for policy in self._policies.values():
            policy.node_seen(inventory)

    def _forget(self, name: str) -> None:
        """Tells the policies a node they were told of is gone."""
        if self._told.pop(name, None) is not None:
            for policy in self._policies.values():
                policy.node_gone(name)

    def _placing(self, pod_policy: str | None) -> list[str]:
        """The policies that may place a pod: the one it names, else every node's."""
        if pod_policy:
            return [pod_policy]
        return sorted({self._choice.default, *self._mirror.policies_in_use()})

    def _table(self, pod: PendingPod) -> AnswerTable:
        # Only these policies' epochs: another policy learning must not throw away
        # answers it had no part in (a full re-evaluation of every node).
        policies = self._placing(pod.policy)
        epochs = tuple((name, self._policies[name].epoch) for name in policies)
        return self._tables.table((pod.policy, pod.request.shape), epochs)

    def _evaluation(self, pod: PendingPod) -> "_Evaluation":
        return _Evaluation(
            self._mirror.state.nodes,
            self._mirror.node_policy,
            self._policies,
            self._state_number,
            self.evaluate,
            pod,
            self._choice.placing,
        )

    def _state_number(self, name: str, view: NodeView) -> int:
        """The number of the node's state: equal for nodes whose views differ only by
        name. Numbers are never reused, so answers kept under an old one stay right."""
        known = self._node_states.get(name)
        if known is not None and known[0] is view:
            return known[1]
        nameless = tuple(map(view.__getattribute__, _STATE_FIELDS))
        number = self._state_numbers.get(nameless)
        if number is None:
            number = self._state_numbers.put(nameless, next(self._numbers))
        self._node_states[name] = (view, number)
        return number


class _Evaluation:
    """The answers a table has none of, for one pod (answertable.Evaluation)."""

    def __init__(
        self,
        nodes: Mapping[str, NodeState],
        node_policy: Callable[[str], str],
        policies: Mapping[str, PlacementPolicy],
        number: Callable[[str, NodeView], int],
        of_node: Callable[[str, PodRequest, str | None], NodeFit],
        pod: PendingPod,
        placing: Callable[[str | None, str], str],
    ) -> None:
        self._nodes = nodes
        self._node_policy = node_policy
        self._policies = policies
        self._number = number
        self._of_node = of_node
        self._request = pod.request
        self._pod_policy = pod.policy
        self._placing = placing

    def state(self, name: str) -> State | None:
        node = self._nodes.get(name)
        if node is None:
            return None
        policy = self._placing(self._pod_policy, self._node_policy(name))
        if not self._policies[policy].nameless:
            return None
        return (self._number(name, node.view()), policy)

    def of_state(self, state: State, name: str) -> tuple[NodeView, NodeFit]:
        view = replace(self._nodes[name].view(), name=ANONYMOUS)
        return view, self.again(state, view)

    def again(self, state: State, view: NodeView) -> NodeFit:
        return _fit(evaluate(view, self._request, self._policies[state[1]]))

    def of_node(self, name: str) -> NodeFit:
        return self._of_node(name, self._request, self._pod_policy)


def _fit(result: Placement | Refusal) -> NodeFit:
    if isinstance(result, Refusal):
        return NodeFit(None, result)
    return NodeFit(result, None)
