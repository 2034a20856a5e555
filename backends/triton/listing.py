"""Generated kernels shown to people: as text, in a terminal with syntax colours, in Jupyter as HTML."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ListedKernel:
    """One generated kernel: the nodes it runs, its template family, the launch configuration
    it runs with (the template's defaults, then the anchor node's `launch`) and its source."""

    nodes: list[str]
    template: str
    launch: dict[str, Any]
    source: str

    @property
    def title(self) -> str:
        settings = " ".join(f"{key}={value}" for key, value in self.launch.items())
        return f"kernel for {', '.join(self.nodes)} [{self.template}: {settings}]"


@dataclass(frozen=True)
class KernelListing:
    """The generated kernels of a graph, in launch order."""

    kernels: list[ListedKernel]

    def __len__(self) -> int:
        return len(self.kernels)

    def __str__(self) -> str:
        return "\n\n".join(f"# ---- {k.title}\n{k.source}" for k in self.kernels)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.syntax import Syntax
        from rich.text import Text

        parts: list[Any] = []
        for k in self.kernels:
            parts += [Text(k.title, style="bold"), Syntax(k.source, "python")]
        return Group(*parts)

    def _repr_html_(self) -> str:
        return "".join(f"<details><summary>{html.escape(k.title)}</summary><pre>{html.escape(k.source)}</pre>"
                       "</details>" for k in self.kernels)
