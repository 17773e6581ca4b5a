"""The config (core/config.py parse_config; app/configfile.py load_config reads the file):
what a good one gives, and that each bad key is one line naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuclaim.app.configfile import load_config
from gpuclaim.core.config import DEFAULT_IGNORED_PROCESSES, WorkEnv, parse_config
from gpuclaim.core.errors import ConfigError

BASE = 'nodes = ["node01", "node02"]\nstorage = "/shared/gpuclaim"\n'


def _load(tmp_path: Path, text: str):  # -> Config
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(path)


def test_a_minimal_config_takes_every_default(tmp_path: Path) -> None:
    config = _load(tmp_path, BASE)
    assert config.path == tmp_path / "config.toml"
    assert [(n.name, n.host, n.transport) for n in config.nodes] == [
        ("node01", "node01", "ssh"),
        ("node02", "node02", "ssh"),
    ]
    assert (config.cluster, config.storage, config.ssh_client) == (
        "gpuclaim",
        "/shared/gpuclaim",
        "auto",
    )
    assert config.limits.default_time_s == 4 * 3600 and config.limits.busy_memory_mib == 256
    assert config.limits.ignore_processes == DEFAULT_IGNORED_PROCESSES
    assert config.idle.release_after_s is None and config.idle.window_s == 1800
    assert not config.storage_default


def test_a_full_config(tmp_path: Path) -> None:
    text = BASE + (
        'cluster = "lab"\nuser = "ann"\nssh_client = "openssh"\n'
        '[defaults]\ntime = "90m"\nmax_time = "1-12:00:00"\nbusy_memory_mib = 1024\n'
        'ignore_processes = ["Xorg"]\nheartbeat = 15\nwarm_agent = false\n'
        "max_reserved_gpu_hours = 12.5\n"
        '[node.node02]\nhost = "10.0.0.2"\nnvidia_smi = "ssh-smi --fake \'a b\'"\n'
        'env = { CUDA_HOME = "/opt/cuda", A = "1" }\nconda = "ml"\n'
        '[idle]\nwindow = "1h"\nthreshold_pct = 10\nrelease_after = "2h"\nrelease_jobs = true\n'
        '[run]\nvenv = "~/venvs/ml"\nlogin_shell = false\nkeep_copies = "2d"\nsync_max = "2GiB"\n'
        '[slack]\nwebhook_url = "https://hooks.slack.com/x"\nmentions = { ann = "U024BE7LH" }\n'
    )
    config = _load(tmp_path, text)
    limits = config.limits
    assert (limits.default_time_s, limits.max_time_s) == (5400, 36 * 3600)
    assert limits.heartbeat_s == 15 * 60  # a bare number is minutes, as SLURM's --time
    assert (limits.busy_memory_mib, limits.ignore_processes) == (1024, ("Xorg",))
    assert limits.warm_agent is False and limits.max_reserved_gpu_hours == 12.5
    node02 = config.node("node02")
    assert (node02.host, node02.transport) == ("10.0.0.2", "ssh")
    assert node02.nvidia_smi == ("ssh-smi", "--fake", "a b")
    assert node02.env == (("A", "1"), ("CUDA_HOME", "/opt/cuda"))
    assert config.idle == type(config.idle)(3600, 10.0, True, 7200, True)
    assert config.keep_copies_s == 2 * 86400 and config.sync_max_bytes == 2 << 30
    assert config.slack.mentions == (("ann", "U024BE7LH"),)
    # the job's flags, then the node, then [run]: a conda env on the node replaces [run]'s venv
    assert config.workenv_of(node02, WorkEnv()) == WorkEnv(False, None, "ml")
    assert config.workenv_of(config.node("node01"), WorkEnv()) == WorkEnv(False, "~/venvs/ml")


def test_a_max_time_under_the_default_time_caps_it() -> None:
    config = parse_config({"nodes": ["n1"], "storage": "/s", "defaults": {"max_time": "1h"}})
    assert config.limits.default_time_s == 3600


def test_localhost_is_local_and_needs_no_storage() -> None:
    config = parse_config({"nodes": ["localhost"]})
    assert config.nodes[0].transport == "local" and config.storage_default
    assert config.storage.endswith("store")


@pytest.mark.parametrize("release", ["", False])
def test_an_empty_release_after_never_releases(release: object) -> None:
    config = parse_config({"nodes": ["n1"], "storage": "/s", "idle": {"release_after": release}})
    assert config.idle.release_after_s is None


@pytest.mark.parametrize(
    "text, needle",
    [
        ('nodse = ["n1"]', "unknown key 'nodse' in the top level: did you mean 'nodes'?"),
        (BASE + "colour = 1", "unknown key 'colour' in the top level"),
        (
            BASE + '[defaults]\ntmie = "1h"',
            "unknown key 'tmie' in [defaults]: did you mean 'time'?",
        ),
        (BASE + "[idle]\nwindwo = 1", "unknown key 'windwo' in [idle]: did you mean 'window'?"),
        (BASE + '[node.node01]\nhots = "x"', "unknown key 'hots' in [node.node01]"),
        (BASE + "[slack]\nevent = []", "unknown key 'event' in [slack]: did you mean 'events'?"),
        (BASE + "[run]\nvnev = 'x'", "unknown key 'vnev' in [run]"),
        ('nodes = []\nstorage = "/s"', "'nodes' must be a non-empty list"),
        ('nodes = ["n1", "n1"]\nstorage = "/s"', "node 'n1' is listed twice in 'nodes'"),
        ('nodes = ["-n1"]\nstorage = "/s"', "node name '-n1' is not a valid host alias"),
        ('nodes = [1]\nstorage = "/s"', "'nodes' entries must be host names"),
        ('node = ["n1"]', "'node' must be a table ([node.NAME]): did you mean 'nodes'?"),
        (BASE + '[node.n9]\nhost = "x"', "[node.n9] describes a node that is not in 'nodes'"),
        (BASE + '[node.node01]\ntransport = "rsh"', "'node.node01.transport' must be"),
        (BASE + "[node.node01]\nnvidia_smi = 5", "'node.node01.nvidia_smi' must be a command"),
        (BASE + "[node.node01]\nenv = { A = 1 }", "'node.node01.env' must be a table of strings"),
        (BASE + '[node.node01]\nvenv = "v"\nconda = "c"', "'node.node01' sets both venv and conda"),
        ('nodes = ["n1"]', "no 'storage' for a cluster with remote nodes (n1)"),
        ('nodes = ["n1"]\nstorage = ""', "'storage' must be a path or ssh://HOST/PATH"),
        (BASE + 'user = "a b"', "'user': "),
        (BASE + 'ssh_client = "putty"', '\'ssh_client\' must be "auto", "openssh" or'),
        (BASE + "agent_command = ''", "'agent_command' must be a command line"),
        (BASE + "[defaults]\nmax_gpus_per_user = -1", "'defaults.max_gpus_per_user' must be a"),
        (BASE + "[defaults]\nbusy_memory_mib = 1.5", "'defaults.busy_memory_mib' must be a"),
        (BASE + "[defaults]\nwarm_agent = 'yes'", "'defaults.warm_agent' must be true or false"),
        (BASE + "[defaults]\nignore_processes = 'Xorg'", "'defaults.ignore_processes' must be"),
        (BASE + "[defaults]\nmax_reserved_gpu_hours = -1", "'defaults.max_reserved_gpu_hours'"),
        (BASE + '[defaults]\ntime = "8h"\nmax_time = "4h"', "'defaults.time' is longer than"),
        (BASE + '[defaults]\ntime = "forever"', "'defaults.time': not a duration: 'forever'"),
        (BASE + "[defaults]\nkill_grace = true", "'defaults.kill_grace' must be a duration like"),
        (BASE + '[defaults]\nmax_time = "400d"', "'defaults.max_time': duration too long"),
        (BASE + "[defaults]\ngpu_read_max_age = inf", "'defaults.gpu_read_max_age': not a"),
        (BASE + "[defaults]\ngpu_read_max_age = nan", "'defaults.gpu_read_max_age': not a"),
        (BASE + "[defaults]\nkill_grace = -1", "'defaults.kill_grace': not a duration: -1"),
        (BASE + "[defaults]\nmax_time = 600000", "'defaults.max_time': duration too long"),
        (BASE + "[idle]\nthreshold_pct = 101", "'idle.threshold_pct' must be a number from 0"),
        (BASE + "[idle]\nwarn = 'no'", "'idle.warn' must be true or false"),
        (BASE + '[idle]\nrelease_after = "0s"', "'idle.release_after': duration must be positive"),
        (BASE + '[run]\nsync_max = "0"', "'sync_max' must be more than zero"),
        (BASE + '[run]\nlogin_shell = "yes"', "'run.login_shell' must be true or false"),
        (BASE + '[slack]\nwebhook_url = "ftp://x"', "'slack.webhook_url' must be an http(s) URL"),
        (BASE + '[slack]\ntimeout = "soon"', "'slack.timeout': not a duration: 'soon'"),
        (BASE + '[run]\nkeep_copies = "0s"', "'run.keep_copies': duration must be positive"),
        (BASE + '[slack]\nmentions = { ann = "<!channel>" }', "'slack.mentions.ann' must be a"),
        (BASE + '[slack]\nevents = "idle"', "'slack.events' must be a list of strings"),
        (BASE + "defaults = 3", "'defaults' must be a table ([defaults])"),
    ],
)
def test_a_bad_key_is_one_line_naming_the_file_and_the_key(
    tmp_path: Path, text: str, needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    shown = str(caught.value)
    assert "\n" not in shown
    assert shown.startswith(f"config {tmp_path / 'config.toml'}: ")
    assert needle in shown


def test_an_unknown_key_without_a_near_one_lists_the_known_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, BASE + "[idle]\nzzzzzz = 1")
    assert (
        caught.value.hint == "known keys: release_after, release_jobs, threshold_pct, warn, window"
    )


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, "nodes = [")
    assert str(caught.value).startswith(f"config {tmp_path / 'config.toml'}: invalid TOML")


def test_a_config_file_that_is_not_there_is_an_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "nope.toml")
    assert caught.value.message == f"config file {tmp_path / 'nope.toml'} does not exist"
    assert caught.value.hint == "run 'gpuclaim init' to write one"
