"""``gpuclaim policy show|set|unset``: the lab's limits, queue and idle policy, kept in the
store so that every person's CLI, keeper and wrapper applies the same (``core/policy.py``)."""

from __future__ import annotations

import typer

from gpuclaim.cli.common import out, print_json, state
from gpuclaim.core.errors import ConfigError, UsageError

policy_app = typer.Typer(
    help="The lab's policy (limits, queue, idle), kept in the store for everyone.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@policy_app.command("show")
def policy_show(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The lab's policy, as the store holds it.

    And the limits it leaves in force for you."""
    from gpuclaim.core.errors import GpuclaimError

    st = state(ctx, looking=True)
    problem = st.store.policy_problem()
    policy = st.store.policy()
    if as_json:
        print_json({"policy": policy, "problem": problem or None})
        return
    if problem:
        out().print(f"warning: {problem}", markup=False)
    if not policy:
        out().print("The lab sets no policy: each config's own limits apply.")
        return
    for table, values in policy.items():
        for key, value in values.items():
            out().print(f"{table}.{key} = {value!r}", markup=False)
    try:
        from gpuclaim.core.policy import with_policy

        mine = with_policy(st.config, policy).limits
        out().print(
            f"in force for {st.user}: max_gpus_per_user = {mine.max_gpus_per_user}, "
            f"max_queued_per_user = {mine.max_queued_per_user}",
            markup=False,
        )
    except GpuclaimError:
        pass


@policy_app.command("set")
def policy_set(
    ctx: typer.Context,
    key: str = typer.Argument(..., help="TABLE.KEY, e.g. defaults.max_gpus_per_user"),
    value: str = typer.Argument(..., help="Its value, as in a config file: 2, 4h, true."),
) -> None:
    """Set one key of the lab's policy.

    Only the account that owns the store's directory may."""
    _change(ctx, key, value)


@policy_app.command("unset")
def policy_unset(
    ctx: typer.Context,
    key: str = typer.Argument(..., help="TABLE.KEY"),
) -> None:
    """Remove one key of the lab's policy.

    Each config's own value applies again."""
    _change(ctx, key, None)


def _change(ctx: typer.Context, key: str, value: str | None) -> None:
    from gpuclaim.core.policy import checked_policy, key_value

    st = state(ctx)
    table, name, parsed = key_value(key, value if value is not None else "0")
    policy = {t: dict(v) for t, v in st.store.policy().items()}
    if value is None:
        policy.get(table, {}).pop(name, None)
        policy = {t: v for t, v in policy.items() if v}
    else:
        policy.setdefault(table, {})[name] = parsed
    try:
        checked = checked_policy(policy)
    except ConfigError as exc:
        raise UsageError(exc.message) from None
    st.store.set_policy(policy=checked)
    if value is None:
        out().print(f"{table}.{name} is the lab's no more.", markup=False)
    else:
        out().print(f"{table}.{name} = {parsed!r} for everyone.", markup=False)
