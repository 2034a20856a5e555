"""Generated kernels shown to people: as text, in a terminal with syntax colours, in Jupyter as HTML."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KernelListing:
    """(node names, source) per kernel, in launch order."""

    kernels: list[tuple[list[str], str]]

    def __len__(self) -> int:
        return len(self.kernels)

    def __str__(self) -> str:
        return "\n\n".join(f"# ---- kernel for {', '.join(names)}\n{source}" for names, source in self.kernels)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.syntax import Syntax
        from rich.text import Text

        parts: list[Any] = []
        for names, source in self.kernels:
            parts += [Text(f"kernel for {', '.join(names)}", style="bold"), Syntax(source, "python")]
        return Group(*parts)

    def _repr_html_(self) -> str:
        return "".join(f"<details><summary>{html.escape(', '.join(names))}</summary><pre>{html.escape(source)}</pre>"
                       "</details>" for names, source in self.kernels)
