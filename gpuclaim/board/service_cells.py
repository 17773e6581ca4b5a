"""How the board shows a service (``gpuclaim serve``): its name and port in the JOB column,
its health, uptime, restarts and URL in the note, and a line of its own in the detail bar."""

from __future__ import annotations

from rich.text import Text

from gpuclaim.core.states import ServiceHealth
from gpuclaim.engine.service_view import ServiceRow

HEALTH_STYLES = {
    ServiceHealth.STARTING.value: "cyan",
    ServiceHealth.HEALTHY.value: "green",
    ServiceHealth.UNHEALTHY.value: "yellow",
    ServiceHealth.RESTARTING.value: "yellow",
    ServiceHealth.DOWN.value: "bold red",
}
HEALTH_GLYPHS = {ServiceHealth.HEALTHY.value: "●", ServiceHealth.DOWN.value: "✖"}


def service_job_text(service: ServiceRow) -> Text:
    """``llm :41234``, coloured by its health."""
    return Text(f"{service.name} :{service.port}", style=HEALTH_STYLES.get(service.health, ""))


def service_note(service: ServiceRow, now: float) -> Text:
    """``● healthy · up 3h02m · 1 restart · http://node01:41234/``."""
    style = HEALTH_STYLES.get(service.health, "")
    glyph = HEALTH_GLYPHS.get(service.health, "◌")
    text = Text(f"{glyph} {service.summary(now)}", style=style)
    text.append(f" · {service.url}", style="dim")
    return text


def service_detail(service: ServiceRow, now: float) -> Text:
    """The detail bar's line: where it answers, how it does, how to reach it."""
    text = Text.assemble(
        "service ",
        (service.name, "bold"),
        f" · {service.url} · ",
        (service.summary(now), HEALTH_STYLES.get(service.health, "")),
    )
    text.append(f" · reach it: gpuclaim forward {service.name}", style="dim")
    return text


def service_key(service: ServiceRow, now: float) -> tuple[str, ...]:
    """What a row shows of it: a new health, restart or minute of uptime is a new row."""
    return (service.summary(now), service.url)
