"""The Jinja2 environment of the HTML pages r2m writes — the report (:mod:`r2m.reports.html`) and the
caption gallery (:mod:`r2m.reports.gallery`) — over the template files in ``reports/templates/``:
``base.html`` (head, viewport, the shared ``base.css``) extended by ``report.html`` and ``gallery.html``,
and ``shared.html``'s parts both use. Every value is auto-escaped (data, never markup) and an undefined
name is an error, not an empty string."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).with_name("templates")


@cache
def environment() -> Any:
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                              lstrip_blocks=True)


def render(template: str, **values: Any) -> str:
    """The page ``template`` (a file name in ``reports/templates/``) filled with ``values``."""
    return environment().get_template(template).render(**values)
