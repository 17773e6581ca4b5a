"""Node lists written as ranges (app/hostlists.py, python-hostlist): the config's ``nodes``
and the ``--node`` flags, expanded as pdsh and SLURM do; what is malformed is one line."""

from __future__ import annotations

import pytest

from gpuclaim.app.hostlists import expand_config_nodes, node_names, one_node
from gpuclaim.core.config import parse_config
from gpuclaim.core.errors import ConfigError, UsageError


def test_config_ranges_expand_in_order_beside_plain_names() -> None:
    raw = {"nodes": ["gpu7", "node[01-03]", "dgx[1,4]"], "storage": "/srv/gpuclaim"}
    config = parse_config(expand_config_nodes(raw))
    assert [n.name for n in config.nodes] == [
        "gpu7", "node01", "node02", "node03", "dgx1", "dgx4",
    ]  # fmt: skip


def test_a_node_named_twice_through_a_range_is_still_caught() -> None:
    with pytest.raises(ConfigError, match="'node02' is listed twice"):
        parse_config(expand_config_nodes({"nodes": ["node02", "node[01-02]"]}))


@pytest.mark.parametrize("bad", ["node[01-", "node[b-a]", "gpu-[a,c]", "node]"])
def test_a_malformed_range_names_the_key(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^'nodes': .* is not a host range") as caught:
        expand_config_nodes({"nodes": [bad]})
    assert "\n" not in caught.value.message


def test_node_flags() -> None:
    assert node_names(["node[01-02]", "node02", "gpu7"]) == ["node01", "node02", "gpu7"]
    assert (
        one_node("node[02]") == "node02" and one_node("gpu7") == "gpu7" and one_node(None) is None
    )
    with pytest.raises(UsageError, match="names 2"):
        one_node("node[01-02]")
    with pytest.raises(UsageError, match="not a node name or range"):
        node_names(["node[01-"])
