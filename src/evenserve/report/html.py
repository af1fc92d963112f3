"""A self-contained HTML report: headings, tables and PNG plots embedded as data URLs.

One file a person can open or mail; no scripts, no external assets.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
td.bad { color: #b00; font-weight: bold; } td.good { color: #070; }
pre { background: #f7f7f7; padding: 0.7em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
"""


@dataclass
class Section:
    heading: str
    text: str = ""
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    #: Cells to mark: (row, column) -> "good" | "bad".
    marks: dict[tuple[int, int], str] = field(default_factory=dict)
    images: list[Path] = field(default_factory=list)
    preformatted: str = ""


def _table(s: Section) -> str:
    if not s.header:
        return ""
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in s.header) + "</tr>"]
    for i, row in enumerate(s.rows):
        cells = []
        for j, c in enumerate(row):
            cls = s.marks.get((i, j))
            attr = f' class="{cls}"' if cls else ""
            cells.append(f"<td{attr}>{html.escape(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def write_html(path: Path, title: str, sections: list[Section]) -> Path:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for s in sections:
        parts.append(f"<h2>{html.escape(s.heading)}</h2>")
        if s.text:
            parts.append(f"<p>{html.escape(s.text)}</p>")
        parts.append(_table(s))
        if s.preformatted:
            parts.append(f"<pre>{html.escape(s.preformatted)}</pre>")
        for img in s.images:
            if img.is_file():
                parts.append(_image(img))
    parts.append("</body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n")
    return path
