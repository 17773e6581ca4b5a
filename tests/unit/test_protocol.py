"""The agent's protocol is one list: the op names ``core/protocol.py`` types, the ops it pairs
with a request and a response, and the handlers in the agent's table are the same, each
handler taking its op's request and answering its response; and the rank spec the engine
writes holds exactly the keys ``RankSpec`` declares."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from gpuclaim.core import protocol
from gpuclaim.core.model import JobRank
from gpuclaim.core.protocol import KeeperSpec, Op, OpName, RankSpec
from gpuclaim.engine.launch import keeper_spec, rank_spec
from gpuclaim.node import agent

from .fakes import make_cluster


def _ops() -> dict[str, tuple[Any, Any]]:
    """Each ``Op`` constant of the protocol: its name -> (request type, response type)."""
    hints = typing.get_type_hints(protocol)
    found = {}
    for attr, value in vars(protocol).items():
        if isinstance(value, Op):
            request, response = typing.get_args(hints[attr])
            found[value.name] = (request, response)
    return found


def test_op_names_are_one_list() -> None:
    names = set(typing.get_args(OpName))
    assert len(names) == len(typing.get_args(OpName))
    assert set(agent._OPS) == names
    assert set(_ops()) == names


def test_each_handler_takes_its_request_and_answers_its_response() -> None:
    namespace = {**vars(typing), "protocol": protocol}  # the agent imports it to type-check
    for name, (request, response) in _ops().items():
        hints = typing.get_type_hints(agent._OPS[name], globalns=namespace)
        assert hints == {"request": request, "return": response}, name


def test_the_wire_names_what_the_typed_dicts_say() -> None:
    """A request is what its TypedDict says, ``op`` aside (the channel adds it)."""
    request = protocol.ReadLogRequest(path="/x", offset=3, tail_lines=0, wait_s=0.5)
    assert request == {"path": "/x", "offset": 3, "tail_lines": 0, "wait_s": 0.5}
    assert list(request) == ["path", "offset", "tail_lines", "wait_s"]  # the order sent


def _keys(spec: Any) -> set[str]:
    return set(spec)


def test_rank_spec_holds_exactly_rank_specs_keys(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, {"node0": 2})
    cluster.queue("ann", "one")
    assert cluster.dispatch() == ["one"]
    (sent,) = cluster.nodes.launched()
    assert RankSpec.__optional_keys__ == frozenset()
    assert _keys(sent) == set(RankSpec.__annotations__) == RankSpec.__required_keys__
    assert _keys(sent["workenv"]) == protocol.WorkEnvSpec.__required_keys__
    assert _keys(sent["placed"]) == protocol.PlacedSpec.__required_keys__
    assert sent["gang"] == {}  # one rank: no gang


def test_a_gangs_rank_spec_says_all_of_gang_env(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, {"node0": 1, "node1": 1})
    cluster.queue("ann", "gang", count=1, nodes=2)
    assert cluster.dispatch() == ["gang"]
    specs = cluster.nodes.launched()
    assert [s["rank"] for s in specs] == [0, 1]
    for spec in specs:
        assert _keys(spec) == RankSpec.__required_keys__
        assert _keys(spec["gang"]) == set(protocol.GangEnv.__annotations__)


def test_rank_spec_and_keeper_spec_directly(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, {"node0": 2})
    job = cluster.queue("ann", "direct")
    node = cluster.config.node("node0")
    keeper = keeper_spec(cluster.config, "node0")
    assert _keys(keeper) == set(KeeperSpec.__annotations__) == KeeperSpec.__required_keys__
    rank = JobRank(rank=0, node="node0", gpus=(0,), gpu_uuids=("GPU-x",), claim_id=None)
    spec = rank_spec(cluster.config, cluster.store, job, rank, node, {})
    assert _keys(spec) == RankSpec.__required_keys__
