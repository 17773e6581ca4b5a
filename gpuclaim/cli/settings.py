"""``gpuclaim notify test`` and ``gpuclaim config show``."""

from __future__ import annotations

import typer

from gpuclaim.cli.common import out, print_json, state
from gpuclaim.core.errors import ExitCode, GpuclaimError

notify_app = typer.Typer(help="Slack notifications.", no_args_is_help=True, rich_markup_mode=None)
config_app = typer.Typer(
    help="The configuration in use.", no_args_is_help=True, rich_markup_mode=None
)


@notify_app.command("test")
def notify_test(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the webhook's answer as JSON."),
) -> None:
    """Send one test message and report exactly what the webhook answered."""
    from gpuclaim.engine.notify import post

    st = state(ctx)
    slack = st.config.slack
    if not slack.webhook_url:
        raise GpuclaimError("no [slack] webhook_url in the config", hint="add one, then retry")
    payload = {
        "text": f"gpuclaim test message from {st.user} ({st.config.cluster})",
        "blocks": [
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": f":wave: gpuclaim test from *{st.user}* on `{st.config.cluster}`",
                },
            }
        ],
    }
    result = post(slack.webhook_url, payload, slack.timeout_s)
    if as_json:
        print_json(
            {
                "delivered": result.ok,
                "status": result.status,
                "body": result.body,
                "permanent": result.permanent,
                "retry_after": result.retry_after,
            }
        )
    else:
        out().print(f"Webhook answered {result.describe()}")
        if not result.ok:
            hint = "permanent error: fix the webhook" if result.permanent else "try again later"
            out().print(f"Not delivered ({hint}).")
    if not result.ok:
        raise typer.Exit(ExitCode.ERROR)


@config_app.command("show")
def config_show(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the effective config, secrets redacted."""
    from gpuclaim.core.config import redacted

    st = state(ctx)
    cfg = st.config
    shown = {
        "path": str(cfg.path) if cfg.path else None,
        "user": st.user,
        **redacted(
            cfg.raw
            or {
                "cluster": cfg.cluster,
                "storage": cfg.storage,
                "nodes": [n.name for n in cfg.nodes],
            }
        ),
    }
    if as_json:
        print_json(shown)
        return
    for key, value in shown.items():
        out().print(f"{key} = {value!r}")
