"""[workenv] The job's environment on the node, through the CLI on the sshd testbed: the user's
login environment (what ``~/.profile`` puts on PATH), ``--venv``, ``--conda``, and the
directory ``run`` was typed in as the default workdir."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Prints what a job sees: its argv exactly, where it runs, and the variables that matter.
SHOW = (
    "#!/usr/bin/env python3\n"
    "import json, os, sys\n"
    "keys = ('GC_PROFILE', 'CUDA_VISIBLE_DEVICES', 'VIRTUAL_ENV', 'CONDA_DEFAULT_ENV', 'PWD')\n"
    "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'python': sys.prefix,\n"
    "                  'env': {k: os.environ.get(k) for k in keys}}))\n"
)


def _job(c, name):
    return next(r for r in c.json("jobs", "--all") if r["name"] == name)


def _wait(c, name, states=("succeeded", "failed"), timeout=40.0):
    deadline = time.monotonic() + timeout
    while True:
        job = _job(c, name)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"{name} stuck in {job['state']}"
        time.sleep(0.3)


def _shown(c, name):
    job = _wait(c, name)
    assert job["state"] == "succeeded", (job, c.ok("logs", name, "-n", "0"))
    lines = [line for line in c.ok("logs", name, "-n", "0").splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def c(testbed, make_remote):
    return make_remote(testbed, kill_grace="2s", heartbeat="1s")


def _home(c, node="node01") -> Path:
    return c.testbed.node_dir(node) / "home"


def _profile(c, node="node01", extra=""):
    """A profile as labs have them: ~/.local/bin on PATH, a variable, a greeting on stdout,
    and one that would clobber the GPUs the job was given."""
    home = _home(c, node)
    _executable(home / ".local" / "bin" / "gcatool", SHOW)
    (home / ".profile").write_text(
        'echo "Welcome to the lab cluster, $USER"\n'
        'export PATH="$HOME/.local/bin:$PATH"\n'
        "export GC_PROFILE=from-profile\n"
        "export CUDA_VISIBLE_DEVICES=99\n" + extra
    )


def test_a_tool_the_login_profile_puts_on_path_runs_with_its_argv_exact(c):
    _profile(c)
    argv = ["a b", "$HOME", '"quoted"', "it's", "ünïcode ✓", "", "--flag=x y", "*"]
    proc = c.cli("run", "--node", "node01", "--name", "tool", "--json", "--", "gcatool", *argv)
    assert proc.returncode == 0, proc.stderr
    shown = _shown(c, "tool")
    assert shown["argv"] == argv  # no shell re-parsed it
    assert shown["env"]["GC_PROFILE"] == "from-profile"  # the login environment
    job = _job(c, "tool")
    assert shown["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, job["gpus"]))  # ours win
    # the profile's greeting went to the login shell, not into the job's output
    assert "Welcome" not in c.ok("logs", "tool", "-n", "0")


def test_login_shell_false_gives_the_plain_ssh_environment(testbed, make_remote):
    c = make_remote(testbed, extra_toml="\n[node.node01]\nlogin_shell = false\n")
    _profile(c)
    _profile(c, "node02")
    proc = c.cli("run", "--node", "node01", "--name", "plain", "--", "gcatool")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "gpuclaim: error: job plain failed at once on node01 (exit code 127): cannot start "
        "'gcatool' on node01: No such file or directory (not on the PATH there)"
    ]
    # the other nodes keep the default
    c.ok("run", "--node", "node02", "--name", "login", "--", "gcatool")
    assert _shown(c, "login")["env"]["GC_PROFILE"] == "from-profile"


def test_a_profile_that_hangs_or_fails_is_one_line_and_the_gpus_come_back(c):
    (_home(c) / ".profile").write_text("echo broken >&2\nexit 3\n")
    proc = c.cli("run", "--node", "node01", "--name", "badprofile", "--", "true")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "gpuclaim: error: job badprofile could not start: the login shell (bash -l) failed "
        "on node01: broken"
    ]
    assert all(r["state"] == "free" for r in c.status() if r["node"] == "node01")


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def test_run_venv_uses_that_venvs_python(c, tmp_path):
    venv = _venv(_home(c) / "venvs" / "exp")
    probe = "import json, os, sys; print(json.dumps([sys.prefix, os.environ['VIRTUAL_ENV']]))"
    c.ok(
        "run",
        "--node",
        "node01",
        "--name",
        "v",
        "--venv",
        "~/venvs/exp",
        "--",
        "python",
        "-c",
        probe,
    )
    _wait(c, "v")
    assert json.loads(c.ok("logs", "v", "-n", "0").strip().splitlines()[-1]) == [
        str(venv),
        str(venv),
    ]
    job = _job(c, "v")
    assert job["venv"] == "~/venvs/exp" and job["conda"] is None
    # relative: the project's own .venv, next to where run was typed
    project = tmp_path / "proj"
    _venv(project / ".venv")
    proc = c.cli(
        "run",
        "--node",
        "node01",
        "--name",
        "rel",
        "--venv",
        ".venv",
        "--",
        "python",
        "-c",
        probe,
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr
    _wait(c, "rel")
    assert json.loads(c.ok("logs", "rel", "-n", "0").strip().splitlines()[-1])[0] == str(
        project / ".venv"
    )


def test_a_venv_in_the_config_is_every_jobs_default(testbed, make_remote):
    c = make_remote(testbed, extra_toml='\n[run]\nvenv = "~/venvs/team"\n')
    venv = _venv(_home(c, "node03") / "venvs" / "team")
    c.ok(
        "run",
        "--node",
        "node03",
        "--name",
        "d",
        "--",
        "python",
        "-c",
        "import sys; print(sys.prefix)",
    )
    _wait(c, "d")
    assert c.ok("logs", "d", "-n", "0").strip().splitlines()[-1] == str(venv)
    assert _job(c, "d")["venv"] == "~/venvs/team"


def test_a_missing_venv_is_one_line_and_nothing_stays_claimed(c):
    proc = c.cli("run", "--node", "node02", "--name", "nov", "--venv", "~/no/such", "--", "python")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        "gpuclaim: error: job nov could not start: venv ~/no/such does not exist on node02"
    ]
    not_a_venv = _home(c, "node02") / "plain-dir"
    not_a_venv.mkdir()
    proc = c.cli("run", "--node", "node02", "--name", "nov2", "--venv", str(not_a_venv), "--", "x")
    assert proc.stderr.splitlines() == [
        f"gpuclaim: error: job nov2 could not start: venv {not_a_venv} has no bin/python on node02"
    ]
    assert all(r["state"] == "free" for r in c.status() if r["node"] == "node02")


# A conda as the node has it: `conda shell.posix hook` prints the function that activates.
FAKE_CONDA = """#!/bin/sh
if [ "$1" = shell.posix ] && [ "$2" = hook ]; then
cat <<'HOOK'
conda() {
  if [ "$1" = activate ]; then
    p="$HOME/miniconda3/envs/$2"
    if [ ! -d "$p" ]; then
      echo "EnvironmentNameNotFound: Could not find conda environment: $2" >&2
      return 1
    fi
    export CONDA_PREFIX="$p" CONDA_DEFAULT_ENV="$2" PATH="$p/bin:$PATH"
  fi
}
HOOK
exit 0
fi
echo "fake conda: $*" >&2
exit 2
"""


def test_run_conda_activates_the_env_through_the_nodes_conda(c):
    home = _home(c)
    _executable(home / "miniconda3" / "condabin" / "conda", FAKE_CONDA)
    _executable(home / "miniconda3" / "envs" / "ml" / "bin" / "mltool", SHOW)
    # where conda's installer puts it: the profile adds condabin
    (home / ".profile").write_text('export PATH="$HOME/miniconda3/condabin:$PATH"\n')
    c.ok("run", "--node", "node01", "--name", "cj", "--conda", "ml", "--", "mltool", "x y")
    shown = _shown(c, "cj")
    assert shown["argv"] == ["x y"] and shown["env"]["CONDA_DEFAULT_ENV"] == "ml"
    assert _job(c, "cj")["conda"] == "ml"
    proc = c.cli("run", "--node", "node01", "--name", "cnope", "--conda", "nope", "--", "mltool")
    assert proc.stderr.splitlines() == [
        "gpuclaim: error: job cnope could not start: conda env 'nope' cannot be activated with "
        "conda (does it exist?) on node01"
    ]
    proc = c.cli("run", "--node", "node02", "--name", "noconda", "--conda", "ml", "--", "x")
    assert proc.stderr.splitlines() == [
        "gpuclaim: error: job noconda could not start: no conda, mamba or micromamba on the "
        "PATH of a login shell on node02"
    ]
    assert all(r["state"] == "free" for r in c.status())


def test_the_job_runs_where_run_was_typed_when_the_node_has_that_directory(c, tmp_path):
    project = tmp_path / "my project"
    project.mkdir()
    (project / "train.py").write_text("import os; print('train in', os.getcwd())\n")
    proc = c.cli(
        "run",
        "--node",
        "node01",
        "--name",
        "here",
        "--json",
        "--",
        "python3",
        "train.py",
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no note: it runs there
    _wait(c, "here")
    assert c.ok("logs", "here", "-n", "0").strip().splitlines()[-1] == f"train in {project}"
    job = _job(c, "here")
    assert job["workdir"] == str(project) and job["cwd"] == str(project)
    assert job["requested"]["workdir"] is None


def test_a_queued_job_whose_directory_is_gone_runs_in_the_home_and_says_so(c, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    blocker = c.json("claim", "-n", "4", "--node", "node01", "--time", "1h")
    proc = c.cli(
        "run",
        "--node",
        "node01",
        "-n",
        "4",
        "--queue",
        "--name",
        "later",
        "--",
        "python3",
        "-c",
        "import os; print(os.getcwd())",
        cwd=gone,
    )
    assert proc.returncode == 0, proc.stderr
    gone.rmdir()
    c.ok("release", blocker["id"])
    job = _wait(c, "later", timeout=60)
    home = str(_home(c))
    assert job["state"] == "succeeded" and job["workdir"] == home, job
    assert c.ok("logs", "later", "-n", "0").strip().splitlines() == [
        f"gpuclaim: {gone} is not a directory on node01: the job runs in {home}",
        home,
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--venv", "a", "--conda", "b"], "--venv and --conda: a job runs in one of them"),
        (["--venv", " "], "--venv wants a name or a path, not an empty string"),
        (["--conda", ""], "--conda wants a name or a path, not an empty string"),
    ],
)
def test_bad_workenv_flags_are_one_line_and_nothing_runs(c, args, said):
    proc = c.cli("run", *args, "--", "true")
    assert proc.returncode == 2 and proc.stderr.splitlines() == [f"gpuclaim: error: {said}"]
    assert c.json("jobs", "--all") == []


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ('[run]\nvenv = "a"\nconda = "b"\n', "'run' sets both venv and conda"),
        ("[run]\nlogin_shell = 1\n", "'run.login_shell' must be true or false, not 1"),
        ('[run]\nshell = "zsh"\n', "unknown key 'shell' in [run]"),
        ('[node.node01]\nvenv = ""\n', "'node.node01.venv' must be a non-empty string"),
    ],
)
def test_bad_workenv_config_is_one_line(testbed, make_remote, toml, said):
    c = make_remote(testbed, extra_toml="\n" + toml)
    proc = c.cli("status")
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert said in proc.stderr


def test_the_shell_environment_is_read_with_env_0_or_by_python_where_env_lacks_it(tmp_path):
    """The wrapper's read of the shell's environment, on this machine: ``env -0`` (no second
    Python start), and Python's JSON dump where ``env`` refuses -0 (BusyBox). Values with
    newlines and '=' arrive intact either way."""
    from gpuclaim.node.workenv import _shell_environment

    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ODD": "a\nb=c", "EMPTY": ""}
    direct = _shell_environment(dict(base), "n", False, "")
    assert direct["ODD"] == "a\nb=c" and direct["EMPTY"] == "" and "_" not in direct
    no_env0 = tmp_path / "bin"
    no_env0.mkdir()
    fake = no_env0 / "env"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = -0 ] && { echo "env: unrecognized option" >&2; exit 125; }\n'
    )
    fake.chmod(0o755)
    fallback = _shell_environment({**base, "PATH": f"{no_env0}:/usr/bin:/bin"}, "n", False, "")
    assert fallback["ODD"] == "a\nb=c" and fallback["EMPTY"] == ""
    # the same but PATH, and LC_CTYPE, which Python's own locale coercion (PEP 538) adds
    # under the C locale: env -0 reads the shell's environment more exactly
    same = {"PATH", "LC_CTYPE"}
    assert {k: v for k, v in fallback.items() if k not in same} == {
        k: v for k, v in direct.items() if k not in same
    }


def test_the_login_environment_is_kept_until_a_profile_changes(c):
    # Each job would run the login shell; a kept result spares it while the profiles stay
    # as they were, and an edited profile reaches the very next job.
    home = _home(c)
    counter = home / "profile-runs"
    counter.unlink(missing_ok=True)
    _executable(home / ".local" / "bin" / "gcatool", SHOW)
    profile = home / ".profile"
    runs = 'echo run >> "$HOME/profile-runs"\nexport PATH="$HOME/.local/bin:$PATH"\n'
    profile.write_text(runs + "export GC_PROFILE=one\n")
    for name in ("first", "second"):
        c.ok("run", "--node", "node01", "--name", name, "--", "gcatool")
        assert _shown(c, name)["env"]["GC_PROFILE"] == "one"
    assert counter.read_text().split() == ["run"]  # the second job reused the first's
    profile.write_text(runs + "export GC_PROFILE=two-edited\n")
    c.ok("run", "--node", "node01", "--name", "third", "--", "gcatool")
    assert _shown(c, "third")["env"]["GC_PROFILE"] == "two-edited"
    assert counter.read_text().split() == ["run", "run"]
    kept = list((home / ".cache" / "gpuclaim" / "login-env").glob("*.json"))
    assert kept and all(p.stat().st_mode & 0o777 == 0o600 for p in kept)
